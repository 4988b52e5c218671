#include "forward_case.hpp"

#include <cmath>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace flash3::test {
namespace {

using Bits = uint16_t;                // one fp16 or bf16 element
constexpr Bits kPoisonBits = 0xFFFF;  // a NaN in both formats
constexpr int kPoisonByte = 0xFF;     // fills out (NaN) and lse (NaN) before a call
// Padding of kPadded: 16 bytes keeps every row and batch start TMA-aligned.
constexpr int64_t kPadElements = 16 / sizeof(Bits);
constexpr int kHopperMajor = 9;
constexpr int kHopperMinor = 0;

size_t extent(const View& v) { return static_cast<size_t>(v.shape[0] * v.stride[0]); }

// A tensor in a buffer of its own kind of layout (not kPackedQkv).
View own_view(Layout layout, size_t offset, int64_t batch, int64_t seqlen, int64_t heads,
              int64_t headdim) {
  View v{offset, {batch, seqlen, heads, headdim}, {}};
  if (layout == Layout::kHeadMajor) {
    v.stride = {heads * seqlen * headdim, headdim, seqlen * headdim, 1};
  } else if (layout == Layout::kPadded) {
    const int64_t row = heads * headdim + kPadElements;
    v.stride = {seqlen * row + kPadElements, row, headdim, 1};
  } else {
    v.stride = {seqlen * heads * headdim, heads * headdim, headdim, 1};
  }
  return v;
}

}  // namespace

ref::HalfType half_type(DType dtype) {
  return dtype == DType::kFloat16 ? ref::HalfType::kFloat16 : ref::HalfType::kBFloat16;
}

std::string kernel_label(DType dtype, int headdim) {
  return (dtype == DType::kFloat16 ? "fp16_d" : "bf16_d") + std::to_string(headdim);
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kPackedQkv:
      return "packed";
    case Layout::kHeadMajor:
      return "headmajor";
    case Layout::kPadded:
      return "padded";
  }
  return "unknown";
}

std::string ForwardCase::name() const {
  std::ostringstream os;
  os << kernel_label(dtype, shape.headdim);
  if (shape.dv() != shape.headdim) {
    os << "_v" << shape.dv();  // v's and out's head dim
  }
  os << "_b" << shape.batch
     << "_q" << shape.seqlen_q << "_k" << shape.seqlen_k << "_h" << shape.heads_q << "_kv"
     << shape.heads_k << (causal ? "_causal" : "");
  if (layout != Layout::kContiguous) {
    os << "_" << layout_name(layout);
  }
  if (softmax_scale != 0.0f) {
    os << "_scale" << softmax_scale;
  }
  if (window_left >= 0 || window_right >= 0) {
    os << "_window" << window_left << "_" << window_right;
  }
  if (attention_chunk > 0) {
    os << "_chunk" << attention_chunk;
  }
  if (softcap > 0.0f) {
    os << "_softcap" << softcap;
  }
  return os.str();
}

float ForwardCase::resolved_scale() const {
  return softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(shape.headdim));
}

Inputs random_inputs(const ForwardCase& c) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.name()));
  std::normal_distribution<float> normal;
  const auto draw = [&](size_t n) {
    std::vector<float> x(n);
    for (float& value : x) {
      value = ref::round_to(half_type(c.dtype), normal(rng));
    }
    return x;
  };
  Inputs in;
  in.q = draw(c.shape.q_size());
  in.k = draw(c.shape.kv_size());
  in.v = draw(c.shape.v_size());
  return in;
}

std::string hopper_missing_reason() {
  if (cuda_device_count() == 0) {
    return "no CUDA device: the GPU suites need a Hopper GPU (sm_90)";
  }
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute");
  if (major != kHopperMajor || minor != kHopperMinor) {
    std::ostringstream os;
    os << "device " << device << " is sm_" << major << minor
       << ": the GPU suites need a Hopper GPU (sm_90)";
    return os.str();
  }
  return "";
}

bool not_built(const Status& s) {
  return s.code == StatusCode::kUnsupported &&
         s.message.find("not in this build") != std::string::npos;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

std::vector<int> cu_seqlens_of(const std::vector<int>& lengths) {
  std::vector<int> cu{0};
  for (int length : lengths) {
    cu.push_back(cu.back() + length);
  }
  return cu;
}

std::vector<float> random_halves(ref::HalfType type, size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& value : x) {
    value = ref::round_to(type, normal(rng));
  }
  return x;
}

