// The warp-specialised backward kernel: warp roles, and the dK / dV store.
// One CTA per (key block, query head, batch), or (varlen) per key block of
// any sequence and query head. Warpgroup 0: warp 0 loads
// (TMA), warp 1 adds dQ into the workspace; warpgroups 1 and 2 each own 64
// keys of the block and keep their dK and dV in registers across the query
// blocks.
#pragma once

#include "kernel_args.cuh"
#include "mainloop.cuh"
#include "sm90/common/fragment.cuh"
#include "sm90/common/mask.cuh"
#include "sm90/common/shared_memory.cuh"
#include "traits.cuh"

namespace flash3::sm90::bwd {

enum class WarpRole { kProducer, kDqWriter, kIdle, kConsumer };

template <class T>
__device__ void init_barriers(SharedStorage<T>& smem) {
  smem.k_full.init(1);
  smem.v_full.init(1);
#pragma unroll
  for (int s = 0; s < T::kStages; ++s) {
    smem.q_full[s].init(1);  // the producer's arrive_expect_tx
    smem.do_full[s].init(1);
    smem.q_empty[s].init(T::kConsumerThreads);  // every consumer thread
    smem.do_empty[s].init(T::kConsumerThreads);
  }
}

// dK (scaled) and dV of a warpgroup's 64 keys (kDimSplit: its part of the
// head dim of them): straight to the 16-bit
// outputs, or with GQA added into the fp32 sums of the K/V head (after the
// query heads before this one, in deterministic mode).
template <class T, bool kVarlen>
__device__ void store_dkv(const KernelArgs& args, const KeyBlock& blk, int warpgroup,
                          float (&dk)[T::kDkvAccRegs], const float (&dv)[T::kDvAccRegs]) {
  using Element = typename T::Element;
  const FragmentCoord c = FragmentCoord::current();
  const int key0 = blk.n_block * T::kBlockN + T::key_offset(warpgroup) + c.warp * 16 + c.row;
  const int col0 = T::dkv_col_offset(warpgroup) + c.col;
  const int cols = T::dkv_cols(warpgroup);  // T::kDkvUneven: fewer than the registers hold
  const int v_col0 = T::dv_col_offset(warpgroup) + c.col;  // dV's, as dK's over kHeadDimV
  const int v_cols = T::dv_cols(warpgroup);
  // One loop over both's 8-column groups (kGroups, the larger count).
  constexpr int kGroups = (T::kDkvCols > T::kDvCols ? T::kDkvCols : T::kDvCols) / 8;
#pragma unroll
  for (int i = 0; i < T::kDkvAccRegs; ++i) {
    dk[i] *= args.softmax_scale;
  }
  const bool gqa = args.heads_per_kv_head > 1;
  if (!gqa) {
    Element* dk_out = static_cast<Element*>(args.dk) +
                      args.dk_stride.offset(blk.q.batch, blk.k_row0, blk.head) + col0;
    Element* dv_out = static_cast<Element*>(args.dv) +
                      args.dv_stride.offset(blk.q.batch, blk.k_row0, blk.head) + v_col0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + 8 * r;
      if (key >= blk.seqlen_k) {
        continue;
      }
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        if (j < T::kDkvCols / 8 && !(T::kDkvUneven && 8 * j >= cols)) {
          *reinterpret_cast<uint32_t*>(dk_out + key * args.dk_stride.seq + 8 * j) =
              pack2<Element>(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]);
        }
        if (j < T::kDvCols / 8 && !(T::kDvUneven && 8 * j >= v_cols)) {
          *reinterpret_cast<uint32_t*>(dv_out + key * args.dv_stride.seq + 8 * j) =
              pack2<Element>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
        }
      }
    }
    return;
  }
  const int turn = blk.head - blk.head_kv * args.heads_per_kv_head;  // place in the group
  const int heads_k = args.heads_q / args.heads_per_kv_head;
  // The key block's semaphore: per (batch, head_k, key block); varlen per
  // (head_k, key block among all the sequences'), the CTA's x.
  int* sem = args.dkv_semaphore +
             (kVarlen ? static_cast<int64_t>(blk.head_kv) * args.num_n_blocks + blockIdx.x
                      : (static_cast<int64_t>(blk.q.batch) * heads_k + blk.head_kv) *
                                args.num_n_blocks +
                            blk.n_block);
  const bool first_thread = threadIdx.x == T::kWarpgroupThreads;
  if (args.deterministic) {
    if (first_thread) {
      semaphore_wait(sem, turn);
    }
    named_barrier_sync(NamedBarrier::kBwdDkvStored, T::kConsumerThreads);
  }
  // The sums are (batch, head_k, seqlen_k, headdim); varlen: batch 1 of total_k keys.
  const int64_t base =
      (static_cast<int64_t>(blk.q.batch) * heads_k + blk.head_kv) * args.seqlen_k + blk.k_row0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= blk.seqlen_k) {
      continue;
    }
    float* dk_row = args.dk_accum + (base + key) * T::kHeadDim + col0;
    float* dv_row = args.dv_accum + (base + key) * T::kHeadDimV + v_col0;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if (j < T::kDkvCols / 8 && !(T::kDkvUneven && 8 * j >= cols)) {
        atomicAdd(reinterpret_cast<float2*>(dk_row + 8 * j),
                  make_float2(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]));
      }
      if (j < T::kDvCols / 8 && !(T::kDvUneven && 8 * j >= v_cols)) {
        atomicAdd(reinterpret_cast<float2*>(dv_row + 8 * j),
                  make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]));
      }
    }
  }
  if (args.deterministic) {
    __threadfence();
    named_barrier_sync(NamedBarrier::kBwdDkvStored, T::kConsumerThreads);
    if (first_thread) {
      semaphore_signal(sem, turn + 1);
    }
  }
}

