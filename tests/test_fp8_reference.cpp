// The FP8 emulation on its own: e4m3 conversion, Hadamard signs and
// transform, quantization, fp8 attention and the paper's accuracy experiment.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "reference/fp8.hpp"

namespace flash3::ref {
namespace {

constexpr int kE4m3Codes = 256;
constexpr uint8_t kE4m3MaxNegative = kE4m3SignBit | kE4m3MaxBits;
constexpr double kExact = 1e-12;  // float64 against float64: only rounding differs
constexpr float kFloatTol = 1e-6f;
// Relative half ulp of a normal e4m3 value, and half the subnormal step (2^-10).
const float kE4m3HalfUlp = std::ldexp(1.0f, -(kE4m3MantissaBits + 1));
const float kE4m3HalfStep = std::ldexp(1.0f, kE4m3SubnormalExponent - 1);
// Every 257th float bit pattern (prime: it meets every exponent and mantissa
// pattern); all 2^32 match too, checked by hand (7 s).
constexpr uint64_t kFloatSweepStride = 257;
const int kHadamardDims[] = {16, 32, 64, 128, 256};

std::vector<float> normal_floats(size_t n, unsigned seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& value : x) {
    value = normal(rng);
  }
  return x;
}

std::vector<double> normal_doubles(size_t n, unsigned seed) {
  const std::vector<float> x = normal_floats(n, seed);
  return {x.begin(), x.end()};
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double total = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    total += a[i] * b[i];
  }
  return total;
}

// ---------------------------------------------------------------- e4m3

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < kE4m3Codes; ++code) {
    const float x = e4m3_to_float(static_cast<uint8_t>(code));
    if ((code & ~kE4m3SignBit) == kE4m3Nan) {
      ASSERT_TRUE(std::isnan(x)) << code;
      ASSERT_EQ(float_to_e4m3(x), kE4m3Nan);
    } else {
      ASSERT_EQ(float_to_e4m3(x), code) << "x = " << x;
    }
  }
  EXPECT_EQ(e4m3_to_float(kE4m3MaxBits), kE4m3Max);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0xC4), -3.0f);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, kE4m3MinNormalExponent));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, kE4m3SubnormalExponent));
  EXPECT_TRUE(std::signbit(e4m3_to_float(kE4m3SignBit)));
}

// Between every two neighbouring finite values (subnormals included): the
// midpoint goes to the even code, anything off it to the nearer value.
TEST(Fp8E4m3, TiesRoundToEvenEverywhere) {
  for (int code = 0; code < kE4m3MaxBits; ++code) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(code));
    const float hi = e4m3_to_float(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;
    const int even = code % 2 == 0 ? code : code + 1;
    ASSERT_EQ(float_to_e4m3(mid), even) << mid;
    ASSERT_EQ(float_to_e4m3(-mid), kE4m3SignBit | even) << mid;
    ASSERT_EQ(float_to_e4m3(std::nextafter(mid, lo)), code) << mid;
    ASSERT_EQ(float_to_e4m3(std::nextafter(mid, hi)), code + 1) << mid;
  }
}

TEST(Fp8E4m3, SaturatesToTheLargestFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float x :
       {kE4m3Max, 449.0f, 464.0f, 480.0f, 1e6f, std::numeric_limits<float>::max(), inf}) {
    EXPECT_EQ(float_to_e4m3(x), kE4m3MaxBits) << x;
    EXPECT_EQ(float_to_e4m3(-x), kE4m3MaxNegative) << x;
  }
  EXPECT_EQ(float_to_e4m3(std::nextafter(kE4m3Max, 0.0f)), kE4m3MaxBits);
}

TEST(Fp8E4m3, SubnormalsAndZeros) {
  const float step = std::ldexp(1.0f, kE4m3SubnormalExponent);
  EXPECT_EQ(float_to_e4m3(3 * step), 0x03);
  EXPECT_EQ(float_to_e4m3(7.5f * step), 0x08);  // tie into the smallest normal
  EXPECT_EQ(float_to_e4m3(step / 2), 0x00);     // tie: down to even zero
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::denorm_min()), kE4m3SignBit);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), kE4m3SignBit);
}