void upload_halves(void* dst, ref::HalfType type, const std::vector<float>& x, const char* what) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = ref::float_to_half(type, x[i]);
  }
  check_cuda(cudaMemcpy(dst, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), what);
}

std::vector<float> download_halves(const void* src, ref::HalfType type, size_t n,
                                   const char* what) {
  std::vector<uint16_t> bits(n);
  check_cuda(cudaMemcpy(bits.data(), src, n * 2, cudaMemcpyDeviceToHost), what);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = ref::half_to_float(type, bits[i]);
  }
  return x;
}

Placement place(const ForwardCase& c) {
  const ref::Shape& s = c.shape;
  Placement p;
  if (c.layout == Layout::kPackedQkv) {
    if (s.seqlen_q != s.seqlen_k) {
      throw std::invalid_argument("packed qkv needs seqlen_q == seqlen_k");
    }
    if (s.dv() != s.headdim) {
      throw std::invalid_argument("packed qkv needs one head dim");
    }
    const int64_t row = int64_t{s.heads_q + 2 * s.heads_k} * s.headdim;
    const std::array<int64_t, 4> stride = {s.seqlen_k * row, row, s.headdim, 1};
    p.q = {0, {s.batch, s.seqlen_q, s.heads_q, s.headdim}, stride};
    p.k = {static_cast<size_t>(s.heads_q) * s.headdim,
           {s.batch, s.seqlen_k, s.heads_k, s.headdim},
           stride};
    p.v = {p.k.offset + static_cast<size_t>(s.heads_k) * s.headdim, p.k.shape, stride};
    p.inputs_size = extent(p.q);
    p.out = own_view(Layout::kContiguous, 0, s.batch, s.seqlen_q, s.heads_q, s.headdim);
  } else {
    p.q = own_view(c.layout, 0, s.batch, s.seqlen_q, s.heads_q, s.headdim);
    p.k = own_view(c.layout, extent(p.q), s.batch, s.seqlen_k, s.heads_k, s.headdim);
    p.v = own_view(c.layout, p.k.offset + extent(p.k), s.batch, s.seqlen_k, s.heads_k, s.dv());
    p.inputs_size = p.v.offset + extent(p.v);
    p.out = own_view(c.layout, 0, s.batch, s.seqlen_q, s.heads_q, s.dv());
  }
  p.out_size = extent(p.out);
  return p;
}

void for_each_element(const View& view, const std::function<void(size_t, size_t)>& fn) {
  size_t logical = 0;
  for (int64_t b = 0; b < view.shape[0]; ++b) {
    for (int64_t s = 0; s < view.shape[1]; ++s) {
      for (int64_t h = 0; h < view.shape[2]; ++h) {
        const size_t row =
            view.offset + b * view.stride[0] + s * view.stride[1] + h * view.stride[2];
        for (int64_t x = 0; x < view.shape[3]; ++x) {
          fn(logical++, row + x);
        }
      }
    }
  }
}

Tensor view_tensor(void* base, DType dtype, const View& view) {
  const size_t element_bytes = dtype == DType::kFloat8E4M3 ? 1 : sizeof(Bits);
  Tensor t;
  t.data = static_cast<unsigned char*>(base) + view.offset * element_bytes;
  t.dtype = dtype;
  t.shape = view.shape;
  t.stride = view.stride;
  return t;
}

