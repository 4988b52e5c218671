// Online softmax in fp32 over the rows one thread holds: rows g and g+8 of
// its warp's 16 (wgmma accumulator layout), each spread over the 4 threads
// of a quad. exp2 with the softmax scale folded into one FMA.
#pragma once

#include <cmath>

#include "sm90/common/math.cuh"
#include "sm90/common/wgmma.cuh"

namespace flash3::sm90::fwd {

// A row's max or sum over the thread's kRegs accumulator registers runs in
// independent chains: kChainsPerRow<kRegs> of them, register i in chain
// chain_of(i, chains) (registers 4g + 2r + j of row r: chain (2g + j) mod chains).
template <int kRegs>
inline constexpr int kChainsPerRow = kRegs >= 8 ? 4 : 2;
__device__ __forceinline__ constexpr int chain_of(int i, int chains) {
  return (2 * (i / 4) + i % 2) % chains;
}

// The chains of one row combined as a tree: v[0] op v[width], ... for
// width = kChains / 2 .. 1.
template <int kChains, class Op>
__device__ __forceinline__ float combine_chains(float (&v)[kChains], Op op) {
#pragma unroll
  for (int width = kChains / 2; width >= 1; width /= 2) {
#pragma unroll
    for (int c = 0; c < width; ++c) {
      v[c] = op(v[c], v[c + width]);
    }
  }
  return v[0];
}

// kProbOffsetLog2: P = exp2(scaled score - row max + offset); the FP8 kernel
// uses fp8::kFp8ProbOffsetLog2 (sm90/fp8/prob_offset.hpp). kSumChains: a
// block's row sums in four independent chains instead of one dependent
// chain (Traits::kSumChains). kMaxSlackLog2 > 0: the running max moves only
// when a block's max passes it by more than that, so P <= 2^kMaxSlackLog2
// and most blocks leave every row's factor at exactly 1 (Traits::kMaxSlackLog2).
template <int kProbOffsetLog2 = 0, bool kSumChains = false, int kMaxSlackLog2 = 0>
struct OnlineSoftmax {
  static constexpr int kRows = 2;
  static constexpr float kLn2 = 0.6931471805599453f;
  float row_max[kRows];  // running max of the scores times scale_log2
  float row_sum[kRows];  // this thread's share of the running sum of P

  __device__ OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  }

  // The max of each of the thread's rows over its kRegs / 2 registers, as a
  // tree: kChains independent chains of fmax per row, then combined. A single
  // chain of 32 dependent FMNMX (64-register S) sat in the critical path of
  // every key block (ncu, fp8 d128: ~5% of the warp samples).
  template <int kRegs>
  __device__ __forceinline__ static void row_max_of(const float (&s)[kRegs],
                                                    float (&block_max)[kRows]) {
    // Registers 4g, 4g + 1 hold row 0 and 4g + 2, 4g + 3 row 1 (acc_row).
    static_assert(kRegs % 4 == 0, "accumulator registers come in groups of 4");
    constexpr int kGroups = kRegs / 4;
    constexpr int kChains = kChainsPerRow<kRegs>;
    float m[kRows][kChains];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        m[r][c] = -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int i = 4 * g + 2 * r + j;
          m[r][chain_of(i, kChains)] = fmaxf(m[r][chain_of(i, kChains)], s[i]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      block_max[r] = combine_chains(m[r], [](float a, float b) { return fmaxf(a, b); });
    }
  }

  // Replaces the raw scores in s by P = exp2(scale_log2 * s - max + offset)
  // and returns in `rescale` the factor that the O accumulator rows must be
  // multiplied by. scale_log2 (> 0) is softmax_scale * log2(e), times the
  // block's descales for fp8. Fully masked rows (max still -inf) give zeros,
  // never NaN.
  template <int kRegs>
  __device__ __forceinline__ void step(float (&s)[kRegs], float (&rescale)[kRows],
                                       float scale_log2) {
    float block_max[kRows];
    row_max_of(s, block_max);
    step_from_max<false>(s, block_max, rescale, scale_log2, [] {});
  }

  // The block's row maxima of the raw scores over the whole row (quad-reduced).
  template <int kRegs>
  __device__ __forceinline__ static void row_max_quad(const float (&s)[kRegs],
                                                      float (&block_max)[kRows]) {
    row_max_of(s, block_max);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      block_max[r] = quad_max(block_max[r]);
    }
  }

  // step() with the block's row maxima given (the thread's own, or the whole
  // row's from row_max_quad if kQuadReduced), and mid() called once the first
  // half of the exponentials is issued.
  template <bool kQuadReduced, int kRegs, class Mid>
  __device__ __forceinline__ void step_from_max(float (&s)[kRegs],
                                                const float (&block_max)[kRows],
                                                float (&rescale)[kRows], float scale_log2,
                                                Mid&& mid) {
    float shift[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float m = kQuadReduced ? block_max[r] : quad_max(block_max[r]);
      const float scaled = m * scale_log2;
      const float new_max =
          kMaxSlackLog2 > 0
              ? (scaled > row_max[r] + static_cast<float>(kMaxSlackLog2) ? scaled : row_max[r])
              : fmaxf(row_max[r], scaled);
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      rescale[r] = fast_exp2(row_max[r] - base);
      shift[r] = base - static_cast<float>(kProbOffsetLog2);
      row_max[r] = new_max;
      row_sum[r] *= rescale[r];
    }
    // With kSumChains the block's sums collect in chains and join row_sum
    // once; otherwise each P adds to row_sum in turn.
    constexpr int kChains = kChainsPerRow<kRegs>;
    float sum[kRows][kChains] = {};
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      if (i == kRegs / 2) {
        mid();
      }
      s[i] = fast_exp2(fmaf(s[i], scale_log2, -shift[acc_row(i)]));
      if constexpr (kSumChains) {
        sum[acc_row(i)][chain_of(i, kChains)] += s[i];
      } else {
        row_sum[acc_row(i)] += s[i];
      }
    }
    if constexpr (kSumChains) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        row_sum[r] += combine_chains(sum[r], [](float a, float b) { return a + b; });
      }
    }
  }

  // Final per-row normaliser (0 for rows that saw no key) and log-sum-exp
  // (natural log; +inf for rows that saw no key, as FlashAttention does).
  __device__ __forceinline__ void finish(float (&inv_sum)[kRows], float (&lse)[kRows]) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      // No visible key: the max never left -inf.
      const bool empty = row_max[r] == -INFINITY || sum == 0.0f || sum != sum;
      // MUFU.RCP and MUFU.LG2: IEEE division and logf cost ~40
      // instructions per row at every tile's end.
      inv_sum[r] = empty ? 0.0f : fast_rcp(sum);
      lse[r] = empty ? INFINITY
                     : (row_max[r] - static_cast<float>(kProbOffsetLog2) + fast_log2(sum)) * kLn2;
    }
  }
};

}  // namespace flash3::sm90::fwd