TEST(Fp8E4m3, NanStaysNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(float_to_e4m3(nan), kE4m3Nan);
  EXPECT_EQ(float_to_e4m3(-nan), kE4m3Nan);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::signaling_NaN()), kE4m3Nan);
}

// The GPU converts with cvt.rn.satfinite.e4m3x2.f32; CUDA's host path is its
// specification.
TEST(Fp8E4m3, MatchesCudaSatfiniteConversion) {
  for (uint64_t bits = 0; bits <= UINT32_MAX; bits += kFloatSweepStride) {
    const float x = half_detail::bits_float(static_cast<uint32_t>(bits));
    ASSERT_EQ(float_to_e4m3(x), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << x;
  }
}

// ---------------------------------------------------------------- Hadamard signs

static_assert(splitmix64(0) == 0xE220A8397B1DCDAFull, "SplitMix64's published first output");
static_assert(hadamard_sign(0, 0) == -1 && hadamard_sign(0, 3) == 1,
              "usable in constant expressions");

// Bit j set where hadamard_sign(seed, j) == -1.
uint64_t sign_mask(uint64_t seed) {
  uint64_t mask = 0;
  for (int j = 0; j < 64; ++j) {
    if (hadamard_sign(seed, j) < 0) {
      mask |= uint64_t{1} << j;
    }
  }
  return mask;
}

// Pinned: the GPU kernel's tests check its signs against these.
TEST(HadamardSign, PinnedValues) {
  EXPECT_EQ(sign_mask(0), 0x99747CF5FFCAB347ull);
  EXPECT_EQ(sign_mask(1), 0x49053BADF9E4973Eull);
  EXPECT_EQ(sign_mask(0x5EED), 0x71D919FE662F4474ull);
}

TEST(HadamardSign, BalancedAndSeedDependent) {
  constexpr int kIndices = 4096;
  constexpr int kSlack = 200;  // about 6 standard deviations of a fair count
  int negative = 0, differ = 0;
  for (int j = 0; j < kIndices; ++j) {
    negative += hadamard_sign(7, j) < 0;
    differ += hadamard_sign(7, j) != hadamard_sign(8, j);
  }
  EXPECT_NEAR(negative, kIndices / 2, kSlack);
  EXPECT_NEAR(differ, kIndices / 2, kSlack);
}

// ---------------------------------------------------------------- Hadamard transform

// (x ⊙ s) H / sqrt(d) with H[i][j] = (-1)^popcount(i & j), in O(d^2).
std::vector<double> explicit_hadamard(const std::vector<double>& x, uint64_t seed) {
  const int d = static_cast<int>(x.size());
  std::vector<double> y(d, 0.0);
  for (int j = 0; j < d; ++j) {
    for (int i = 0; i < d; ++i) {
      const int h = __builtin_popcount(i & j) % 2 == 0 ? 1 : -1;
      y[j] += x[i] * hadamard_sign(seed, i) * h;
    }
    y[j] /= std::sqrt(static_cast<double>(d));
  }
  return y;
}

TEST(Hadamard, MatchesTheExplicitMatrix) {
  constexpr int kDim = 16;
  constexpr uint64_t kSeed = 3;
  const std::vector<double> x = normal_doubles(kDim, 1);
  const std::vector<double> want = explicit_hadamard(x, kSeed);
  std::vector<double> y = x;
  std::vector<float> y_float(x.begin(), x.end());
  ASSERT_TRUE(randomized_hadamard(y.data(), kDim, kSeed));
  ASSERT_TRUE(randomized_hadamard(y_float.data(), kDim, kSeed));
  for (int j = 0; j < kDim; ++j) {
    EXPECT_NEAR(y[j], want[j], kExact) << j;
    EXPECT_NEAR(y_float[j], want[j], kFloatTol) << j;
  }
}

// The same transform on q and k: norms and q . k unchanged.
TEST(Hadamard, IsOrthogonal) {
  for (const int d : kHadamardDims) {
    SCOPED_TRACE(d);
    std::vector<double> q = normal_doubles(d, 2), k = normal_doubles(d, 3);
    const double qq = dot(q, q), qk = dot(q, k);
    ASSERT_TRUE(randomized_hadamard(q.data(), d, 11));
    ASSERT_TRUE(randomized_hadamard(k.data(), d, 11));
    EXPECT_NEAR(dot(q, q), qq, kExact * qq);
    EXPECT_NEAR(dot(q, k), qk, kExact);
  }
}

// y -> (y H / sqrt(d)) ⊙ s undoes the transform; float follows double.
TEST(Hadamard, InvertsAndFloatFollowsDouble) {
  for (const int d : kHadamardDims) {
    SCOPED_TRACE(d);
    const std::vector<double> x = normal_doubles(d, 4);
    std::vector<double> y = x;
    std::vector<float> y_float(x.begin(), x.end());
    ASSERT_TRUE(randomized_hadamard(y.data(), d, 5));
    ASSERT_TRUE(randomized_hadamard(y_float.data(), d, 5));
    for (int j = 0; j < d; ++j) {
      EXPECT_NEAR(y_float[j], y[j], kFloatTol * std::sqrt(dot(x, x)));
    }
    ASSERT_TRUE(walsh_hadamard(y.data(), d));
    for (int j = 0; j < d; ++j) {
      EXPECT_NEAR(y[j] * hadamard_sign(5, j), x[j], kExact);
    }
  }
}

TEST(Hadamard, RejectsOtherDims) {
  for (const int d : kHadamardDims) {
    EXPECT_TRUE(is_hadamard_dim(d));
  }
  for (const int d : {-16, 0, 1, 8, 24, 96, 100, 512}) {
    SCOPED_TRACE(d);
    EXPECT_FALSE(is_hadamard_dim(d));
    std::vector<double> row(kHadamardMaxDim * 2, 1.0);
    std::vector<float> row_float(row.size(), 1.0f);
    EXPECT_FALSE(randomized_hadamard(row.data(), d, 0));
    EXPECT_FALSE(walsh_hadamard(row_float.data(), d));
    EXPECT_EQ(row, std::vector<double>(row.size(), 1.0));
    EXPECT_EQ(row_float, std::vector<float>(row.size(), 1.0f));
  }
}

// ---------------------------------------------------------------- quantization

// amax of rows [begin, end) of (batch b, head h).
float block_amax(const TensorDims& d, const std::vector<float>& x, int b, int h, int begin,
                 int end) {
  float m = 0.0f;
  for (int i = begin; i < end; ++i) {
    const size_t at = ((static_cast<size_t>(b) * d.seqlen + i) * d.heads + h) * d.headdim;
    for (int c = 0; c < d.headdim; ++c) {
      m = std::max(m, std::fabs(x[at + c]));
    }
  }
  return m;
}

TEST(Fp8Quant, ScalesAreAmaxOver448) {
  const TensorDims dims{2, 300, 3, 32};  // blocks of 128, 128 and 44 rows
  constexpr int kBlockRows = 128, kBlocks = 3;
  std::vector<float> x = normal_floats(dims.size(), 6);
  for (int i = 0; i < kBlockRows; ++i) {  // block 0 of (b 1, h 2) is zero
    std::fill_n(&x[((dims.seqlen + i) * dims.heads + 2) * dims.headdim], dims.headdim, 0.0f);
  }
  const Fp8Tensor t = quantize_e4m3(dims, x, {kBlockRows});
  ASSERT_EQ(t.descale.size(), static_cast<size_t>(dims.batch * dims.heads * kBlocks));
  for (int b = 0; b < dims.batch; ++b) {
    for (int h = 0; h < dims.heads; ++h) {
      for (int block = 0; block < kBlocks; ++block) {
        const int begin = block * kBlockRows;
        const float m = block_amax(dims, x, b, h, begin, std::min(begin + kBlockRows, dims.seqlen));
        EXPECT_EQ(t.descale_at(b, begin, h), m == 0.0f ? 1.0f : m / kE4m3Max);
      }
    }
  }
  EXPECT_EQ(t.descale_at(1, 0, 2), 1.0f);
  const Fp8Tensor whole = quantize_e4m3(dims, x, {kPerTensor});
  ASSERT_EQ(whole.descale.size(), 1u);
  float m = 0.0f;
  for (const float value : x) {
    m = std::max(m, std::fabs(value));
  }
  EXPECT_EQ(whole.descale[0], m / kE4m3Max);
}

// The largest |x| of a group maps to 448, nothing saturates, and every value
// comes back within half an e4m3 ulp (half a subnormal step near zero).
TEST(Fp8Quant, DequantizedWithinHalfAnUlp) {
  const TensorDims dims{1, 200, 2, 64};
  const std::vector<float> x = normal_floats(dims.size(), 7, 3.0f);
  for (const int block_rows : {kPerTensor, 64}) {
    SCOPED_TRACE(block_rows);
    const Fp8Tensor t = quantize_e4m3(dims, x, {block_rows});
    const std::vector<float> back = dequantize(t);
    int at_max = 0;
    for (size_t at = 0; at < x.size(); ++at) {
      const size_t row = at / dims.headdim;
      const float scale =
          t.descale_at(0, static_cast<int>(row / dims.heads), static_cast<int>(row % dims.heads));
      const float tol = (kE4m3HalfUlp * std::fabs(x[at]) + kE4m3HalfStep * scale) * (1 + kFloatTol);
      ASSERT_LE(std::fabs(back[at] - x[at]), tol) << at;
      at_max += (t.data[at] & ~kE4m3SignBit) == kE4m3MaxBits;
    }
    EXPECT_GE(at_max, static_cast<int>(t.descale.size()));
  }
}

// e4m3 values times a power of two, each block holding +-448 times it: the
// scale is that power of two and the round trip is exact.
TEST(Fp8Quant, RepresentableValuesRoundTripExactly) {
  const TensorDims dims{2, 96, 2, 16};
  constexpr int kBlockRows = 32;
  const float scale = std::ldexp(1.0f, -3);
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> code(0, kE4m3MaxNegative);
  std::vector<float> x(dims.size());
  for (float& value : x) {
    const float coded = e4m3_to_float(static_cast<uint8_t>(code(rng)));
    value = std::isnan(coded) ? 0.0f : coded * scale;
  }
  for (size_t row = 0; row < x.size() / dims.headdim; row += kBlockRows * dims.heads) {
    x[row * dims.headdim] = -kE4m3Max * scale;       // one 448 in each block of head 0 ...
    x[(row + 1) * dims.headdim] = kE4m3Max * scale;  // ... and of head 1
  }
  for (const int block_rows : {kPerTensor, kBlockRows}) {
    const Fp8Tensor t = quantize_e4m3(dims, x, {block_rows});
    EXPECT_EQ(t.descale, std::vector<float>(t.descale.size(), scale));
    EXPECT_EQ(dequantize(t), x);
  }
}

// One block 2^16 times larger: a per-tensor scale pushes the other blocks
// into the subnormals, per-block scales keep them at full precision.
TEST(Fp8Quant, PerBlockIsolatesAnOutlierBlock) {
  const TensorDims dims{1, 512, 1, 64};
  constexpr int kBlockRows = 128;
  const float outlier_gain = std::ldexp(1.0f, 16);
  std::vector<float> x = normal_floats(dims.size(), 9);
  for (int at = 0; at < kBlockRows * dims.headdim; ++at) {
    x[at] *= outlier_gain;
  }
  const auto rms_error_outside_block0 = [&](int block_rows) {
    const std::vector<float> back = dequantize(quantize_e4m3(dims, x, {block_rows}));
    double sum = 0;
    for (size_t at = kBlockRows * dims.headdim; at < x.size(); ++at) {
      sum += (back[at] - x[at]) * (back[at] - x[at]);
    }
    return std::sqrt(sum / (x.size() - kBlockRows * dims.headdim));
  };
  const double per_block = rms_error_outside_block0(kBlockRows);
  const double per_tensor = rms_error_outside_block0(kPerTensor);
  EXPECT_LT(per_block, 0.05);
  EXPECT_GT(per_tensor, 10 * per_block);
}

TEST(Fp8Quant, HadamardTransformsEveryRowFirst) {
  const TensorDims dims{2, 40, 3, 64};
  constexpr uint64_t kSeed = 12;
  const std::vector<float> x = normal_floats(dims.size(), 10);
  std::vector<float> rotated = x;
  for (size_t at = 0; at < x.size(); at += dims.headdim) {
    ASSERT_TRUE(randomized_hadamard(&rotated[at], dims.headdim, kSeed));
  }
  const Fp8Tensor a = quantize_e4m3(dims, x, {16, true, kSeed});
  const Fp8Tensor b = quantize_e4m3(dims, rotated, {16});
  // The same scales (max commutes with the positive normalisation); the codes
  // round y * (norm / scale) against (y * norm) * (1 / scale): at most one
  // e4m3 step apart, and nearly all equal.
  EXPECT_EQ(a.descale, b.descale);
  size_t equal = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    const float va = e4m3_to_float(a.data[i]), vb = e4m3_to_float(b.data[i]);
    const float larger = std::max(std::fabs(va), std::fabs(vb));
    const float step = std::ldexp(1.0f, std::max(std::ilogb(std::max(larger, 1e-30f)), -6) - 3);
    EXPECT_LE(std::fabs(va - vb), step) << "element " << i;
    equal += a.data[i] == b.data[i];
  }
  EXPECT_GE(equal, a.data.size() * 99 / 100);
}

