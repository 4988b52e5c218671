// The backward's post-passes: dQ from the workspace's fp32 sums (in the
// main kernel's thread order, mainloop.cuh: stage_dq) scaled into the 16-bit
// output, per (query block, head, batch or sequence); and with GQA, dK and
// dV from their fp32 sums.
#pragma once

#include <cstdint>

#include "sm90/common/fragment.cuh"
#include "sm90/common/wgmma.cuh"
#include "sm90/problem.hpp"
#include "traits.cuh"
#include "workspace.hpp"

namespace flash3::sm90::bwd {

struct PostpassArgs {
  const float* dq_accum;
  const int* dq_state;  // or null: every block's sums hold its dQ (kDqAtomic's, zeroed first)
  void* dq;
  flash3::detail::Strides3 dq_stride;  // elements
  VarlenSequences varlen;  // batch 0: dense
  int seqlen_q;
  int heads_q;
  int padded_seqlen_q;
  float softmax_scale;
};

inline constexpr int kPostpassThreads = 256;

// One query block: its fp32 sums read in thread order (coalesced float4s;
// zeros for a block that no key block wrote: its state is 0), scaled,
// converted and put in a row-major shared tile, then written out in
// 16-byte row pieces (a warp writes whole rows). Writing the 4-byte pairs of
// the thread order straight out left half of each 32-byte sector of a store
// unwritten: H200, d128 seqlen 512, this pass took 124 us against cuDNN's
// 58 for the same conversion.
template <class T>
__global__ void __launch_bounds__(kPostpassThreads) dq_postpass_kernel(const PostpassArgs args) {
  using Element = typename T::Element;
  constexpr int kThreads = T::kWarpgroupThreads;
  // Rows padded by 16 bytes: the 8 rows a warp's pairs fall in start 4 banks
  // apart, so its 32 4-byte writes hit 32 banks.
  constexpr int kRowElements = T::kHeadDim + 16 / static_cast<int>(sizeof(Element));
  constexpr int kPieces = T::kHeadDim * static_cast<int>(sizeof(Element)) / 16;  // per row
  constexpr int kPieceElements = 16 / static_cast<int>(sizeof(Element));
  __shared__ __align__(16) Element tile[T::kBlockM * kRowElements];
  const int head = static_cast<int>(blockIdx.y);
  const QueryRows q = query_rows(args.varlen, static_cast<int>(blockIdx.z), head, args.heads_q,
                                 args.seqlen_q, args.padded_seqlen_q, T::kBlockM);
  const int m_blocks = (q.length + T::kBlockM - 1) / T::kBlockM;
  Element* dq = static_cast<Element*>(args.dq) + args.dq_stride.offset(q.batch, q.row0, head);
  // As the pre-pass: query blocks x, x + gridDim.x, ... of the sequence.
  for (int m_block = static_cast<int>(blockIdx.x); m_block < m_blocks;
       m_block += static_cast<int>(gridDim.x)) {
    const float4* accum = reinterpret_cast<const float4*>(
        args.dq_accum + (q.ws_row0 + m_block * T::kBlockM) * T::kHeadDim);
    const bool written =
        args.dq_state == nullptr || args.dq_state[q.ws_row0 / T::kBlockM + m_block] > 0;
    for (int i = static_cast<int>(threadIdx.x); i < T::kDqTileFloats / 4;
         i += kPostpassThreads) {
      const float4 v = written ? accum[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      // Chunk c of thread t of warpgroup w: registers 4c .. 4c + 3 of its dQ,
      // rows g and g + 8 of its warp's 16 in row group c / (regs / 4); with
      // parts of their own sizes (T::kDkvUneven, Mainloop::stage_dq), the
      // 8-column group c % groups of row group c / groups of part w.
      constexpr int kChunks = T::kDqRowGroups * T::kDqAccRegs / 4;
      const int t = i % kThreads, chunk = (i / kThreads) % kChunks, w = i / (kThreads * kChunks);
      const int reg = 4 * chunk;
      const int rg = reg / T::kDqAccRegs, in_group = reg % T::kDqAccRegs;
      const int lane = t % 32;
      int row = rg * kMmaM + (t / 32) * 16 + lane / 4;  // in the block
      int col = w * T::kDqCols + 8 * (in_group / 4) + 2 * (lane % 4);
      if constexpr (T::kDkvUneven) {  // parts of their own sizes
        const int index = i / kThreads;
        const int part = index < T::dq_chunks(0) ? 0 : 1;
        const int groups = T::dq_cols(part) / 8, c = index - T::dq_chunk_base(part);
        row = c / groups * kMmaM + (t / 32) * 16 + lane / 4;
        col = T::dq_col_offset(part) + 8 * (c % groups) + 2 * (lane % 4);
      }
      *reinterpret_cast<uint32_t*>(&tile[row * kRowElements + col]) =
          pack2<Element>(v.x * args.softmax_scale, v.y * args.softmax_scale);
      *reinterpret_cast<uint32_t*>(&tile[(row + 8) * kRowElements + col]) =
          pack2<Element>(v.z * args.softmax_scale, v.w * args.softmax_scale);
    }
    __syncthreads();
    const int rows = min(T::kBlockM, q.length - m_block * T::kBlockM);
    for (int i = static_cast<int>(threadIdx.x); i < rows * kPieces; i += kPostpassThreads) {
      const int row = i / kPieces, piece = i % kPieces;
      *reinterpret_cast<uint4*>(dq + static_cast<int64_t>(m_block * T::kBlockM + row) *
                                         args.dq_stride.seq +
                                piece * kPieceElements) =
          *reinterpret_cast<const uint4*>(&tile[row * kRowElements + piece * kPieceElements]);
    }
    __syncthreads();  // the tile is read before the next block writes it
  }
}

// GQA: dK (the main kernel added it already scaled) and dV from their fp32
// sums (batch, heads_k, seqlen_k, headdim; dV's of v's head dim), four
// elements a thread at a time.
struct DkvPostpassArgs {
  const float* dk_accum;
  const float* dv_accum;
  void* dk;
  void* dv;
  flash3::detail::Strides3 dk_stride, dv_stride;
  int seqlen_k;
  int heads_k;
  int64_t rows;  // batch * heads_k * seqlen_k
};

// Quad i (four elements) of a sum of rows of kCols, (batch, head, key)
// ordered: its element offset in the 16-bit tensor of `stride`.
template <int kCols>
__device__ int64_t quad_offset(int64_t i, const flash3::detail::Strides3& stride,
                               const DkvPostpassArgs& args) {
  constexpr int kQuadsPerRow = kCols / 4;
  const int col = static_cast<int>(i % kQuadsPerRow) * 4;
  const int64_t row = i / kQuadsPerRow;  // (batch, head, key)
  const int key = static_cast<int>(row % args.seqlen_k);
  const int64_t batch_head = row / args.seqlen_k;
  const int head = static_cast<int>(batch_head % args.heads_k);
  const int64_t batch = batch_head / args.heads_k;
  return stride.offset(batch, key, head) + col;
}
template <class Element>
__device__ void store_quad(void* out, int64_t offset, float4 x) {
  *reinterpret_cast<uint2*>(static_cast<Element*>(out) + offset) =
      make_uint2(pack2<Element>(x.x, x.y), pack2<Element>(x.z, x.w));
}

template <class T>
__global__ void __launch_bounds__(kPostpassThreads)
    dkv_postpass_kernel(const DkvPostpassArgs args) {
  using Element = typename T::Element;
  const int64_t first = blockIdx.x * static_cast<int64_t>(kPostpassThreads) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kPostpassThreads;
  const int64_t quads = args.rows * (T::kHeadDim / 4);
  if constexpr (T::kHeadDimV == T::kHeadDim) {
    for (int64_t i = first; i < quads; i += step) {
      const float4 k = reinterpret_cast<const float4*>(args.dk_accum)[i];
      const float4 v = reinterpret_cast<const float4*>(args.dv_accum)[i];
      store_quad<Element>(args.dk, quad_offset<T::kHeadDim>(i, args.dk_stride, args), k);
      store_quad<Element>(args.dv, quad_offset<T::kHeadDim>(i, args.dv_stride, args), v);
    }
  } else {  // dV's rows of their own length: a loop each
    for (int64_t i = first; i < quads; i += step) {
      store_quad<Element>(args.dk, quad_offset<T::kHeadDim>(i, args.dk_stride, args),
                          reinterpret_cast<const float4*>(args.dk_accum)[i]);
    }
    const int64_t v_quads = args.rows * (T::kHeadDimV / 4);
    for (int64_t i = first; i < v_quads; i += step) {
      store_quad<Element>(args.dv, quad_offset<T::kHeadDimV>(i, args.dv_stride, args),
                          reinterpret_cast<const float4*>(args.dv_accum)[i]);
    }
  }
}

}  // namespace flash3::sm90::bwd
