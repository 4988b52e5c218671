// Online softmax in fp32 over the rows one thread holds: rows g and g+8 of
// its warp's 16 (wgmma accumulator layout), each spread over the 4 threads
// of a quad. exp2 with the softmax scale folded into one FMA.
#pragma once

#include <cmath>

namespace flash3::sm90::fwd {

inline constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
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

// Register i of a wgmma accumulator belongs to row (i & 2) ? 1 : 0 of the thread's two rows.
__device__ __forceinline__ constexpr int acc_row(int i) { return (i & 2) ? 1 : 0; }

struct OnlineSoftmax {
  static constexpr int kRows = 2;
  float row_max[kRows];  // running max of the raw (unscaled) scores
  float row_sum[kRows];  // this thread's share of the running sum of exp
  float scale_log2;      // softmax_scale * log2(e)

  __device__ explicit OnlineSoftmax(float softmax_scale) : scale_log2(softmax_scale * kLog2e) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  }

  // Replaces the scores in s by exp2(scale_log2 * (s - max)) and returns in
  // `rescale` the factor that the O accumulator rows must be multiplied by.
  // Fully masked rows (max still -inf) give zeros, never NaN.
  template <int kRegs>
  __device__ __forceinline__ void step(float (&s)[kRegs], float (&rescale)[kRows]) {
    float new_max[kRows] = {row_max[0], row_max[1]};
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      new_max[acc_row(i)] = fmaxf(new_max[acc_row(i)], s[i]);
    }
    float max_scaled[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      new_max[r] = quad_max(new_max[r]);
      max_scaled[r] = new_max[r] == -INFINITY ? 0.0f : new_max[r] * scale_log2;
      rescale[r] = fast_exp2(row_max[r] * scale_log2 - max_scaled[r]);
      row_max[r] = new_max[r];
      row_sum[r] *= rescale[r];
    }
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      s[i] = fast_exp2(fmaf(s[i], scale_log2, -max_scaled[acc_row(i)]));
      row_sum[acc_row(i)] += s[i];
    }
  }

  // Final per-row normaliser (0 for rows that saw no key) and log-sum-exp
  // (natural log; +inf for rows that saw no key, as FlashAttention does).
  __device__ __forceinline__ void finish(float softmax_scale, float (&inv_sum)[kRows],
                                         float (&lse)[kRows]) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const bool empty = sum == 0.0f || sum != sum;
      inv_sum[r] = empty ? 0.0f : 1.0f / sum;
      lse[r] = empty ? INFINITY : row_max[r] * softmax_scale + logf(sum);
    }
  }
};

}  // namespace flash3::sm90::fwd