// dK (scaled) and dV through shared memory and TMA stores (dense, without
// GQA: KernelArgs::dkv_tma): once both consumer warpgroups are done with the
// K and V tiles (the dQ GEMM reads all of K), each writes its rows (or
// kDimSplit: its columns) of dK into the K tile and of dV into the V tile
// with stmatrix, in the tiles' swizzled layout; then one thread stores every
// column block of both (TMA drops the rows past seqlen_k and the columns
// past the head dim) and waits until they are read. Against 64 four-byte
// stores a thread straight from registers (store_dkv): the short sequences'
// CTAs spent a quarter of their time there (design.md).
template <class T>
__device__ void store_dkv_tma(SharedStorage<T>& smem, const KernelArgs& args, const KeyBlock& blk,
                              int warpgroup, float (&dk)[T::kDkvAccRegs],
                              const float (&dv)[T::kDvAccRegs]) {
  using Element = typename T::Element;
  named_barrier_sync(NamedBarrier::kBwdDkvStored, T::kConsumerThreads);
  const FragmentCoord c = FragmentCoord::current();
  const int lane = static_cast<int>(threadIdx.x % 32);
  // stmatrix, two 8-column groups of the warp's 16 rows at a time (as the
  // mainloop's dS^T tile): lane l addresses row l % 8 + 8 ((l / 8) % 2) of
  // column group j + l / 16.
  const int st_row = T::key_offset(warpgroup) + c.warp * 16 + lane % 8 + 8 * ((lane / 8) % 2);
  const auto stage = [&](const auto& acc, Element* tile, int col0, int cols, float scale) {
    constexpr int kGroups = sizeof(acc) / sizeof(acc[0]) / 4;
#pragma unroll
    for (int j = 0; j < kGroups; j += 2) {
      if (8 * j >= cols) {
        break;
      }
      uint32_t x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int g = j + i / 2, r = i % 2;  // matrix i: column group g, rows 8r..
        x[i] = pack2<Element>(acc[4 * g + 2 * r] * scale, acc[4 * g + 2 * r + 1] * scale);
      }
      stmatrix_x4(smem_u32(tile) + tile_offset16<T::kBlockN>(st_row, col0 + 8 * (j + lane / 16)),
                  x[0], x[1], x[2], x[3]);
    }
  };
  stage(dk, smem.k, T::dkv_col_offset(warpgroup), T::dkv_cols(warpgroup), args.softmax_scale);
  stage(dv, smem.v, T::dv_col_offset(warpgroup), T::dv_cols(warpgroup), 1.0f);
  fence_view_async_shared();
  named_barrier_sync(NamedBarrier::kBwdDkvStored, T::kConsumerThreads);
  if (threadIdx.x == T::kWarpgroupThreads) {
    const int row = blk.n_block * T::kBlockN;
#pragma unroll
    for (int b = 0; b < T::kColBlocks; ++b) {
      tma_store(&args.dk_map, smem.k + b * T::kBlockN * T::kSwizzleCols, b * T::kSwizzleCols, row,
                blk.head_kv, blk.q.batch);
    }
#pragma unroll
    for (int b = 0; b < T::kColBlocksV; ++b) {
      tma_store(&args.dv_map, smem.v + b * T::kBlockN * T::kSwizzleCols, b * T::kSwizzleCols, row,
                blk.head_kv, blk.q.batch);
    }
    tma_store_commit();
    tma_store_wait_read();
  }
}

