// The warp-specialised backward kernel: warp roles, and the dK / dV store.
// One CTA per (key block, query head, batch). Warpgroup 0: warp 0 loads
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
  smem.kv_full.init(1);
#pragma unroll
  for (int s = 0; s < T::kStages; ++s) {
    smem.q_full[s].init(1);  // the producer's arrive_expect_tx
    smem.do_full[s].init(1);
    smem.q_empty[s].init(T::kConsumerThreads);  // every consumer thread
    smem.do_empty[s].init(T::kConsumerThreads);
  }
}

// dK (scaled) and dV of a warpgroup's 64 keys (kDimSplit: its half of the
// head dim of them): straight to the 16-bit
// outputs, or with GQA added into the fp32 sums of the K/V head (after the
// query heads before this one, in deterministic mode).
template <class T>
__device__ void store_dkv(const KernelArgs& args, int n_block, int head, int batch, int head_kv,
                          int warpgroup, float (&dk)[T::kDkvAccRegs],
                          const float (&dv)[T::kDkvAccRegs]) {
  using Element = typename T::Element;
  const FragmentCoord c = FragmentCoord::current();
  const int key0 = n_block * T::kBlockN + T::key_offset(warpgroup) + c.warp * 16 + c.row;
  const int col0 = T::dkv_col_offset(warpgroup) + c.col;
#pragma unroll
  for (int i = 0; i < T::kDkvAccRegs; ++i) {
    dk[i] *= args.softmax_scale;
  }
  const bool gqa = args.heads_per_kv_head > 1;
  if (!gqa) {
    Element* dk_out =
        static_cast<Element*>(args.dk) + args.dk_stride.offset(batch, 0, head) + col0;
    Element* dv_out =
        static_cast<Element*>(args.dv) + args.dv_stride.offset(batch, 0, head) + col0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + 8 * r;
      if (key >= args.seqlen_k) {
        continue;
      }
#pragma unroll
      for (int j = 0; j < T::kDkvCols / 8; ++j) {
        *reinterpret_cast<uint32_t*>(dk_out + key * args.dk_stride.seq + 8 * j) =
            pack2<Element>(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_out + key * args.dv_stride.seq + 8 * j) =
            pack2<Element>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      }
    }
    return;
  }
  const int turn = head - head_kv * args.heads_per_kv_head;  // place in the K/V head's group
  const int64_t batch_head_kv =
      static_cast<int64_t>(batch) * (args.heads_q / args.heads_per_kv_head) + head_kv;
  int* sem = args.dkv_semaphore + batch_head_kv * args.num_n_blocks + n_block;
  const bool first_thread = threadIdx.x == T::kWarpgroupThreads;
  if (args.deterministic) {
    if (first_thread) {
      semaphore_wait(sem, turn);
    }
    named_barrier_sync(NamedBarrier::kBwdDkvStored, T::kConsumerThreads);
  }
  const int64_t base = batch_head_kv * args.seqlen_k;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= args.seqlen_k) {
      continue;
    }
    float* dk_row = args.dk_accum + (base + key) * T::kHeadDim + col0;
    float* dv_row = args.dv_accum + (base + key) * T::kHeadDim + col0;
#pragma unroll
    for (int j = 0; j < T::kDkvCols / 8; ++j) {
      atomicAdd(reinterpret_cast<float2*>(dk_row + 8 * j),
                make_float2(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]));
      atomicAdd(reinterpret_cast<float2*>(dv_row + 8 * j),
                make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]));
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

// The key block of this CTA: blockIdx.x, or in deterministic causal runs the
// last first, the order in which they add into dQ (Mainloop::dq_turn).
template <bool kCausal>
__device__ int key_block_of(const KernelArgs& args) {
  const int x = static_cast<int>(blockIdx.x);
  return kCausal && args.deterministic ? args.num_n_blocks - 1 - x : x;
}

template <class T, bool kCausal>
__global__ void __launch_bounds__(T::kThreads, 1)
    backward_kernel(const __grid_constant__ KernelArgs args) {
  SharedStorage<T>& smem = aligned_shared_storage<SharedStorage<T>, kSmemAlignSlack>();
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / T::kWarpgroupThreads, 0);
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
  const WarpRole role = warpgroup > 0 ? WarpRole::kConsumer
                        : warp == 0   ? WarpRole::kProducer
                        : warp == 1   ? WarpRole::kDqWriter
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

  const int n_block = key_block_of<kCausal>(args);
  const int head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z);
  const Mask<T::kBlockM, T::kBlockN, kCausal> mask{args.seqlen_q, args.seqlen_k};
  Mainloop<T, kCausal> mainloop{smem,
                                args,
                                mask,
                                n_block,
                                head,
                                batch,
                                head / args.heads_per_kv_head,
                                mask.m_block_begin(n_block),
                                args.num_m_blocks};
  if (role != WarpRole::kConsumer) {
    registers_release<T::kProducerRegisters>();
    if (role == WarpRole::kProducer) {
      if (threadIdx.x == 0) {
        mainloop.load_all();
      }
    } else if (role == WarpRole::kDqWriter) {
      mainloop.write_dq_all();
    }
  } else {
    registers_acquire<T::kConsumerRegisters>();
    float dk[T::kDkvAccRegs], dv[T::kDkvAccRegs];
#pragma unroll
    for (int i = 0; i < T::kDkvAccRegs; ++i) {
      dk[i] = 0.0f;
      dv[i] = 0.0f;
    }
    mainloop.compute(warpgroup - 1, dk, dv);
    store_dkv<T>(args, n_block, head, batch, mainloop.head_kv, warpgroup - 1, dk, dv);
  }
}

}  // namespace flash3::sm90::bwd
