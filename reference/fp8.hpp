// FP8 (e4m3) emulation for testing the FP8 kernels (issue 4):
//  - e4m3fn conversion, bit-exact with CUDA's __nv_cvt_float_to_fp8(x,
//    __NV_SATFINITE, __NV_E4M3) (the cvt.rn.satfinite.e4m3x2.f32 instruction);
//  - the randomized Hadamard transform of one head row (incoherent processing);
//  - quantization of a (batch, seqlen, heads, headdim) tensor with one scale
//    per block of sequence rows of one head, or one per tensor;
//  - attention over e4m3 inputs as the FlashAttention-3 FP8 kernel computes it;
//  - the paper's accuracy experiment (FlashAttention-3, Table 3).
// The conversion, the signs, the transform and the quantization are exact
// specifications: a GPU kernel that follows the comments reproduces them
// bit for bit. The attention emulation models the kernel's numerics (fp32
// accumulators, fp8 P) but not its summation order.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference/attention_ref.hpp"
#include "reference/half.hpp"
#include "src/sm90/fp8/hadamard_sign.hpp"

namespace flash3::ref {

// ---------------------------------------------------------------- e4m3fn
// 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN is
// S.1111.111; subnormals are multiples of 2^-9.
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kMinScale = 1.17549435e-38f;  // FLT_MIN: see quantize_e4m3
inline constexpr uint8_t kE4m3MaxBits = 0x7E;
inline constexpr uint8_t kE4m3Nan = 0x7F;  // CUDA's canonical NaN
inline constexpr uint8_t kE4m3SignBit = 0x80;
inline constexpr int kE4m3MantissaBits = 3;
inline constexpr int kE4m3ExponentBias = 7;
inline constexpr int kE4m3MinNormalExponent = -6;
inline constexpr int kE4m3SubnormalExponent = -9;  // the subnormal step 2^-9

namespace fp8_detail {
constexpr uint32_t kE4m3MaxFloatBits = 0x43E00000u;  // 448.0f
constexpr uint32_t kE4m3AbsMask = 0x7F;
constexpr uint32_t kE4m3MantissaMask = 0x7;
}  // namespace fp8_detail

inline float e4m3_to_float(uint8_t bits) {
  using namespace fp8_detail;
  const uint32_t magnitude = bits & kE4m3AbsMask;
  if (magnitude == kE4m3Nan) {
    return std::nanf("");
  }
  const int exponent = static_cast<int>(magnitude >> kE4m3MantissaBits);
  const int mantissa = static_cast<int>(magnitude & kE4m3MantissaMask);
  const float value = exponent == 0
                          ? std::ldexp(static_cast<float>(mantissa), kE4m3SubnormalExponent)
                          : std::ldexp(static_cast<float>(mantissa + (1 << kE4m3MantissaBits)),
                                       exponent - kE4m3ExponentBias - kE4m3MantissaBits);
  return (bits & kE4m3SignBit) != 0 ? -value : value;
}

// Round to nearest, ties to even; |x| >= 448 (inf included) saturates to
// +-448; NaN of either sign gives kE4m3Nan, as CUDA does for a float input.
inline uint8_t float_to_e4m3(float x) {
  using namespace half_detail;
  using namespace fp8_detail;
  const uint32_t bits = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits & kFloatSignMask) >> 24);
  const uint32_t abs = bits & kFloatAbsMask;
  if (abs > kFloatInf) {
    return kE4m3Nan;
  }
  if (abs >= kE4m3MaxFloatBits) {
    return sign | kE4m3MaxBits;
  }
  // The largest result is 448 (0x7E): the NaN code is never reached.
  return sign | static_cast<uint8_t>(round_magnitude(abs, kE4m3MantissaBits, kE4m3ExponentBias));
}

inline float round_to_e4m3(float x) { return e4m3_to_float(float_to_e4m3(x)); }

// ---------------------------------------------------------------- Hadamard signs
// hadamard_sign(seed, index), the sign of head-dim column `index`, lives in
// src/sm90/fp8/hadamard_sign.hpp, which the quantization kernel uses too.
using incoherent::hadamard_sign;
using incoherent::kGoldenGamma;
using incoherent::splitmix64;

// ---------------------------------------------------------------- Hadamard transform
inline constexpr int kHadamardMinDim = 16;
inline constexpr int kHadamardMaxDim = 256;

// d is a power of two in [kHadamardMinDim, kHadamardMaxDim].
bool is_hadamard_dim(int d);

// row <- row H_d / sqrt(d) in place, H_d the Sylvester (natural order)
// Hadamard matrix, H[i][j] = (-1)^popcount(i & j). Fast Walsh-Hadamard
// transform: butterflies (a, b) -> (a + b, a - b) over pairs (j, j + h) for
// h = 1, 2, 4, ..., d / 2 in that order, each rounded to T; then every
// element times T(1 / sqrt(d)). Returns false, row untouched, for a bad d.
bool walsh_hadamard(float* row, int d);
bool walsh_hadamard(double* row, int d);

