// The pre-pass of a varlen launch: the prefix sums of varlen.hpp's
// block_prefix, computed on the device (the offsets live there).
#pragma once

#include "varlen.hpp"

namespace flash3::sm90 {

// Varlen's pre-pass (one CTA): prefix sums of each sequence's row blocks of
// kBlock rows (the forward's query blocks, the backward's key blocks),
// saturated (varlen.hpp: block_prefix), in chunks of kVarlenPrefixThreads
// sequences, each chunk scanned by warp shuffles (64-bit: overlapping
// sequences of malformed offsets may sum past 2^31) and carried into the
// next.
inline constexpr int kVarlenPrefixThreads = 1024;
template <int kBlock>
__global__ void __launch_bounds__(kVarlenPrefixThreads)
    varlen_prefix_kernel(const int* cu_seqlens, const int* seqused, int batch, int total,
                         int* prefix) {
  __shared__ long long warp_sums[kVarlenPrefixThreads / 32];
  __shared__ long long carry;
  const long long cap = max_query_blocks(total, batch, kBlock);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    carry = 0;
  }
  __syncthreads();
  for (int base = 0; base < batch; base += kVarlenPrefixThreads) {
    const int b = base + static_cast<int>(threadIdx.x);
    const long long blocks =
        b < batch
            ? (seq_range(cu_seqlens, seqused, b, total).length + kBlock - 1) /
                  kBlock
            : 0;
    long long sum = blocks;  // inclusive scan within the warp
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const long long other = __shfl_up_sync(0xffffffffu, sum, d);
      sum += lane >= d ? other : 0;
    }
    if (lane == 31) {
      warp_sums[warp] = sum;
    }
    __syncthreads();
    long long before = carry;
    for (int w = 0; w < warp; ++w) {
      before += warp_sums[w];
    }
    if (b < batch) {
      prefix[b] = static_cast<int>(min(before + sum - blocks, cap));  // exclusive
    }
    __syncthreads();
    if (threadIdx.x == kVarlenPrefixThreads - 1) {
      carry = before + sum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    prefix[batch] = static_cast<int>(min(carry, cap));
  }
}

}  // namespace flash3::sm90