// This CTA's key block, or false when it has none (varlen: past the last
// sequence's). In deterministic causal runs the key blocks of a sequence
// go last first, the order in which they add into dQ (Mainloop::dq_turn),
// so that the CTAs start in it too and none waits for one that cannot start.
template <class T, bool kCausal, bool kVarlen>
__device__ bool block_of(const KernelArgs& args, KeyBlock* blk) {
  const int x = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int head_kv = head / args.heads_per_kv_head;
  const bool reversed = kCausal && args.deterministic;
  if constexpr (kVarlen) {
    const VarlenSequences& varlen = args.varlen;
    if (x >= varlen.block_prefix[varlen.batch]) {
      return false;
    }
    const VarlenTile tile = VarlenTiles{varlen.block_prefix, varlen.batch, 1}.tile(x);
    const SeqRange k = seq_range(varlen.cu_seqlens_k, varlen.seqused_k, tile.batch,
                                 varlen.total_k);
    *blk = {reversed ? tile.m_blocks - 1 - tile.m_block : tile.m_block,
            head,
            head_kv,
            query_rows(varlen, tile.batch, head, args.heads_q, args.seqlen_q,
                       args.padded_seqlen_q, T::kBlockM),
            k.begin,
            k.length};
  } else {
    const int batch = static_cast<int>(blockIdx.z);
    const int n_block = reversed ? args.num_n_blocks - 1 - x : x;
    *blk = {n_block,
            head,
            head_kv,
            query_rows(VarlenSequences{}, batch, head, args.heads_q, args.seqlen_q,
                       args.padded_seqlen_q, T::kBlockM),
            0,
            args.seqlen_k};
  }
  return true;
}

// The CTA's shared storage: in the shared address space, or (Traits::
// kSharedSpace false) through the generic address of its aligned base.
template <class T>
__device__ __forceinline__ SharedStorage<T>& storage() {
  if constexpr (T::kSharedSpace) {
    return shared_space_storage<SharedStorage<T>, kSmemAlignSlack>();
  } else {
    return aligned_shared_storage<SharedStorage<T>, kSmemAlignSlack>();
  }
}

// kLocal: the local variants of the masked kernels (mask.cuh, fwd/traits.cuh).
template <class T, bool kCausal, bool kVarlen, bool kLocal>
__global__ void __launch_bounds__(T::kThreads, 1)
    backward_kernel(const __grid_constant__ KernelArgs args) {
  KeyBlock blk;
  if (!block_of<T, kCausal, kVarlen>(args, &blk)) {
    return;  // the whole CTA, before any barrier
  }
  SharedStorage<T>& smem = storage<T>();
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / T::kWarpgroupThreads, 0);
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
  const WarpRole role = warpgroup > 0 ? WarpRole::kConsumer
                        : warp == 0   ? WarpRole::kProducer
                        : warp <= Mainloop<T, kCausal, kLocal>::kDqWriters ? WarpRole::kDqWriter
                                                                           : WarpRole::kIdle;
  if (threadIdx.x == 0) {
    init_barriers(smem);
    tma_prefetch_descriptor(&args.q);
    tma_prefetch_descriptor(&args.dout);
    tma_prefetch_descriptor(&args.k);
    tma_prefetch_descriptor(&args.v);
  }
  fence_barrier_init();
  __syncthreads();

  const Mask<T::kBlockM, T::kBlockN, kCausal, kLocal> mask{blk.q.length, blk.seqlen_k,
                                                   args.window_left, args.window_right,
                                                   args.chunk};
  // Dense: the kernel's parameter, not a register live across the loop (the
  // masked kernels: the window's, which is that without a left side).
  Mainloop<T, kCausal, kLocal> mainloop{smem,
                                args,
                                mask,
                                blk,
                                mask.m_block_begin(blk.n_block),
                                kCausal ? mask.m_block_end(blk.n_block)
                                : kVarlen ? mask.num_m_blocks()
                                          : args.num_m_blocks};
  mainloop.stagger_start();
  if (role != WarpRole::kConsumer) {
    registers_release<T::kProducerRegisters>();
    if (role == WarpRole::kProducer) {
      if (threadIdx.x == 0) {
        mainloop.load_all();
      }
    } else if (role == WarpRole::kDqWriter) {
      mainloop.write_dq_all(warp - 1);
    }
  } else {
    registers_acquire<T::kConsumerRegisters>();
    float dk[T::kDkvAccRegs], dv[T::kDvAccRegs];
#pragma unroll
    for (int i = 0; i < T::kDkvAccRegs; ++i) {
      dk[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < T::kDvAccRegs; ++i) {
      dv[i] = 0.0f;
    }
    mainloop.compute(warpgroup - 1, dk, dv);
    if (!kVarlen && args.dkv_tma) {
      store_dkv_tma(smem, args, blk, warpgroup - 1, dk, dv);
    } else {
      store_dkv<T, kVarlen>(args, blk, warpgroup - 1, dk, dv);
    }
  }
}

}  // namespace flash3::sm90::bwd