DeviceBuffer::DeviceBuffer(size_t bytes) { check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc"); }

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

DeviceProblem::DeviceProblem(const ForwardCase& c, const Inputs& inputs)
    : case_(c),
      place_(place(c)),
      inputs_(place_.inputs_size * sizeof(Bits)),
      out_buffer_(place_.out_size * sizeof(Bits)),
      lse_(c.shape.lse_size() * sizeof(float)) {
  std::vector<Bits> staging(place_.inputs_size, kPoisonBits);
  const ref::HalfType type = half_type(c.dtype);
  const auto scatter = [&](const View& view, const std::vector<float>& values) {
    for_each_element(view, [&](size_t logical, size_t index) {
      staging[index] = ref::float_to_half(type, values[logical]);
    });
  };
  scatter(place_.q, inputs.q);
  scatter(place_.k, inputs.k);
  scatter(place_.v, inputs.v);
  check_cuda(cudaMemcpy(inputs_.get(), staging.data(), staging.size() * sizeof(Bits),
                        cudaMemcpyHostToDevice),
             "upload q, k, v");
  check_cuda(cudaMemset(out_buffer_.get(), kPoisonByte, place_.out_size * sizeof(Bits)),
             "poison out");
  check_cuda(cudaMemset(lse_.get(), kPoisonByte, c.shape.lse_size() * sizeof(float)), "poison lse");
  // The copies and memsets ran on the legacy stream; a call on a non-blocking
  // stream would not wait for them.
  check_cuda(cudaDeviceSynchronize(), "set up the problem");
}

Tensor DeviceProblem::q() const { return view_tensor(inputs_.get(), case_.dtype, place_.q); }
Tensor DeviceProblem::k() const { return view_tensor(inputs_.get(), case_.dtype, place_.k); }
Tensor DeviceProblem::v() const { return view_tensor(inputs_.get(), case_.dtype, place_.v); }
Tensor DeviceProblem::out() const {
  return view_tensor(out_buffer_.get(), case_.dtype, place_.out);
}

ForwardOptions DeviceProblem::options() const {
  ForwardOptions o;
  o.causal = case_.causal;
  o.softmax_scale = case_.softmax_scale;
  o.window_left = case_.window_left;
  o.window_right = case_.window_right;
  o.attention_chunk = case_.attention_chunk;
  o.softcap = case_.softcap;
  return o;
}

Status DeviceProblem::forward(cudaStream_t stream) const {
  return flash3::forward(q(), k(), v(), out(), lse(), options(), stream);
}

flash3_forward_args DeviceProblem::c_args() const {
  return to_c_args(q(), k(), v(), out(), lse(), options());
}

Output DeviceProblem::download() const {
  std::vector<Bits> bits(place_.out_size);
  check_cuda(cudaMemcpy(bits.data(), out_buffer_.get(), bits.size() * sizeof(Bits),
                        cudaMemcpyDeviceToHost),
             "download out");
  Output o;
  o.lse.resize(case_.shape.lse_size());
  check_cuda(
      cudaMemcpy(o.lse.data(), lse_.get(), o.lse.size() * sizeof(float), cudaMemcpyDeviceToHost),
      "download lse");
  o.out.resize(case_.shape.out_size());
  std::vector<bool> in_view(bits.size());
  const ref::HalfType type = half_type(case_.dtype);
  for_each_element(place_.out, [&](size_t logical, size_t index) {
    in_view[index] = true;
    o.unwritten += bits[index] == kPoisonBits;
    o.out[logical] = ref::half_to_float(type, bits[index]);
  });
  for (size_t i = 0; i < bits.size(); ++i) {
    o.clobbered += !in_view[i] && bits[i] != kPoisonBits;
  }
  for (const float x : o.lse) {
    o.unwritten += std::isnan(x);
  }
  return o;
}

void expect_matches_reference(const ForwardCase& c) {
  expect_matches_reference(c, random_inputs(c));
}

void expect_matches_reference(const ForwardCase& c, const Inputs& in) {
  DeviceProblem problem(c, in);
  const Status s = problem.forward(nullptr);
  if (not_built(s)) {
    GTEST_SKIP() << s.message;
  }
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "the forward kernel");
  const Output got = problem.download();
  EXPECT_EQ(got.unwritten, 0u) << "out and lse elements the kernel did not write";
  EXPECT_EQ(got.clobbered, 0u) << "elements the kernel wrote outside out";

  ref::Variant variant;
  variant.window_left = c.window_left;
  variant.window_right = c.window_right;
  variant.attention_chunk = c.attention_chunk;
  variant.softcap = c.softcap;
  const ref::Reference want =
      ref::attention_forward(c.shape, in.q, in.k, in.v, c.resolved_scale(), c.causal, variant);
  const std::vector<float> plain = ref::attention_forward_plain(
      half_type(c.dtype), c.shape, in.q, in.k, in.v, c.resolved_scale(), c.causal, variant);
  const ref::Verdict out = ref::check_output(got.out, plain, want.out);
  const ref::Verdict lse = ref::check_lse(got.lse, want.lse);
  EXPECT_TRUE(out.ok) << out.message;
  EXPECT_TRUE(lse.ok) << lse.message;
  std::cout << "[ accuracy ] " << c.name() << ": " << out.message << "\n";
}

}  // namespace flash3::test
