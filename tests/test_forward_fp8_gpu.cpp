// The FP8 forward kernel on a Hopper GPU, against the float64 reference on the
// same e4m3 inputs: the kernel's error must stay within kErrorFactor times
// that of the FP8 emulation (ref::attention_forward_fp8: fp32 accumulators,
// e4m3 P), plus kOutAtol; the LSE as expect_lse_close says. Inputs
// are quantized on the CPU (ref::quantize_e4m3) and V laid out with
// ref::fp8_v_layout, so that the kernel is tested alone. Every test skips,
// saying why, where there is no such GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "hopper_test.hpp"
#include "reference/fp8.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr uint8_t kPoisonByte = 0xFF;  // NaN in fp16, bf16 and float

struct Fp8Case {
  DType out_dtype = DType::kBFloat16;
  ref::Shape shape;
  bool causal = false;
  int block_rows = 128;  // of q, k and v; ref::kPerTensor: one scale per head
  bool hadamard = false;
  uint64_t seed = 0;

  std::string name() const {
    std::ostringstream os;
    os << "fp8_" << (out_dtype == DType::kFloat16 ? "fp16" : "bf16") << "_d" << shape.headdim
       << "_b" << shape.batch << "_q" << shape.seqlen_q << "_k" << shape.seqlen_k << "_h"
       << shape.heads_q << "_kv" << shape.heads_k << (causal ? "_causal" : "")
       << (block_rows == ref::kPerTensor ? "_pertensor" : "_block" + std::to_string(block_rows))
       << (hadamard ? "_hadamard" : "");
    return os.str();
  }
};

std::vector<float> normal_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& value : x) {
    value = ref::round_to(ref::HalfType::kBFloat16, normal(rng));
  }
  return x;
}

// The API's descales from the reference's: per tensor becomes one scale per
// (batch, head) with block_rows = seqlen.
std::vector<float> api_descales(const ref::Fp8Tensor& t, int* block_rows) {
  if (t.block_rows != ref::kPerTensor) {
    *block_rows = t.block_rows;
    return t.descale;
  }
  *block_rows = t.dims.seqlen;
  return std::vector<float>(static_cast<size_t>(t.dims.batch) * t.dims.heads, t.descale[0]);
}

// Hopper's FP8 wgmma keeps about 14 significant bits when it adds products
// into its fp32 accumulator (DeepSeek-V3 technical report, section 3.3.2; we
// saw LSE errors of 3e-4 on scores of magnitude ~6), so a score q . k carries
// an error up to ~2^-14 of sum_d |q_d k_d|. The LSE, a smooth maximum of the
// scores, gets the same: each row may be off by kLseAtol + 2^-12 * scale *
// sum_d |q_d| max_j |k_jd| (the largest such sum over the row's keys, with a
// factor 4 of margin), or kLseRtol |lse|, whichever is larger.
constexpr double kFp8AccumulatorError = 1.0 / 4096;

