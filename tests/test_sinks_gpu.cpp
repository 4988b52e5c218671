// Learnable attention sinks (ForwardOptions::sinks) against the float64
// reference (ref::Variant::sinks) under the tolerance rule: forward out and
// lse, and the backward's dq, dk, dv through the sinks' lse and dsinks
// (BackwardOptions::dsinks); every head dim, causal (rows that see no key)
// and not, GQA, the split decode path.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "hopper_test.hpp"
#include "reference/attention_ref.hpp"
#include "src/sm90/bwd/workspace.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

struct SinksCase {
  DType dtype;
  ref::Shape shape;  // contiguous tensors
  bool causal;
};

void expect_sinks_match_reference(const SinksCase& c) {
  const ref::HalfType type = half_type(c.dtype);
  const ref::Shape& s = c.shape;
  std::mt19937_64 rng(77 + s.headdim + 3 * s.seqlen_q + 5 * c.causal);
  const std::vector<float> q = random_halves(type, s.q_size(), rng),
                           k = random_halves(type, s.kv_size(), rng),
                           v = random_halves(type, s.kv_size(), rng),
                           dout = random_halves(type, s.q_size(), rng);
  ref::Variant variant;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int h = 0; h < s.heads_q; ++h) {
    variant.sinks.push_back(normal(rng));
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.headdim));
  const ref::Reference want = ref::attention_forward(s, q, k, v, scale, c.causal, variant);
  const std::vector<float> plain =
      ref::attention_forward_plain(type, s, q, k, v, static_cast<float>(scale), c.causal, variant);

  DeviceBuffer d_q(s.q_size() * 2), d_k(s.kv_size() * 2), d_v(s.kv_size() * 2),
      d_out(s.q_size() * 2), d_dout(s.q_size() * 2), d_lse(s.lse_size() * 4),
      d_sinks(variant.sinks.size() * 4), d_dq(s.q_size() * 2), d_dk(s.kv_size() * 2),
      d_dv(s.kv_size() * 2), d_dsinks(variant.sinks.size() * 4);
  upload_halves(d_q.get(), type, q, "q");
  upload_halves(d_k.get(), type, k, "k");
  upload_halves(d_v.get(), type, v, "v");
  upload_halves(d_dout.get(), type, dout, "dout");
  check_cuda(cudaMemcpy(d_sinks.get(), variant.sinks.data(), variant.sinks.size() * 4,
                        cudaMemcpyHostToDevice), "sinks");
  check_cuda(cudaMemset(d_out.get(), 0xFF, s.q_size() * 2), "poison out");
  check_cuda(cudaMemset(d_lse.get(), 0xFF, s.lse_size() * 4), "poison lse");
  const auto q_tensor = [&](void* p) {
    return Tensor::contiguous(p, c.dtype, s.batch, s.seqlen_q, s.heads_q, s.headdim);
  };
  const auto k_tensor = [&](void* p) {
    return Tensor::contiguous(p, c.dtype, s.batch, s.seqlen_k, s.heads_k, s.headdim);
  };
  ForwardOptions options;
  options.causal = c.causal;
  options.sinks = static_cast<const float*>(d_sinks.get());
  Status st = flash3::forward(q_tensor(d_q.get()), k_tensor(d_k.get()), k_tensor(d_v.get()),
                              q_tensor(d_out.get()), static_cast<float*>(d_lse.get()), options);
  if (not_built(st)) {
    GTEST_SKIP() << st.message;
  }
  ASSERT_TRUE(st.ok()) << st.message;
  check_cuda(cudaDeviceSynchronize(), "forward");
  const std::vector<float> out = download_halves(d_out.get(), type, s.q_size(), "out");
  std::vector<float> lse(s.lse_size());
  check_cuda(cudaMemcpy(lse.data(), d_lse.get(), lse.size() * 4, cudaMemcpyDeviceToHost), "lse");
  const ref::Verdict out_verdict = ref::check_output(out, plain, want.out);
  EXPECT_TRUE(out_verdict.ok) << out_verdict.message;
  const ref::Verdict lse_verdict = ref::check_lse(lse, want.lse);
  EXPECT_TRUE(lse_verdict.ok) << lse_verdict.message;

  // The backward from this forward's out and lse (which hold the sinks).
  for (const DeviceBuffer* g : {&d_dq, &d_dk, &d_dv}) {
    check_cuda(cudaMemset(g->get(), 0xFF, g == &d_dq ? s.q_size() * 2 : s.kv_size() * 2),
               "poison the gradients");
  }
  check_cuda(cudaMemset(d_dsinks.get(), 0xFF, variant.sinks.size() * 4), "poison dsinks");
  BackwardOptions bwd;
  bwd.causal = c.causal;
  bwd.sinks = static_cast<const float*>(d_sinks.get());
  bwd.dsinks = static_cast<float*>(d_dsinks.get());
  st = flash3::backward(q_tensor(d_dout.get()), q_tensor(d_q.get()), k_tensor(d_k.get()),
                        k_tensor(d_v.get()), q_tensor(d_out.get()),
                        static_cast<const float*>(d_lse.get()), q_tensor(d_dq.get()),
                        k_tensor(d_dk.get()), k_tensor(d_dv.get()), bwd);
  if (not_built(st)) {
    GTEST_SKIP() << st.message;
  }
  ASSERT_TRUE(st.ok()) << st.message;
  check_cuda(cudaDeviceSynchronize(), "backward");
  const ref::Gradients grads = ref::attention_backward(s, q, k, v, dout, scale, c.causal, variant);
  const ref::PlainGradients plain_grads = ref::attention_backward_plain(
      type, s, q, k, v, dout, static_cast<float>(scale), c.causal, variant);
  const std::vector<float> dq = download_halves(d_dq.get(), type, s.q_size(), "dq"),
                           dk = download_halves(d_dk.get(), type, s.kv_size(), "dk"),
                           dv = download_halves(d_dv.get(), type, s.kv_size(), "dv");
  for (const auto& [name, got, p, w] :
       {std::tuple<const char*, const std::vector<float>&, const std::vector<float>&,
                   const std::vector<double>&>{"dq", dq, plain_grads.dq, grads.dq},
        {"dk", dk, plain_grads.dk, grads.dk},
        {"dv", dv, plain_grads.dv, grads.dv}}) {
    const ref::Verdict verdict = ref::check_gradient(name, got, p, w);
    EXPECT_TRUE(verdict.ok) << verdict.message;
  }
  // dsinks[h] = -sum over the head's rows of exp(sink - lse) D: fp32 sums of
  // the forward's own out and lse (checked above against the reference),
  // against the float64 sum of the same, D = dout . out. (Against the
  // reference's dsinks, the forward's rounding of out, within the tolerance
  // rule, comes through the sum over all rows: 0.3% at d256, past the rule's
  // bound for a gradient.) A row that sees at most kExactDKeys keys takes D
  // exactly (prepass.cuh), here dout . the reference's out.
  std::vector<float> dsinks(variant.sinks.size());
  check_cuda(cudaMemcpy(dsinks.data(), d_dsinks.get(), dsinks.size() * 4, cudaMemcpyDeviceToHost),
             "dsinks");
  for (int h = 0; h < s.heads_q; ++h) {
    double expected = 0.0, magnitude = 0.0;
    for (int b = 0; b < s.batch; ++b) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        const size_t at = (static_cast<size_t>(b * s.seqlen_q + i) * s.heads_q + h) * s.headdim;
        const int visible =
            c.causal ? std::clamp(i + s.seqlen_k - s.seqlen_q + 1, 0, s.seqlen_k) : s.seqlen_k;
        const bool exact = visible > 0 && visible <= sm90::bwd::kExactDKeys;
        double delta = 0.0;
        for (int x = 0; x < s.headdim; ++x) {
          delta += static_cast<double>(dout[at + x]) * (exact ? want.out[at + x] : out[at + x]);
        }
        const double lse_row = lse[(static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i];
        const double term = -std::exp(variant.sinks[h] - lse_row) * delta;
        expected += term;
        magnitude += std::abs(term);
      }
    }
    EXPECT_NEAR(dsinks[h], expected, 1e-4 * magnitude + 1e-7) << "dsinks[" << h << "]";
  }
}

