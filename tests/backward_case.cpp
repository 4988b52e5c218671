#include "backward_case.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace flash3::test {
namespace {

using Bits = uint16_t;
constexpr Bits kPoisonBits = 0xFFFF;  // a NaN in both formats
constexpr int kPoisonByte = 0xFF;

std::vector<Bits> scatter(const ForwardCase& c, size_t size, const View& view,
                          const std::vector<float>& values) {
  std::vector<Bits> staging(size, kPoisonBits);
  for_each_element(view, [&](size_t logical, size_t index) {
    staging[index] = ref::float_to_half(half_type(c.dtype), values[logical]);
  });
  return staging;
}

}  // namespace

std::string BackwardCase::name() const {
  return forward.name() + (deterministic ? "_deterministic" : "");
}

std::vector<float> random_dout(const BackwardCase& c) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.name() + "_dout"));
  std::normal_distribution<float> normal;
  std::vector<float> x(c.forward.shape.out_size());
  for (float& value : x) {
    value = ref::round_to(half_type(c.forward.dtype), normal(rng));
  }
  return x;
}

namespace {

// 0 where the call is refused (its own error then tells why).
size_t workspace_size(const DeviceProblem& problem, const BackwardOptions& options) {
  size_t bytes = 0;
  const Status s =
      flash3::backward_workspace_size(problem.q(), problem.k(), problem.v(), options, &bytes);
  return s.ok() ? bytes : 0;
}

}  // namespace

BackwardProblem::BackwardProblem(const BackwardCase& c, const Inputs& inputs,
                                 const std::vector<float>& dout)
    : case_(c),
      place_(place(c.forward)),
      forward_(c.forward, inputs),
      dout_(place_.out_size * sizeof(Bits)),
      grads_(place_.inputs_size * sizeof(Bits)),
      workspace_bytes_(workspace_size(forward_, options())),
      workspace_(workspace_bytes_) {
  if (workspace_bytes_ > 0) {
    check_cuda(cudaMemset(workspace_.get(), kPoisonByte, workspace_bytes_),
               "poison the workspace");
  }
  const std::vector<Bits> staging = scatter(c.forward, place_.out_size, place_.out, dout);
  check_cuda(cudaMemcpy(dout_.get(), staging.data(), staging.size() * sizeof(Bits),
                        cudaMemcpyHostToDevice),
             "upload dout");
  check_cuda(cudaMemset(grads_.get(), kPoisonByte, place_.inputs_size * sizeof(Bits)),
             "poison dq, dk, dv");
  check_cuda(cudaDeviceSynchronize(), "set up the problem");
}

BackwardOptions BackwardProblem::options() const {
  BackwardOptions options;
  options.causal = case_.forward.causal;
  options.softmax_scale = case_.forward.softmax_scale;
  options.deterministic = case_.deterministic;
  options.window_left = case_.forward.window_left;
  options.window_right = case_.forward.window_right;
  options.attention_chunk = case_.forward.attention_chunk;
  options.softcap = case_.forward.softcap;
  return options;
}

Status BackwardProblem::run(cudaStream_t stream) const {
  const DType dtype = case_.forward.dtype;
  BackwardOptions options = this->options();
  if (workspace_bytes_ > 0) {
    options.workspace = workspace_.get();
    options.workspace_bytes = workspace_bytes_;
  }
  return flash3::backward(view_tensor(dout_.get(), dtype, place_.out), forward_.q(),
                          forward_.k(), forward_.v(), forward_.out(), forward_.lse(),
                          view_tensor(grads_.get(), dtype, place_.q),
                          view_tensor(grads_.get(), dtype, place_.k),
                          view_tensor(grads_.get(), dtype, place_.v), options, stream);
}

Gradients BackwardProblem::download() const {
  std::vector<Bits> bits(place_.inputs_size);
  check_cuda(cudaMemcpy(bits.data(), grads_.get(), bits.size() * sizeof(Bits),
                        cudaMemcpyDeviceToHost),
             "download dq, dk, dv");
  const ref::HalfType type = half_type(case_.forward.dtype);
  Gradients g;
  std::vector<bool> in_view(bits.size());
  const auto gather = [&](const View& view, std::vector<float>& out) {
    out.resize(view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3]);
    for_each_element(view, [&](size_t logical, size_t index) {
      in_view[index] = true;
      g.unwritten += bits[index] == kPoisonBits;
      out[logical] = ref::half_to_float(type, bits[index]);
    });
  };
  gather(place_.q, g.dq);
  gather(place_.k, g.dk);
  gather(place_.v, g.dv);
  for (size_t i = 0; i < bits.size(); ++i) {
    g.clobbered += !in_view[i] && bits[i] != kPoisonBits;
  }
  return g;
}

void expect_gradients_match_reference(const BackwardCase& c) {
  const Inputs in = random_inputs(c.forward);
  const std::vector<float> dout = random_dout(c);
  BackwardProblem problem(c, in, dout);
  Status s = problem.forward().forward(nullptr);
  ASSERT_TRUE(s.ok() || not_built(s)) << s.message;
  if (not_built(s)) {
    GTEST_SKIP() << s.message;
  }
  s = problem.run(nullptr);
  if (not_built(s)) {
    GTEST_SKIP() << s.message;
  }
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "the backward kernels");
  const Gradients got = problem.download();
  EXPECT_EQ(got.unwritten, 0u) << "dq, dk, dv elements the backward did not write";
  EXPECT_EQ(got.clobbered, 0u) << "elements the backward wrote outside dq, dk, dv";

  const ForwardCase& f = c.forward;
  ref::Variant variant;
  variant.window_left = f.window_left;
  variant.window_right = f.window_right;
  variant.attention_chunk = f.attention_chunk;
  variant.softcap = f.softcap;
  const ref::Gradients want = ref::attention_backward(f.shape, in.q, in.k, in.v, dout,
                                                      f.resolved_scale(), f.causal, variant);
  const ref::PlainGradients plain =
      ref::attention_backward_plain(half_type(f.dtype), f.shape, in.q, in.k, in.v, dout,
                                    f.resolved_scale(), f.causal, variant);
  const ref::Verdict dq = ref::check_gradient("dq", got.dq, plain.dq, want.dq);
  const ref::Verdict dk = ref::check_gradient("dk", got.dk, plain.dk, want.dk);
  const ref::Verdict dv = ref::check_gradient("dv", got.dv, plain.dv, want.dv);
  EXPECT_TRUE(dq.ok) << dq.message;
  EXPECT_TRUE(dk.ok) << dk.message;
  EXPECT_TRUE(dv.ok) << dv.message;
  std::cout << "[ accuracy ] " << c.name() << ": " << dq.message << "; " << dk.message << "; "
            << dv.message << "\n";
}

}  // namespace flash3::test
