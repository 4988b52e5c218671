// The forward epilogue of one consumer warpgroup: normalise O, store it
// (straight from registers, or staged for a TMA store: Traits::kOStore), and
// write the log-sum-exp. For a piece of a tail-split tile (tail_split.hpp)
// it writes the partial O to the workspace instead, or folds the other
// pieces into its own before the store.
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

  // O staged in a V stage (kInVStages) is one warpgroup's rows; else the CTA tile's.
  static constexpr bool kInV = T::kOStore == OStore::kInVStages;
  static constexpr int kStagingRows = kInV ? kMmaM : kBlockM;
  static_assert(!kInV || (T::kStages == 2 && T::kConsumerWarpgroups == 2 && !T::kClusterKv &&
                          !T::kTailSplit && kMmaM * T::kOCols * sizeof(OutElement) <=
                                                sizeof(SharedStorage<T>::v[0])),
                "O in V stages: a stage per warpgroup, each holding its rows; another CTA's "
                "multicast or a piece without a store would not wait for the O store");
  static_assert(T::kOStore != OStore::kInQTile ||
                    kBlockM * T::kOCols * sizeof(OutElement) <= sizeof(SharedStorage<T>::q),
                "O staged in Q: the tile holds O's rows");

  // Byte offset of (row, col) in a swizzled staging tile of kStagingRows rows.
  __device__ static uint32_t swizzled_offset(int row, int col) {
    const int block = col / kSwizzleCols16;
    const int chunk = (col % kSwizzleCols16) / 8;  // 16-byte chunk within the 128-byte row
    return block * kStagingRows * kSwizzleRowBytes + row * kSwizzleRowBytes +
           ((chunk ^ (row % 8)) * 16) + (col % 8) * 2;
  }

  // The tail split's workspace (KernelArgs::partial_o), per CTA: a partial O
  // of every consumer warpgroup (each thread's accumulator registers,
  // register-major so that a warpgroup's accesses are coalesced), its rows'
  // log-sum-exp (two per thread) and one flag per warpgroup. launch.cuh
  // sizes the workspace from these.
  static constexpr int kPartialOFloats = T::kConsumerThreads * T::kOAccRegs;
  static constexpr int kPartialLseFloats = T::kConsumerThreads * 2;
  static constexpr int kPartialFlags = T::kConsumerWarpgroups;

  // o_units: what the accumulator is in units of (fp8: a V descale; else 1).
  // pipe, step: the consumer's ring position after the work and the CTA's
  // step count (kInVStages).
  template <class Softmax>
  __device__ static void store(SharedStorage<T>& smem, const KernelArgs& args,
                               const WorkOf<T>& work,
                               int warpgroup, const PipelineState<T::kStages>& pipe, int step,
                               float (&o)[T::kOAccRegs], const Softmax& softmax, float o_units) {
    const Tile& tile = work.tile;
    float inv_sum[Softmax::kRows], lse[Softmax::kRows];
    softmax.finish(inv_sum, lse);
    if constexpr (T::kFp8) {
#pragma unroll
      for (int r = 0; r < Softmax::kRows; ++r) {
        inv_sum[r] *= o_units;
      }
    }
    if constexpr (T::kTailSplit) {
      if (work.kind == Piece::kPartial) {
        write_partial(smem, args, warpgroup, o, inv_sum, lse);
        return;
      }
      if (work.kind == Piece::kFinal) {
        fold_partials(args, warpgroup, work.partners, o, inv_sum, lse);
      }
    }
    if (args.sinks != nullptr) {
      add_sink(__ldg(args.sinks + tile.head), inv_sum, lse);
    }
    const FragmentCoord c = FragmentCoord::current();
    const int tile_row0 = warpgroup * kMmaM + c.warp * 16 + c.row;  // row in the CTA tile
    if constexpr (T::kOStore == OStore::kDirect) {
      store_direct(args, work, tile_row0, c.col, o, inv_sum);
    } else {
      store_staged(smem, args, tile, warpgroup, pipe, step, tile_row0, o, inv_sum);
    }

    if (args.lse != nullptr && c.col == 0) {
      // (batch, heads_q, seqlen_q), or varlen (heads_q, total_q).
      int64_t row_base;
      int seqlen_q;
      if constexpr (T::kVarlen) {
        row_base = static_cast<int64_t>(tile.head) * args.varlen.total_q + work.q.begin;
        seqlen_q = work.q.length;
      } else {
        row_base = (static_cast<int64_t>(tile.batch) * args.heads_q + tile.head) * args.seqlen_q;
        seqlen_q = args.seqlen_q;
      }
#pragma unroll
      for (int r = 0; r < Softmax::kRows; ++r) {
        const int row = tile.m_block * kBlockM + tile_row0 + 8 * r;
        if (row < seqlen_q) {
          args.lse[row_base + row] = lse[r];
        }
      }
    }
    if constexpr (T::kOStore != OStore::kDirect && !kInV && !T::kDeferOStoreWait) {
      // The staging rows (and the Q tile) are free once the store has read them.
      if (threadIdx.x % T::kWarpgroupThreads == 0) {
        tma_store_wait_read();
        if constexpr (!T::kEarlyQRelease) {
          smem.q_empty.arrive();
        }
      }
    }
  }

  // A learnable sink (ForwardOptions::sinks) in a row's softmax, once its
  // keys are all folded: lse' = log(exp(lse) + exp(sink)), O scaled by
  // exp(lse - lse'); a row that saw no key keeps O = 0 and gets lse' = sink.
  template <int kRows>
  __device__ static void add_sink(float sink, float (&inv_sum)[kRows], float (&lse)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (lse[r] == INFINITY) {
        lse[r] = sink;
        continue;
      }
      const float m = fmaxf(lse[r], sink);
      const float with_sink = m + __logf(__expf(lse[r] - m) + __expf(sink - m));
      inv_sum[r] *= __expf(lse[r] - with_sink);
      lse[r] = with_sink;
    }
  }

  // After a warpgroup's last store: with Traits::kDeferOStoreWait the
  // store's read is waited for only before the next write to the tile
  // (store_staged), so shared memory must outlive the last one.
  __device__ static void finish() {
    if constexpr (T::kDeferOStoreWait) {
      if (threadIdx.x % T::kWarpgroupThreads == 0) {
        tma_store_wait_read();
      }
    }
  }

 private:
  static constexpr int kThreads = T::kWarpgroupThreads;
  __device__ static constexpr NamedBarrier barrier(int warpgroup) {
    return static_cast<NamedBarrier>(static_cast<uint32_t>(NamedBarrier::kEpilogueConsumer0) +
                                     warpgroup);
  }
  // This thread's place in the workspace (kPartial* above: a CTA's share is
  // one slot per consumer warpgroup): its O registers, its two rows'
  // log-sum-exp, the warpgroup's flag.
  __device__ static float* partial_o(const KernelArgs& args, int cta, int warpgroup) {
    const int64_t slot = static_cast<int64_t>(cta) * T::kConsumerWarpgroups + warpgroup;
    return args.partial_o + slot * T::kOAccRegs * kThreads + threadIdx.x % kThreads;
  }
  __device__ static float* partial_lse(const KernelArgs& args, int cta, int warpgroup) {
    return args.partial_lse + (cta * T::kConsumerWarpgroups + warpgroup) * 2 * kThreads +
           threadIdx.x % kThreads;
  }
  __device__ static uint32_t* partial_flag(const KernelArgs& args, int cta, int warpgroup) {
    return args.partial_flags + cta * kPartialFlags + warpgroup;
  }

  // A piece that another CTA finishes: O normalised by this piece's own sum,
  // and its log-sum-exp, in fp32 to this CTA's slot (bypassing L1), then the
  // flag (after every thread of the warpgroup has written).
  __device__ static void write_partial(SharedStorage<T>& smem, const KernelArgs& args,
                                       int warpgroup, const float (&o)[T::kOAccRegs],
                                       const float (&inv_sum)[2], const float (&lse)[2]) {
    const int cta = static_cast<int>(blockIdx.x);
    float* po = partial_o(args, cta, warpgroup);
#pragma unroll
    for (int i = 0; i < T::kOAccRegs; ++i) {
      __stcg(po + i * kThreads, o[i] * inv_sum[acc_row(i)]);
    }
    float* pl = partial_lse(args, cta, warpgroup);
    __stcg(pl, lse[0]);
    __stcg(pl + kThreads, lse[1]);
    named_barrier_sync(barrier(warpgroup), kThreads);
    if (threadIdx.x % kThreads == 0) {
      flag_release(partial_flag(args, cta, warpgroup));
      if constexpr (!T::kEarlyQRelease) {
        smem.q_empty.arrive();  // nothing was staged in Q
      }
    }
  }

  // The tile's first piece, done last: waits for the pieces of the next
  // `partners` CTAs of its rank, and folds them in by their log-sum-exps.
  // On return O is normalised (inv_sum 1) and lse is the whole row's.
  __device__ static void fold_partials(const KernelArgs& args, int warpgroup, int partners,
                                       float (&o)[T::kOAccRegs], float (&inv_sum)[2],
                                       float (&lse)[2]) {
    const int first = static_cast<int>(blockIdx.x) + args.group_ctas;
    if (threadIdx.x % kThreads == 0) {
      for (int j = 0; j < partners; ++j) {
        flag_acquire(partial_flag(args, first + j * args.group_ctas, warpgroup));
      }
    }
    named_barrier_sync(barrier(warpgroup), kThreads);
    // A piece whose keys a row does not see has log-sum-exp +inf (finish()):
    // it weighs nothing. A row no piece has a key for stays empty.
    const auto live = [](float l) { return l == INFINITY ? -INFINITY : l; };
    const auto weight = [](float l, float whole) {
      return l == INFINITY || whole == -INFINITY ? 0.0f : expf(l - whole);
    };
    float top[2] = {live(lse[0]), live(lse[1])};
    for (int j = 0; j < partners; ++j) {
      const float* pl = partial_lse(args, first + j * args.group_ctas, warpgroup);
      top[0] = fmaxf(top[0], live(__ldcg(pl)));
      top[1] = fmaxf(top[1], live(__ldcg(pl + kThreads)));
    }
    float sum[2] = {weight(lse[0], top[0]), weight(lse[1], top[1])};
    for (int j = 0; j < partners; ++j) {
      const float* pl = partial_lse(args, first + j * args.group_ctas, warpgroup);
      sum[0] += weight(__ldcg(pl), top[0]);
      sum[1] += weight(__ldcg(pl + kThreads), top[1]);
    }
    float whole[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      whole[r] = top[r] == -INFINITY ? -INFINITY : top[r] + logf(sum[r]);
      inv_sum[r] *= weight(lse[r], whole[r]);
    }
#pragma unroll
    for (int i = 0; i < T::kOAccRegs; ++i) {
      o[i] *= inv_sum[acc_row(i)];
    }
    for (int j = 0; j < partners; ++j) {
      const int cta = first + j * args.group_ctas;
      const float* pl = partial_lse(args, cta, warpgroup);
      const float w[2] = {weight(__ldcg(pl), whole[0]), weight(__ldcg(pl + kThreads), whole[1])};
      const float* po = partial_o(args, cta, warpgroup);
#pragma unroll
      for (int i = 0; i < T::kOAccRegs; ++i) {
        o[i] += w[acc_row(i)] * __ldcg(po + i * kThreads);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      inv_sum[r] = 1.0f;
      lse[r] = whole[r] == -INFINITY ? INFINITY : whole[r];
    }
  }

  // Each thread's (row, 2 columns) pairs straight to global memory; a quad
  // writes 16 contiguous bytes per row and column group.
  // Rows past the sequence's end are not stored (varlen: they are the next
  // sequence's).
  __device__ static void store_direct(const KernelArgs& args, const WorkOf<T>& work,
                                      int tile_row0, int col, const float (&o)[T::kOAccRegs],
                                      const float (&inv_sum)[2]) {
    const Tile& tile = work.tile;
    if constexpr (T::kVarlen) {
      store_rows(args.out, work.q.begin * args.out_seq_stride + tile.head * args.out_head_stride,
                 args.out_seq_stride, work.q.length, tile, tile_row0, col, o, inv_sum);
    } else {
      // (Its own expression: computed through store_rows, the batch's offset
      // moved ptxas's allocation of the kernels that store directly.)
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
          *reinterpret_cast<uint32_t*>(out_row + 8 * j) = pack2<OutElement>(
              o[4 * j + 2 * r] * inv_sum[r], o[4 * j + 2 * r + 1] * inv_sum[r]);
        }
      }
    }
  }
  __device__ static void store_rows(void* out_data, int64_t base, int64_t seq_stride, int seqlen,
                                    const Tile& tile, int tile_row0, int col,
                                    const float (&o)[T::kOAccRegs], const float (&inv_sum)[2]) {
    OutElement* out = static_cast<OutElement*>(out_data) + base + col;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = tile.m_block * kBlockM + tile_row0 + 8 * r;
      if (row >= seqlen) {
        continue;
      }
      OutElement* out_row = out + row * seq_stride;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
            pack2<OutElement>(o[4 * j + 2 * r] * inv_sum[r], o[4 * j + 2 * r + 1] * inv_sum[r]);
      }
    }
  }

  // kInVStages: a warpgroup stages O in the V stage of its own index (so no
  // two warpgroups ever write the same bytes), once every consumer has read
  // that stage's last fill and the O staged there in the previous step has
  // been stored (one O per stage per step, so o_read is one or none behind).
  // A stage's last fill was read in the current lap of the ring if it lies
  // before `pipe`, else in the previous one.
  __device__ static void wait_v_stage_free(SharedStorage<T>& smem, int stage,
                                           const PipelineState<T::kStages>& pipe, int step) {
    smem.v_empty[stage].wait(stage < pipe.stage ? pipe.phase : pipe.phase ^ 1u);
    if (step > 0) {
      smem.o_read[stage].wait((step - 1) & 1);
    }
  }

  // Through the warpgroup's rows of the O staging tile (swizzled as TMA
  // expects) and a TMA store; rows past seqlen_q are dropped by TMA.
  __device__ static void store_staged(SharedStorage<T>& smem, const KernelArgs& args,
                                      const Tile& tile, int warpgroup,
                                      const PipelineState<T::kStages>& pipe, int step,
                                      int tile_row0, const float (&o)[T::kOAccRegs],
                                      const float (&inv_sum)[2]) {
    const bool leader = threadIdx.x % T::kWarpgroupThreads == 0;
    // The staging tile holds the CTA tile's rows, or (kInV) this warpgroup's.
    const int store_row0 = kInV ? 0 : warpgroup * kMmaM;
    const int row0 = tile_row0 - warpgroup * kMmaM + store_row0;
    uint8_t* staging;
    if constexpr (kInV) {
      wait_v_stage_free(smem, warpgroup, pipe, step);
      staging = reinterpret_cast<uint8_t*>(smem.v[warpgroup]);
    } else {
      staging = smem.o();
    }
    if constexpr (T::kEarlyQRelease && !kInV) {
      // The Q tile's barriers no longer order this write after the previous
      // tile's store: its leader waits for that store's read (here, or right
      // after the store: Traits::kDeferOStoreWait); all wait for the leader.
      if (T::kDeferOStoreWait && leader) {
        tma_store_wait_read();
      }
      named_barrier_sync(barrier(warpgroup), kThreads);
    }
    // stmatrix, two 8-column groups of the warp's 16 rows at a time: tiles
    // (rows 0-7, group j), (8-15, j), (0-7, j + 1), (8-15, j + 1); lane l
    // addresses row l % 8 + 8 ((l / 8) % 2) of group j + l / 16.
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int st_row = row0 - lane / 4 + lane % 8 + 8 * ((lane / 8) % 2);
    const uint32_t staging_addr = smem_u32(staging);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; j += 2) {
      uint32_t p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int g = j + i / 2, r = i % 2;  // tile i: column group g, rows 8r..
        p[i] = pack2<OutElement>(o[4 * g + 2 * r] * inv_sum[r], o[4 * g + 2 * r + 1] * inv_sum[r]);
      }
      stmatrix_x4(staging_addr + swizzled_offset(st_row, 8 * (j + lane / 16)), p[0], p[1], p[2],
                  p[3]);
    }
    fence_view_async_shared();
    named_barrier_sync(barrier(warpgroup), kThreads);
    if (leader) {
#pragma unroll
      for (int b = 0; b < T::kOColBlocks; ++b) {
        tma_store(&args.o, staging + swizzled_offset(store_row0, b * kSwizzleCols16),
                  b * kSwizzleCols16, tile.m_block * kBlockM + warpgroup * kMmaM, tile.head,
                  tile.batch);
      }
      tma_store_commit();
      if constexpr (kInV) {
        tma_store_wait_read();
        smem.o_read[warpgroup].arrive();
      }
    }
  }
};

}  // namespace flash3::sm90::fwd
