// The backward's pre-pass, per (query block, head, batch or sequence): each
// row's rowsum(dO * O) in fp32 and its log-sum-exp times log2(e) into the
// workspace's padded row arrays, and the block's fp32 dQ sums zeroed.
#pragma once

#include <cmath>
#include <cstdint>

#include "sm90/common/fragment.cuh"
#include "sm90/common/math.cuh"
#include "sm90/problem.hpp"
#include "traits.cuh"
#include "workspace.hpp"

namespace flash3::sm90::bwd {

struct PrepassArgs {
  const void* out;
  const void* dout;
  flash3::detail::Strides3 out_stride, dout_stride;  // elements
  const float* lse;  // (batch, heads_q, seqlen_q), varlen (heads_q, total_q)
  float* lse_log2;   // per query row of the workspace (workspace.hpp)
  float* dpsum;
  float* dq_accum;
  VarlenSequences varlen;  // batch 0: dense
  const float* sinks;      // with sink_partials: heads_q
  float* sink_partials;    // or null: per query block of the per-row regions (workspace.hpp)
  int seqlen_q;
  int heads_q;
  int padded_seqlen_q;
};

inline constexpr int kPrepassThreads = 256;

// Grid (x, heads_q, batch or sequences): block x takes query blocks x,
// x + gridDim.x, ... of its sequence (dense: x alone).
template <class T>
__global__ void __launch_bounds__(kPrepassThreads) prepass_kernel(const PrepassArgs args) {
  using Element = typename T::Element;
  // A row's lanes read 16 bytes each of out and dO (head dim kHeadDimV), a
  // power of two of lanes (their sum is a butterfly over them): head dim
  // 96's 12 pieces take 16 lanes, 4 idle.
  constexpr int kPieces = T::kHeadDimV / 8;
  constexpr int kThreadsPerRow = kPieces <= 8 ? 8 : kPieces <= 16 ? 16 : 32;
  static_assert(kPieces * 8 == T::kHeadDimV && kPieces <= 32, "16-byte pieces of a row");
  constexpr int kRowsPerPass = kPrepassThreads / kThreadsPerRow;
  const int head = static_cast<int>(blockIdx.y);
  const QueryRows q = query_rows(args.varlen, static_cast<int>(blockIdx.z), head, args.heads_q,
                                 args.seqlen_q, args.padded_seqlen_q, T::kBlockM);
  const int part = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int m_blocks = (q.length + T::kBlockM - 1) / T::kBlockM;
  // The sinks' gradient: each row's -exp(sink - lse) D, summed per block in order.
  __shared__ float sink_share[T::kBlockM];
  const float sink = args.sink_partials != nullptr ? args.sinks[head] : 0.0f;
  for (int m_block = static_cast<int>(blockIdx.x); m_block < m_blocks;
       m_block += static_cast<int>(gridDim.x)) {
    for (int r = static_cast<int>(threadIdx.x) / kThreadsPerRow; r < T::kBlockM;
         r += kRowsPerPass) {
      const int row = m_block * T::kBlockM + r;
      float sum = 0.0f;
      if (row < q.length && part < kPieces) {
        const uint4 o = *reinterpret_cast<const uint4*>(
            static_cast<const Element*>(args.out) +
            args.out_stride.offset(q.batch, q.row0 + row, head) + part * 8);
        const uint4 d = *reinterpret_cast<const uint4*>(
            static_cast<const Element*>(args.dout) +
            args.dout_stride.offset(q.batch, q.row0 + row, head) + part * 8);
        const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 of = unpack2<Element>(ow[i]), df = unpack2<Element>(dw[i]);
          sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
        }
      }
#pragma unroll
      for (int lanes = kThreadsPerRow / 2; lanes > 0; lanes /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, lanes);
      }
      if (part == 0) {
        float lse_log2 = INFINITY;  // P = 0: padding, and rows that see no key (+inf)
        if (row < q.length) {
          const float lse = args.lse[q.lse_row0 + row];
          lse_log2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
        }
        args.lse_log2[q.ws_row0 + row] = lse_log2;
        args.dpsum[q.ws_row0 + row] = sum;
        if (args.sink_partials != nullptr) {
          sink_share[r] = row < q.length ? -expf(sink - args.lse[q.lse_row0 + row]) * sum : 0.0f;
        }
      }
    }
    if (args.sink_partials != nullptr) {
      __syncthreads();
      if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int r = 0; r < T::kBlockM; ++r) {
          total += sink_share[r];
        }
        args.sink_partials[q.ws_row0 / T::kBlockM + m_block] = total;
      }
      __syncthreads();  // sink_share is free for the next block
    }
    float4* dq =
        reinterpret_cast<float4*>(args.dq_accum + (q.ws_row0 + m_block * T::kBlockM) * T::kHeadDim);
    for (int i = static_cast<int>(threadIdx.x); i < T::kDqTileFloats / 4; i += kPrepassThreads) {
      dq[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

// dsinks[h] from the pre-pass's partial sums: per head (a block), its
// batches' query blocks, in a fixed order (the same bits every run).
struct SinksReduceArgs {
  const float* sink_partials;  // (batch, heads_q, num_m_blocks)
  float* dsinks;               // heads_q
  int batch;
  int heads_q;
  int num_m_blocks;
};

inline constexpr int kSinksReduceThreads = 256;

// (A template of the traits, as the other passes: one kernel per
// instantiation file rather than one symbol defined in each.)
template <class T>
__global__ void __launch_bounds__(kSinksReduceThreads)
    sinks_reduce_kernel(const SinksReduceArgs args) {
  __shared__ float partial[kSinksReduceThreads];
  const int head = static_cast<int>(blockIdx.x);
  const int64_t count = static_cast<int64_t>(args.batch) * args.num_m_blocks;
  float total = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kSinksReduceThreads) {
    const int64_t b = i / args.num_m_blocks, m = i % args.num_m_blocks;
    total += args.sink_partials[(b * args.heads_q + head) * args.num_m_blocks + m];
  }
  partial[threadIdx.x] = total;
  __syncthreads();
  for (int half = kSinksReduceThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      partial[threadIdx.x] += partial[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    args.dsinks[head] = partial[0];
  }
}

}  // namespace flash3::sm90::bwd
