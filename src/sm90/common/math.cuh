// Fast math of both directions: MUFU exp2 / reciprocal / log2 and the
// reductions over the four threads (a quad) that share an accumulator row.
#pragma once

namespace flash3::sm90 {

inline constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// MUFU reciprocal and log2 with denormals flushed (relative error ~2^-22).
// A row's sum is >= 1 (its max element contributes exp2(0) or more), so the
// flush never applies; without .ftz each call also scales denormal inputs
// (~8 instructions).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// MUFU.TANH (tanh.approx.f32): relative error about 2^-11, as FlashAttention-3's
// softcap (cutlass::fast_tanh). A softcapped score s = c tanh(x) moves by up to
// |s| 2^-11: under bf16's rounding of P (2^-8 relative) while |s| < 8, ~2% of a
// probability at |s| = 50. (1 - 2 / (1 + e^(2x)) from exp2 and a reciprocal was
// accurate to 1e-7 but took three MUFU operations per score with the softmax's
// exp2, and the softcapped forward ran at 0.58x.)
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flash3::sm90