TEST(Fp8Quant, RejectsBadArguments) {
  const TensorDims dims{1, 4, 1, 96};
  const std::vector<float> x(dims.size(), 1.0f);
  EXPECT_THROW(quantize_e4m3(dims, x, {kPerTensor, true}), std::invalid_argument);
  EXPECT_THROW(quantize_e4m3(dims, x, {-1}), std::invalid_argument);
  EXPECT_THROW(quantize_e4m3({1, 5, 1, 96}, x, {}), std::invalid_argument);
  EXPECT_NO_THROW(quantize_e4m3(dims, x, {3}));
}

// ---------------------------------------------------------------- attention

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs random_inputs(const Shape& s, unsigned seed) {
  return {normal_floats(s.q_size(), seed), normal_floats(s.kv_size(), seed + 1),
          normal_floats(s.kv_size(), seed + 2)};
}

struct Fp8Inputs {
  Fp8Tensor q, k, v;
};

// The transform, where `options` asks for it, on q and k only.
Fp8Inputs quantize_inputs(const Shape& s, const Inputs& in, const QuantOptions& options) {
  const TensorDims q_dims{s.batch, s.seqlen_q, s.heads_q, s.headdim};
  const TensorDims kv_dims{s.batch, s.seqlen_k, s.heads_k, s.headdim};
  return {quantize_e4m3(q_dims, in.q, options), quantize_e4m3(kv_dims, in.k, options),
          quantize_e4m3(kv_dims, in.v, {options.block_rows})};
}