// row <- (row ⊙ s) H_d / sqrt(d), s_i = hadamard_sign(seed, i): orthogonal,
// so applied to both q and k it leaves q . k unchanged. Its inverse is
// walsh_hadamard followed by the signs.
bool randomized_hadamard(float* row, int d, uint64_t seed);
bool randomized_hadamard(double* row, int d, uint64_t seed);

// ---------------------------------------------------------------- quantization
struct TensorDims {
  int batch = 1;
  int seqlen = 1;
  int heads = 1;
  int headdim = 1;

  size_t size() const;
  bool operator==(const TensorDims& other) const;
};

inline constexpr int kPerTensor = 0;  // QuantOptions::block_rows: one scale for the tensor

struct QuantOptions {
  int block_rows = kPerTensor;  // sequence rows of one (batch, head) that share a scale
  bool hadamard = false;        // randomized_hadamard on every row first (for Q and K)
  uint64_t seed = 0;
};

struct Fp8Tensor {
  TensorDims dims;
  int block_rows = kPerTensor;
  std::vector<uint8_t> data;  // e4m3 bits, (batch, seqlen, heads, headdim)
  // Per block: (batch, heads, ceil(seqlen / block_rows)); per tensor: one value.
  std::vector<float> descale;

  // Index in descale of the scale of row `row` of (batch b, head h).
  size_t scale_index(int b, int row, int h) const;
  float descale_at(int b, int row, int h) const;
};

// Each scale group (block or tensor), with y the rows after the optional
// transform left unnormalised (the sign flips and butterflies of
// randomized_hadamard, without its final 1 / sqrt(d)), norm = float(1 /
// sqrt(d)) with the transform and 1 without, amax = max |y| over the group,
// in float (IEEE, no fast math):
//   scale  = (amax * norm) / kE4m3Max, 1 where that is 0 (an all-zero
//            group), at least kMinScale (FLT_MIN) otherwise,
//   factor = norm / scale,
//   code   = float_to_e4m3(y * factor),
// and descale = scale: the transform's normalisation is applied with the
// scale, in one multiplication an element (the GPU kernel's order). |y *
// factor| never exceeds 448 by more than rounding, which saturation absorbs. Throws std::invalid_argument on a size mismatch,
// a negative block_rows, or the transform with a head dim it does not take.
Fp8Tensor quantize_e4m3(const TensorDims& dims, const std::vector<float>& x,
                        const QuantOptions& options);

// code value * descale, in the transformed basis where the transform was applied.
std::vector<float> dequantize(const Fp8Tensor& t);

// ---------------------------------------------------------------- FP8 V layout
// v_codes (e4m3 bits, contiguous (batch, seqlen, heads, headdim)) in the FP8
// forward's V layout (flash3::Fp8V, include/flash3/flash3.hpp): contiguous
// [batch][heads][headdim][padded], padded = seqlen rounded up to a multiple of
// flash3::kFp8VKeyGroup, where
//   out[((b * heads + h) * headdim + d) * padded + slot] =
//     v_codes at (b, key, h, d), key = slot / 16 * 16 + kFp8VKeyOrder[slot % 16],
//     or 0 where key >= seqlen.
// Throws std::invalid_argument when v_codes does not have dims.size() bytes.
std::vector<uint8_t> fp8_v_layout(const TensorDims& dims, const std::vector<uint8_t>& v_codes);

// ---------------------------------------------------------------- attention
// The FP8 kernel's arithmetic on e4m3 q, k, v with their descales (a query
// row uses its block's descale, each key and value row its own block's):
//   s  = float(q8 . k8) * (dq * dk)                 (fp32 accumulator)
//   p  = exp2f(fmaf(s, scale_log2, -max_j s * scale_log2)), scale_log2 =
//        softmax_scale * log2(e), p in [0, 1]
//   l  = float(sum_j p)                             (from p before rounding)
//   o  = float(sum_j e4m3(p) * dv * v8)             (fp32 accumulator, P unscaled)
//   out = round_to(out_type, o * (1 / l))
// Causal masks and GQA as attention_forward; rows that see no key give zeros.
std::vector<float> attention_forward_fp8(HalfType out_type, const Shape& shape, const Fp8Tensor& q,
                                         const Fp8Tensor& k, const Fp8Tensor& v,
                                         float softmax_scale, bool causal);

// ---------------------------------------------------------------- accuracy experiment
// RMSE of out against the float64 reference (attention_forward on the same
// bf16-rounded inputs, non-causal, softmax_scale 1 / sqrt(headdim)). Inputs:
// every entry of q, k, v is N(0, 1) plus, with probability
// kOutlierProbability, an extra N(0, kOutlierStd^2) term, rounded to bf16.
inline constexpr double kOutlierProbability = 0.001;
inline constexpr double kOutlierStd = 10.0;

struct Fp8Accuracy {
  double bf16_plain = 0;          // attention_forward_plain in bf16
  double fp8_per_tensor = 0;      // one scale per tensor, no transform (the baseline)
  double fp8_block = 0;           // block quantization
  double fp8_block_hadamard = 0;  // block quantization + incoherent processing
};

// The fp8 variants quantize q, k and v alike (the transform only on q and k,
// with `seed`) and round out to bf16.
Fp8Accuracy fp8_accuracy(const Shape& shape, int block_rows, uint64_t seed);

}  // namespace flash3::ref
