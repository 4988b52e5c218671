// 2^x on the FMA pipe instead of MUFU.EX2 (FlashAttention-4's software
// exponential), for kernels whose MUFU work binds: softcap's tanh takes a
// MUFU operation per score, and with the softmax's exp2 beside it the MUFU
// pipe (16 results per clock per SM) outlasts the GEMMs. Host and device,
// so that the CPU tests check its accuracy.
//
// x = n + f with n = round(x) (a 1.5 * 2^23 add leaves it in the low
// mantissa bits), 2^f on [-0.5, 0.5] by a degree-4 polynomial (relative
// error 2.7e-6 in float: under the 16-bit P's rounding, and the log-sum-exp
// moves by less than 3e-6), and n added to the exponent field. x is clamped
// at -125, so hidden scores (-inf) give 2^-125 rather than 0: a row that
// sees no key still ends empty (the softmax tests its max), and a visible
// row's sum moves by at most 2^-125 per hidden score. x <= 127 (the
// softmax's are at most its max slack).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../problem.hpp"  // FLASH3_HOST_DEVICE

namespace flash3::sm90 {

FLASH3_HOST_DEVICE inline int32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#else
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
#endif
}
FLASH3_HOST_DEVICE inline float bits_float(int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
#endif
}

FLASH3_HOST_DEVICE inline float fma_exp2(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  x = fmaxf(x, -125.0f);
  const float shifted = x + kRound;      // round(x) in its low mantissa bits
  const float f = x - (shifted - kRound);
  float p = 0.009570068679749966f;
  p = fmaf(p, f, 0.055917806923389435f);
  p = fmaf(p, f, 0.240247443318367f);
  p = fmaf(p, f, 0.6931218504905701f);
  p = fmaf(p, f, 0.9999992847442627f);
  // (0x4B400000 + n) << 23 = n << 23 modulo 2^32: n into the exponent field.
  return bits_float(float_bits(p) + static_cast<int32_t>(static_cast<uint32_t>(
                                        float_bits(shifted)) << 23));
}

}  // namespace flash3::sm90