Fp8Inputs quantize_inputs(const Shape& s, unsigned seed, const QuantOptions& options) {
  return quantize_inputs(s, random_inputs(s, seed), options);
}

std::vector<float> run_fp8(const Shape& s, const Fp8Inputs& in, float scale, bool causal,
                           HalfType out_type = HalfType::kBFloat16) {
  return attention_forward_fp8(out_type, s, in.q, in.k, in.v, scale, causal);
}

// One key: p = 1 and the output is its value row, dequantized.
TEST(Fp8Attention, OneKeyGivesItsValue) {
  const Shape s{2, 5, 1, 2, 1, 32};
  const Fp8Inputs in = quantize_inputs(s, 13, {2});
  const std::vector<float> out = run_fp8(s, in, 0.5f, false);
  const std::vector<float> v = dequantize(in.v);
  for (size_t at = 0; at < out.size(); ++at) {
    const size_t b = at / (s.seqlen_q * s.heads_q * s.headdim);
    ASSERT_EQ(out[at], round_to(HalfType::kBFloat16, v[b * s.headdim + at % s.headdim])) << at;
  }
}

// One query, two keys, worked by hand: scores 0 and -1, so p = (1, e^-0.5)
// with softmax scale 1/2. P goes to e4m3 (e^-0.5 = 0.6065 -> 0.625) but the
// row sum does not: out = (0.625 v1) / (1 + e^-0.5).
TEST(Fp8Attention, TwoKeysByHand) {
  const Shape s{1, 1, 2, 1, 1, kHadamardMinDim};
  const auto exact = [](int seqlen, std::vector<float> values) {
    values.resize(static_cast<size_t>(seqlen) * kHadamardMinDim, 0.0f);
    std::vector<uint8_t> codes(values.size());
    std::transform(values.begin(), values.end(), codes.begin(), float_to_e4m3);
    return Fp8Tensor{{1, seqlen, 1, kHadamardMinDim}, kPerTensor, codes, {1.0f}};
  };
  std::vector<float> k(2 * kHadamardMinDim, 0.0f), v(2 * kHadamardMinDim, 0.0f);
  k[kHadamardMinDim] = -1.0f;  // key 1 scores -1, key 0 scores 0
  v[kHadamardMinDim] = 1.0f;   // value 1 is (1, 0, ...), value 0 is zero
  const std::vector<float> out = attention_forward_fp8(HalfType::kFloat16, s, exact(1, {1.0f}),
                                                       exact(2, k), exact(2, v), 0.5f, false);
  const double p1 = std::exp(-0.5);
  constexpr double kFp16Tol = 5e-4;  // about 2 fp16 ulps at 0.39
  EXPECT_NEAR(out[0], 0.625 / (1 + p1), kFp16Tol);
  EXPECT_EQ(out[1], 0.0f);
}

