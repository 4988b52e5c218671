// The forward epilogue of one consumer warpgroup: normalise O, stage it in
// the warpgroup's own rows of the Q tile (swizzled as TMA expects), store it
// with TMA (rows past seqlen_q are dropped), and write the log-sum-exp.
#pragma once

#include <cstdint>

#include "kernel_args.cuh"
#include "mainloop.cuh"
#include "scheduler.cuh"
#include "softmax.cuh"
#include "sm90/common/sync.cuh"
#include "sm90/common/tma.cuh"

namespace flash3::sm90::fwd {

template <class T>
struct Epilogue {
  using OutElement = typename T::OutElement;
  static constexpr int kBlockM = T::kBlockM;
  static constexpr int kHeadDim = T::kHeadDimV;

  // Byte offset of (row, col) in a swizzled tile of kBlockM rows.
  __device__ static uint32_t swizzled_offset(int row, int col) {
    const int block = col / kSwizzleCols16;
    const int chunk = (col % kSwizzleCols16) / 8;  // 16-byte chunk within the 128-byte row
    return block * kBlockM * kSwizzleRowBytes + row * kSwizzleRowBytes +
           ((chunk ^ (row % 8)) * 16) + (col % 8) * 2;
  }

  // o_units: what the accumulator is in units of (fp8: a V descale; else 1).
  template <class Softmax>
  __device__ static void store(SharedStorage<T>& smem, const KernelArgs& args, const Tile& tile,
                               int warpgroup, const float (&o)[T::kOAccRegs],
                               const Softmax& softmax, float o_units) {
    float inv_sum[Softmax::kRows], lse[Softmax::kRows];
    softmax.finish(inv_sum, lse);
    if constexpr (T::kFp8) {
#pragma unroll
      for (int r = 0; r < Softmax::kRows; ++r) {
        inv_sum[r] *= o_units;
      }
    }

    const FragmentCoord c = FragmentCoord::current();
    const int tile_row0 = warpgroup * kMmaM + c.warp * 16 + c.row;  // row in the CTA tile
    uint8_t* staging = smem.o();
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
      for (int r = 0; r < Softmax::kRows; ++r) {
        const int row = tile_row0 + 8 * r;
        const float lo = o[4 * j + 2 * r] * inv_sum[r];
        const float hi = o[4 * j + 2 * r + 1] * inv_sum[r];
        *reinterpret_cast<uint32_t*>(staging + swizzled_offset(row, 8 * j + c.col)) =
            pack2<OutElement>(lo, hi);
      }
    }
    fence_view_async_shared();
    named_barrier_sync(
        static_cast<NamedBarrier>(static_cast<uint32_t>(NamedBarrier::kEpilogueConsumer0) +
                                  warpgroup),
        T::kWarpgroupThreads);
    const bool leader = threadIdx.x % T::kWarpgroupThreads == 0;
    if (leader) {
#pragma unroll
      for (int b = 0; b < T::kOColBlocks; ++b) {
        tma_store(&args.o, staging + swizzled_offset(warpgroup * kMmaM, b * kSwizzleCols16),
                  b * kSwizzleCols16, tile.m_block * kBlockM + warpgroup * kMmaM, tile.head,
                  tile.batch);
      }
      tma_store_commit();
    }

    if (args.lse != nullptr && c.col == 0) {
      const int64_t row_base =
          (static_cast<int64_t>(tile.batch) * args.heads_q + tile.head) * args.seqlen_q;
#pragma unroll
      for (int r = 0; r < Softmax::kRows; ++r) {
        const int row = tile.m_block * kBlockM + tile_row0 + 8 * r;
        if (row < args.seqlen_q) {
          args.lse[row_base + row] = lse[r];
        }
      }
    }
    if (leader) {
      tma_store_wait_read();  // the Q tile is free once the store has read it
      smem.q_empty.arrive();
    }
  }
};

}  // namespace flash3::sm90::fwd