void expect_lse_close(const Fp8Case& c, const ref::Fp8Tensor& q8, const ref::Fp8Tensor& k8,
                      const std::vector<float>& got, const std::vector<double>& want,
                      float scale) {
  const ref::Shape& s = c.shape;
  const std::vector<float> q = ref::dequantize(q8), k = ref::dequantize(k8);
  // max_j |k_jd| per (batch, kv head, d)
  std::vector<double> k_max(static_cast<size_t>(s.batch) * s.heads_k * s.headdim, 0.0);
  for (int b = 0; b < s.batch; ++b) {
    for (int j = 0; j < s.seqlen_k; ++j) {
      for (int h = 0; h < s.heads_k; ++h) {
        for (int d = 0; d < s.headdim; ++d) {
          const size_t at = ((static_cast<size_t>(b) * s.seqlen_k + j) * s.heads_k + h) * s.headdim + d;
          double& m = k_max[(static_cast<size_t>(b) * s.heads_k + h) * s.headdim + d];
          m = std::max(m, static_cast<double>(std::fabs(k[at])));
        }
      }
    }
  }
  size_t bad = 0;
  std::string first;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      const int h_kv = h / (s.heads_q / s.heads_k);
      for (int i = 0; i < s.seqlen_q; ++i) {
        const size_t row = (static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i;
        const double ref_lse = want[row];
        if (std::isinf(ref_lse)) {
          if (!(std::isinf(got[row]) && got[row] > 0)) {
            ++bad;
          }
          continue;
        }
        double bound_sum = 0;
        for (int d = 0; d < s.headdim; ++d) {
          const size_t at = ((static_cast<size_t>(b) * s.seqlen_q + i) * s.heads_q + h) * s.headdim + d;
          bound_sum += std::fabs(q[at]) *
                       k_max[(static_cast<size_t>(b) * s.heads_k + h_kv) * s.headdim + d];
        }
        const double tolerance =
            std::max(ref::kLseAtol + kFp8AccumulatorError * scale * bound_sum,
                     ref::kLseRtol * std::fabs(ref_lse));
        if (!(std::fabs(got[row] - ref_lse) <= tolerance)) {
          if (bad++ == 0) {
            first = "row " + std::to_string(row) + ": kernel " + std::to_string(got[row]) +
                    ", ref64 " + std::to_string(ref_lse) + ", tolerance " +
                    std::to_string(tolerance);
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "lse: " << bad << " rows outside the tolerance; first " << first;
}

template <class T>
void upload(const DeviceBuffer& dst, const std::vector<T>& src) {
  check_cuda(cudaMemcpy(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice),
             "upload");
}

void expect_fp8_matches_reference(const Fp8Case& c) {
  const ref::Shape& s = c.shape;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name()));
  const std::vector<float> q = normal_bf16(s.q_size(), rng);
  const std::vector<float> k = normal_bf16(s.kv_size(), rng);
  const std::vector<float> v = normal_bf16(s.kv_size(), rng);
  const ref::TensorDims q_dims{s.batch, s.seqlen_q, s.heads_q, s.headdim};
  const ref::TensorDims kv_dims{s.batch, s.seqlen_k, s.heads_k, s.headdim};
  const ref::QuantOptions qk_options{c.block_rows, c.hadamard, c.seed};
  const ref::QuantOptions v_options{c.block_rows, false, 0};
  const ref::Fp8Tensor q8 = ref::quantize_e4m3(q_dims, q, qk_options);
  const ref::Fp8Tensor k8 = ref::quantize_e4m3(kv_dims, k, qk_options);
  const ref::Fp8Tensor v8 = ref::quantize_e4m3(kv_dims, v, v_options);
  const std::vector<uint8_t> v_layout = ref::fp8_v_layout(kv_dims, v8.data);

  Fp8Descales descales;
  const std::vector<float> dq = api_descales(q8, &descales.q.block_rows);
  const std::vector<float> dk = api_descales(k8, &descales.k.block_rows);
  const std::vector<float> dv = api_descales(v8, &descales.v.block_rows);

  const size_t out_bytes = s.q_size() * 2;
  DeviceBuffer q_dev(q8.data.size()), k_dev(k8.data.size()), v_dev(v_layout.size());
  DeviceBuffer dq_dev(dq.size() * 4), dk_dev(dk.size() * 4), dv_dev(dv.size() * 4);
  DeviceBuffer out_dev(out_bytes), lse_dev(s.lse_size() * 4);
  upload(q_dev, q8.data);
  upload(k_dev, k8.data);
  upload(v_dev, v_layout);
  upload(dq_dev, dq);
  upload(dk_dev, dk);
  upload(dv_dev, dv);
  check_cuda(cudaMemset(out_dev.get(), kPoisonByte, out_bytes), "poison out");
  check_cuda(cudaMemset(lse_dev.get(), kPoisonByte, s.lse_size() * 4), "poison lse");
  descales.q.data = static_cast<const float*>(dq_dev.get());
  descales.k.data = static_cast<const float*>(dk_dev.get());
  descales.v.data = static_cast<const float*>(dv_dev.get());

  const Tensor q_t = Tensor::contiguous(q_dev.get(), DType::kFloat8E4M3, s.batch, s.seqlen_q,
                                        s.heads_q, s.headdim);
  const Tensor k_t = Tensor::contiguous(k_dev.get(), DType::kFloat8E4M3, s.batch, s.seqlen_k,
                                        s.heads_k, s.headdim);
  const Fp8V v_t{v_dev.get(), s.batch, s.seqlen_k, s.heads_k, s.headdim};
  const Tensor out_t =
      Tensor::contiguous(out_dev.get(), c.out_dtype, s.batch, s.seqlen_q, s.heads_q, s.headdim);
  float* lse = static_cast<float*>(lse_dev.get());
  const Status status = forward_fp8(q_t, k_t, v_t, out_t, lse, descales, {c.causal, 0.0f});
  if (not_built(status)) {
    GTEST_SKIP() << status.message;
  }
  ASSERT_TRUE(status.ok()) << status.message;
  check_cuda(cudaDeviceSynchronize(), "forward_fp8");

  std::vector<uint16_t> out_bits(s.q_size());
  std::vector<float> lse_got(s.lse_size());
  check_cuda(cudaMemcpy(out_bits.data(), out_dev.get(), out_bytes, cudaMemcpyDeviceToHost),
             "download out");
  check_cuda(cudaMemcpy(lse_got.data(), lse, lse_got.size() * 4, cudaMemcpyDeviceToHost),
             "download lse");
  const ref::HalfType out_type = half_type(c.out_dtype);
  std::vector<float> out(s.q_size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = ref::half_to_float(out_type, out_bits[i]);
  }

  // Exact attention on the values the kernel received (Q and K in the
  // transformed basis, which leaves Q K^T unchanged).
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.headdim));
  const ref::Reference want = ref::attention_forward(s, ref::dequantize(q8), ref::dequantize(k8),
                                                     ref::dequantize(v8), scale, c.causal);
  const std::vector<float> emulated =
      ref::attention_forward_fp8(out_type, s, q8, k8, v8, scale, c.causal);
  const ref::Verdict out_verdict = ref::check_output(out, emulated, want.out);
  EXPECT_TRUE(out_verdict.ok) << out_verdict.message;
  expect_lse_close(c, q8, k8, lse_got, want.lse, scale);
  std::cout << "[ accuracy ] " << c.name() << ": " << out_verdict.message << "\n";
}