// Descales are scales: doubling q's equals doubling the softmax scale;
// doubling v's doubles the output.
TEST(Fp8Attention, DescalesScaleScoresAndValues) {
  const Shape s{1, 20, 50, 2, 2, 64};
  const Fp8Inputs in = quantize_inputs(s, 14, {16});
  const std::vector<float> base = run_fp8(s, in, 0.25f, false);
  Fp8Inputs doubled = in;
  for (float& d : doubled.q.descale) {
    d *= 2;
  }
  EXPECT_EQ(run_fp8(s, doubled, 0.25f, false), run_fp8(s, in, 0.5f, false));
  doubled = in;
  for (float& d : doubled.v.descale) {
    d *= 2;
  }
  const std::vector<float> twice = run_fp8(s, doubled, 0.25f, false);
  for (size_t at = 0; at < base.size(); ++at) {
    ASSERT_EQ(twice[at], 2 * base[at]) << at;
  }
}

// Query head h reads kv head h / (heads_q / heads_k): the same as repeated kv heads.
TEST(Fp8Attention, GqaEqualsRepeatedKvHeads) {
  const Shape gqa{2, 9, 33, 4, 2, 16};
  const Shape mha{2, 9, 33, 4, 4, 16};
  const QuantOptions options{8, true, 15};
  const Inputs in = random_inputs(gqa, 16);
  const int group = gqa.heads_q / gqa.heads_k;
  const auto repeat = [&](const std::vector<float>& x) {
    std::vector<float> r(mha.kv_size());
    for (size_t at = 0; at < r.size(); ++at) {
      const size_t row = at / mha.headdim;  // (b, j, h) of mha
      const size_t from_row = row / mha.heads_k * gqa.heads_k + row % mha.heads_k / group;
      r[at] = x[from_row * gqa.headdim + at % gqa.headdim];
    }
    return r;
  };
  const Inputs repeated{in.q, repeat(in.k), repeat(in.v)};
  EXPECT_EQ(run_fp8(gqa, quantize_inputs(gqa, in, options), 0.25f, true),
            run_fp8(mha, quantize_inputs(mha, repeated, options), 0.25f, true));
}

