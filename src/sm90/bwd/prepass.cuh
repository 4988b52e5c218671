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
  constexpr int kThreadsPerRow = T::kHeadDim / 8;  // 16 bytes each
  constexpr int kRowsPerPass = kPrepassThreads / kThreadsPerRow;
  const int head = static_cast<int>(blockIdx.y);
  const QueryRows q = query_rows(args.varlen, static_cast<int>(blockIdx.z), head, args.heads_q,
                                 args.seqlen_q, args.padded_seqlen_q, T::kBlockM);
  const int part = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int m_blocks = (q.length + T::kBlockM - 1) / T::kBlockM;
  for (int m_block = static_cast<int>(blockIdx.x); m_block < m_blocks;
       m_block += static_cast<int>(gridDim.x)) {
    for (int r = static_cast<int>(threadIdx.x) / kThreadsPerRow; r < T::kBlockM;
         r += kRowsPerPass) {
      const int row = m_block * T::kBlockM + r;
      float sum = 0.0f;
      if (row < q.length) {
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
      }
    }
    float4* dq =
        reinterpret_cast<float4*>(args.dq_accum + (q.ws_row0 + m_block * T::kBlockM) * T::kHeadDim);
    for (int i = static_cast<int>(threadIdx.x); i < T::kDqTileFloats / 4; i += kPrepassThreads) {
      dq[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

}  // namespace flash3::sm90::bwd
