// Register fragments of the wgmma accumulator: a thread's place in it, and
// packing fp32 pairs into the 16-bit (or quads into e4m3) A operand.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

namespace flash3::sm90 {

template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// Two 16-bit values (lo in the low half) -> floats.
template <class Element>
__device__ __forceinline__ float2 unpack2(uint32_t packed) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  }
}

// Four floats -> four e4m3 bytes (a in the lowest), saturating, nearest-even.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// Position of this thread in the wgmma accumulator layout of its warpgroup.
struct FragmentCoord {
  int warp;  // warp in the warpgroup: rows 16*warp .. 16*warp+15
  int row;   // g = lane / 4: rows g and g + 8 of the warp's 16
  int col;   // 2 * (lane % 4): columns col, col + 1 of every 8
  __device__ static FragmentCoord current() {
    const int lane = threadIdx.x % 32;
    return {static_cast<int>((threadIdx.x / 32) % 4), lane / 4, 2 * (lane % 4)};
  }
};

}  // namespace flash3::sm90