// Bottom-right causal mask: rows that see no key are zero; the last row sees all.
TEST(Fp8Attention, CausalMaskAsTheReference) {
  const Shape s{1, 12, 8, 2, 1, 16};
  const Fp8Inputs in = quantize_inputs(s, 17, {4});
  const std::vector<float> causal = run_fp8(s, in, 0.25f, true);
  const std::vector<float> full = run_fp8(s, in, 0.25f, false);
  const size_t row_size = static_cast<size_t>(s.heads_q) * s.headdim;
  for (int i = 0; i < s.seqlen_q; ++i) {
    const std::vector<float> row(causal.begin() + i * row_size,
                                 causal.begin() + (i + 1) * row_size);
    const std::vector<float> full_row(full.begin() + i * row_size,
                                      full.begin() + (i + 1) * row_size);
    if (visible_keys(s, true, i) == 0) {
      EXPECT_EQ(row, std::vector<float>(row_size, 0.0f)) << i;
    } else if (visible_keys(s, true, i) == s.seqlen_k) {
      EXPECT_EQ(row, full_row) << i;
    } else {
      EXPECT_NE(row, full_row) << i;
    }
  }
}

// Against the float64 reference on the dequantized inputs, the error is
// that of P in e4m3 and of the output rounding: a few percent at most.
TEST(Fp8Attention, CloseToTheReferenceOnItsOwnInputs) {
  const Shape s{1, 64, 256, 2, 1, 64};
  const Fp8Inputs in = quantize_inputs(s, 18, {64});
  const Reference ref =
      attention_forward(s, dequantize(in.q), dequantize(in.k), dequantize(in.v), 0.125, true);
  const ErrorStats e = error_stats(run_fp8(s, in, 0.125f, true, HalfType::kFloat16), ref.out);
  EXPECT_EQ(e.non_finite, 0u);
  EXPECT_LT(e.rms, 5e-3);
  EXPECT_LT(e.max_abs, 2.5e-2);
}

