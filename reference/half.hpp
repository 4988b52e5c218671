// 16-bit float formats (IEEE fp16 and bfloat16) as uint16_t bit patterns:
// conversion from float rounds to nearest, ties to even; infinities, NaNs,
// signed zeros and fp16 subnormals come through as IEEE 754 says.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flash3::ref {

enum class HalfType { kFloat16, kBFloat16 };

namespace half_detail {

constexpr uint32_t kFloatSignMask = 0x80000000u;
constexpr uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInf = 0x7F800000u;
constexpr int kFloatMantissaBits = 23;
constexpr int kFloatExponentBias = 127;

constexpr uint16_t kFp16Inf = 0x7C00;
constexpr uint16_t kFp16QuietNan = 0x7E00;
constexpr int kFp16MantissaBits = 10;
constexpr int kFp16ExponentBias = 15;
constexpr uint32_t kFp16MantissaMask = 0x3FF;
constexpr uint32_t kFp16ExponentMax = 0x1F;
// |x| at or above 65520 (halfway from 65504, the largest fp16, to 2^16) rounds to inf.
constexpr uint32_t kFp16OverflowFloatBits = 0x477FF000u;
// Exponent of the fp16 subnormal step 2^-24.
constexpr int kFp16SubnormalExponent = -24;

constexpr uint16_t kBf16QuietBit = 0x0040;
constexpr int kBf16Shift = 16;

inline uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

inline float bits_float(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// value >> shift, rounded to nearest, ties to even (1 <= shift <= 31).
inline uint32_t shift_round_even(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

// The magnitude of a finite float (bits `abs`, below the target's overflow)
// rounded to nearest-even in a format with `mantissa_bits` stored mantissa
// bits and exponent bias `bias`, subnormals included; the target's bits
// without sign. A mantissa that rounds up carries into the exponent.
inline uint32_t round_magnitude(uint32_t abs, int mantissa_bits, int bias) {
  const int exponent = static_cast<int>(abs >> kFloatMantissaBits) - kFloatExponentBias;
  const uint32_t mantissa = abs & ((1u << kFloatMantissaBits) - 1);
  const int min_normal_exponent = 1 - bias;
  if (exponent < min_normal_exponent) {
    // |x| = (2^23 + mantissa) * 2^(exponent - 23), counted in subnormal steps
    // of 2^(min_normal_exponent - mantissa_bits).
    const int shift = kFloatMantissaBits + min_normal_exponent - mantissa_bits - exponent;
    if (shift > kFloatMantissaBits + 1) {
      return 0;  // below half the smallest subnormal (float subnormals included)
    }
    return shift_round_even((1u << kFloatMantissaBits) | mantissa, shift);
  }
  const uint32_t biased = static_cast<uint32_t>(exponent + bias);
  return shift_round_even((biased << kFloatMantissaBits) | mantissa,
                          kFloatMantissaBits - mantissa_bits);
}

}  // namespace half_detail

inline float bf16_to_float(uint16_t bits) {
  return half_detail::bits_float(static_cast<uint32_t>(bits) << half_detail::kBf16Shift);
}

inline uint16_t float_to_bf16(float x) {
  using namespace half_detail;
  const uint32_t bits = float_bits(x);
  if ((bits & kFloatAbsMask) > kFloatInf) {
    return static_cast<uint16_t>((bits >> kBf16Shift) | kBf16QuietBit);
  }
  // Overflow carries into the exponent and ends at inf, as it should.
  return static_cast<uint16_t>(shift_round_even(bits, kBf16Shift));
}

inline float fp16_to_float(uint16_t bits) {
  using namespace half_detail;
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> kFp16MantissaBits) & kFp16ExponentMax;
  const uint32_t mantissa = bits & kFp16MantissaMask;
  const int mantissa_shift = kFloatMantissaBits - kFp16MantissaBits;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), kFp16SubnormalExponent);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == kFp16ExponentMax) {
    return bits_float(sign | kFloatInf | (mantissa << mantissa_shift));
  }
  const uint32_t float_exponent = exponent - kFp16ExponentBias + kFloatExponentBias;
  return bits_float(sign | (float_exponent << kFloatMantissaBits) | (mantissa << mantissa_shift));
}

inline uint16_t float_to_fp16(float x) {
  using namespace half_detail;
  const uint32_t bits = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((bits & kFloatSignMask) >> 16);
  const uint32_t abs = bits & kFloatAbsMask;
  if (abs > kFloatInf) {
    return sign | kFp16QuietNan;
  }
  if (abs >= kFp16OverflowFloatBits) {
    return sign | kFp16Inf;
  }
  return sign | static_cast<uint16_t>(round_magnitude(abs, kFp16MantissaBits, kFp16ExponentBias));
}

inline float half_to_float(HalfType type, uint16_t bits) {
  return type == HalfType::kFloat16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

inline uint16_t float_to_half(HalfType type, float x) {
  return type == HalfType::kFloat16 ? float_to_fp16(x) : float_to_bf16(x);
}

// x rounded to the nearest value of `type`.
inline float round_to(HalfType type, float x) {
  return half_to_float(type, float_to_half(type, x));
}

}  // namespace flash3::ref