// Ragged tails (seqlen not a multiple of 16 or of the 128-row tiles), GQA,
// causal with more queries than keys (rows that see no key), one key.
constexpr ref::Shape kShapes[] = {
    {1, 128, 128, 2, 2, 0},   {2, 113, 1013, 4, 2, 0}, {1, 1000, 300, 2, 1, 0},
    {1, 257, 257, 3, 3, 0},   {2, 1, 1, 2, 2, 0},      {1, 640, 1024, 4, 4, 0},
};

using SweepParam = std::tuple<DType, int, bool>;  // out dtype, headdim, causal

class ForwardFp8Sweep : public HopperTest, public ::testing::WithParamInterface<SweepParam> {};

TEST_P(ForwardFp8Sweep, MatchesTheReference) {
  const auto& [out_dtype, headdim, causal] = GetParam();
  int index = 0;
  for (ref::Shape shape : kShapes) {
    shape.headdim = headdim;
    // Alternate the quantization modes over the shapes.
    const int block_rows = index % 3 == 2 ? ref::kPerTensor : 128;
    const bool hadamard = index % 2 == 1;
    const Fp8Case c{out_dtype, shape, causal, block_rows, hadamard, static_cast<uint64_t>(index)};
    SCOPED_TRACE(c.name());
    expect_fp8_matches_reference(c);
    ++index;
  }
}

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  const auto& [out_dtype, headdim, causal] = info.param;
  return std::string(out_dtype == DType::kFloat16 ? "fp16" : "bf16") + "_d" +
         std::to_string(headdim) + (causal ? "_causal" : "_noncausal");
}

INSTANTIATE_TEST_SUITE_P(Kernels, ForwardFp8Sweep,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::Values(64, 128, 256), ::testing::Bool()),
                         sweep_name);

// Block sizes other than the tile: q scales per 64 rows, k and v per 256.
class ForwardFp8Blocks : public HopperTest {};

TEST_F(ForwardFp8Blocks, MixedBlockRows) {
  // One block size for all three in Fp8Case; 256 covers "multiple of 128".
  expect_fp8_matches_reference({DType::kBFloat16, {1, 700, 900, 2, 2, 128}, false, 256, true, 9});
  expect_fp8_matches_reference({DType::kBFloat16, {1, 700, 900, 2, 2, 128}, true, 256, false, 9});
}

// Non-causal past the short variants (seqlen_q 4096 at d128, 2048 at d256:
// the variant with the tail split's code, traits.cuh) with too few key
// blocks to split, GQA.
class ForwardFp8LongVariant : public HopperTest {};

TEST_F(ForwardFp8LongVariant, Unsplit) {
  expect_fp8_matches_reference({DType::kBFloat16, {1, 4200, 700, 2, 1, 128}, false, 128, true, 13});
  expect_fp8_matches_reference({DType::kBFloat16, {1, 2200, 700, 2, 1, 256}, false, 128, true, 14});
}

// The last wave cut into pieces of key blocks (src/sm90/fwd/tail_split.hpp):
// non-causal past the short variants with 32 blocks of 128 keys, in two-CTA
// clusters; fewer tiles than SMs, so every tile is cut. Head dim 128 is
// also a compute-sanitizer case.
class ForwardFp8TailSplit : public HopperTest {};

TEST_F(ForwardFp8TailSplit, D256Seqlen4096) {
  expect_fp8_matches_reference(
      {DType::kBFloat16, {1, 2304, 4096, 1, 1, 256}, false, 128, true, 11});
}

// Small cases for compute-sanitizer.
class SanitizeForwardFp8 : public HopperTest {};

TEST_F(SanitizeForwardFp8, Fp16D128TailSplit) {
  expect_fp8_matches_reference({DType::kFloat16, {1, 4352, 4096, 1, 1, 128}, false, 128, true, 12});
}

TEST_F(SanitizeForwardFp8, Bf16D128Seqlen300Causal) {
  expect_fp8_matches_reference({DType::kBFloat16, {1, 300, 300, 2, 1, 128}, true, 128, true, 1});
}
TEST_F(SanitizeForwardFp8, Fp16D256Seqlen200) {
  expect_fp8_matches_reference({DType::kFloat16, {1, 200, 200, 2, 2, 256}, false, 128, false, 2});
}

// Head dim 64: half-empty 128-byte rows of Q and K (TMA's zeros), V 64 rows.
TEST_F(SanitizeForwardFp8, Bf16D64Seqlen1000CausalGqa) {
  expect_fp8_matches_reference({DType::kBFloat16, {2, 1000, 1000, 4, 2, 64}, true, 128, true, 3});
}

}  // namespace
}  // namespace flash3::test