TEST(Fp8Attention, RejectsMismatchedInputs) {
  const Shape s{1, 4, 6, 2, 1, 16};
  const Fp8Inputs in = quantize_inputs(s, 19, {});
  Shape wrong = s;
  wrong.seqlen_k = 5;
  EXPECT_THROW(run_fp8(wrong, in, 0.25f, false), std::invalid_argument);
  Fp8Inputs bad = in;
  bad.k.descale.push_back(1.0f);
  EXPECT_THROW(run_fp8(s, bad, 0.25f, false), std::invalid_argument);
}

// ---------------------------------------------------------------- accuracy (paper, Table 3)

void print_accuracy(const char* label, const Fp8Accuracy& a, double seconds) {
  std::printf(
      "[ fp8 rmse ] %s: bf16 plain %.3e, fp8 per-tensor %.3e, fp8 block %.3e, "
      "fp8 block + hadamard %.3e (%.1f s)\n",
      label, a.bf16_plain, a.fp8_per_tensor, a.fp8_block, a.fp8_block_hadamard, seconds);
}

Fp8Accuracy timed_accuracy(const char* label, const Shape& s, int block_rows) {
  const auto start = std::chrono::steady_clock::now();
  const Fp8Accuracy a = fp8_accuracy(s, block_rows, 0);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  print_accuracy(label, a, took.count());
  return a;
}

// Entries as the paper's, 1024 keys (at 512 the fp8 errors vary more from
// seed to seed than block quantization changes them). Over seeds 0-7 the
// transform gives 0.59-0.66 of the per-tensor error and block quantization
// alone 0.82-1.00: e4m3 is a floating-point format, so a scale changes its
// relative precision only near the subnormals (see the report in issue 4).
TEST(Fp8Accuracy, BlockQuantizationAndHadamardBeatPerTensor) {
  constexpr double kHadamardGain = 0.75;  // largest ratio to allow, 0.66 seen
  const Fp8Accuracy a =
      timed_accuracy("b1 h2 s1024 d128 block 128", {1, 1024, 1024, 2, 2, 128}, 128);
  EXPECT_LT(a.bf16_plain, a.fp8_block_hadamard);
  EXPECT_LT(a.fp8_block_hadamard, a.fp8_block);
  EXPECT_LT(a.fp8_block, a.fp8_per_tensor);
  EXPECT_LT(a.fp8_block_hadamard, kHadamardGain * a.fp8_per_tensor);
}

// Too slow for CI (~9 s on 2 cores); run with --gtest_also_run_disabled_tests.
TEST(Fp8Accuracy, DISABLED_LargerShape) {
  timed_accuracy("b1 h4 s2048 d128 block 128", {1, 2048, 2048, 4, 4, 128}, 128);
}

}  // namespace
}  // namespace flash3::ref