class ForwardSinks : public HopperTest {};

TEST_F(ForwardSinks, MatchTheReference) {
  for (const int headdim : {64, 128, 256}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("headdim " + std::to_string(headdim) + (causal ? " causal" : ""));
      // Causal with more queries than keys: rows that see no key (lse = the sink).
      expect_sinks_match_reference({DType::kBFloat16, {2, 300, 211, 4, 2, headdim}, causal});
      expect_sinks_match_reference({DType::kFloat16, {1, 129, 1000, 2, 1, headdim}, causal});
    }
  }
}

TEST_F(ForwardSinks, DecodeShapedCallsSplitTheKeys) {
  // One query, GQA: not packed (sinks are per query head), the keys split over the SMs.
  expect_sinks_match_reference({DType::kBFloat16, {4, 1, 8192, 8, 2, 128}, false});
}

TEST_F(ForwardSinks, HostSinksAreRefusedByName) {
  const int64_t seqlen = 64, heads = 2, d = 64;
  const size_t bytes = static_cast<size_t>(seqlen * heads * d) * 2;
  DeviceBuffer q(bytes), k(bytes), v(bytes), out(bytes), dout(bytes), dq(bytes), dk(bytes),
      dv(bytes), lse(static_cast<size_t>(heads * seqlen) * 4);
  const auto t = [&](DeviceBuffer& b) {
    return Tensor::contiguous(b.get(), DType::kBFloat16, 1, seqlen, heads, d);
  };
  float host_sinks[heads] = {0.5f, -1.0f}, host_dsinks[heads] = {};
  auto* lse_d = static_cast<float*>(lse.get());
  ForwardOptions forward_options;
  forward_options.sinks = host_sinks;
  Status s = flash3::forward(t(q), t(k), t(v), t(out), lse_d, forward_options);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find("options.sinks"), std::string::npos) << s.message;

  DeviceBuffer device_sinks(heads * 4);
  BackwardOptions backward_options;
  backward_options.sinks = static_cast<const float*>(device_sinks.get());
  backward_options.dsinks = host_dsinks;
  s = flash3::backward(t(dout), t(q), t(k), t(v), t(out), lse_d, t(dq), t(dk), t(dv),
                       backward_options);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find("options.dsinks"), std::string::npos) << s.message;
}

class SanitizeForwardSinks : public HopperTest {};

TEST_F(SanitizeForwardSinks, Bf16D128Causal) {
  expect_sinks_match_reference({DType::kBFloat16, {1, 130, 77, 2, 1, 128}, true});
}

}  // namespace
}  // namespace flash3::test
