// The forward epilogue of one consumer warpgroup: normalise O, store it
// (straight from registers, or staged for a TMA store: Traits::kOStore), and
// write the log-sum-exp.
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
    if constexpr (T::kOStore == OStore::kDirect) {
      store_direct(args, tile, tile_row0, c.col, o, inv_sum);
    } else {
      store_staged(smem, args, tile, warpgroup, tile_row0, c.col, o, inv_sum);
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
    if constexpr (T::kOStore != OStore::kDirect) {
      // The staging rows (and the Q tile) are free once the store has read them.
      if (threadIdx.x % T::kWarpgroupThreads == 0) {
        tma_store_wait_read();
        if constexpr (!T::kEarlyQRelease) {
          smem.q_empty.arrive();
        }
      }
    }
  }

 private:
  // Each thread's (row, 2 columns) pairs straight to global memory; a quad
  // writes 16 contiguous bytes per row and column group.
  __device__ static void store_direct(const KernelArgs& args, const Tile& tile, int tile_row0,
                                      int col, const float (&o)[T::kOAccRegs],
                                      const float (&inv_sum)[2]) {
    OutElement* out = static_cast<OutElement*>(args.out) + tile.batch * args.out_batch_stride +
                      tile.head * args.out_head_stride + col;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = tile.m_block * kBlockM + tile_row0 + 8 * r;
      if (row >= args.seqlen_q) {
        continue;
      }
      OutElement* out_row = out + row * args.out_seq_stride;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
            pack2<OutElement>(o[4 * j + 2 * r] * inv_sum[r], o[4 * j + 2 * r + 1] * inv_sum[r]);
      }
    }
  }

  // Through the warpgroup's rows of the O staging tile (swizzled as TMA
  // expects) and a TMA store; rows past seqlen_q are dropped by TMA.
  __device__ static void store_staged(SharedStorage<T>& smem, const KernelArgs& args,
                                      const Tile& tile, int warpgroup, int tile_row0, int col,
                                      const float (&o)[T::kOAccRegs],
                                      const float (&inv_sum)[2]) {
    const NamedBarrier barrier = static_cast<NamedBarrier>(
        static_cast<uint32_t>(NamedBarrier::kEpilogueConsumer0) + warpgroup);
    const bool leader = threadIdx.x % T::kWarpgroupThreads == 0;
    if constexpr (T::kEarlyQRelease) {
      // The Q tile's barriers no longer order this write after the previous
      // tile's store: the leader has waited for that store's read; all wait for it.
      named_barrier_sync(barrier, T::kWarpgroupThreads);
    }
    uint8_t* staging = smem.o();
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = tile_row0 + 8 * r;
        *reinterpret_cast<uint32_t*>(staging + swizzled_offset(row, 8 * j + col)) =
            pack2<OutElement>(o[4 * j + 2 * r] * inv_sum[r], o[4 * j + 2 * r + 1] * inv_sum[r]);
      }
    }
    fence_view_async_shared();
    named_barrier_sync(barrier, T::kWarpgroupThreads);
    if (leader) {
#pragma unroll
      for (int b = 0; b < T::kOColBlocks; ++b) {
        tma_store(&args.o, staging + swizzled_offset(warpgroup * kMmaM, b * kSwizzleCols16),
                  b * kSwizzleCols16, tile.m_block * kBlockM + warpgroup * kMmaM, tile.head,
                  tile.batch);
      }
      tma_store_commit();
    }
  }
};

}  // namespace flash3::sm90::fwd
