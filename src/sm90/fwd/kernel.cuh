// The warp-specialised persistent forward kernel: warp roles only.
// Warpgroup 0 is the producer (one thread issues every TMA load, the rest
// idle on few registers); warpgroups 1.. are consumers, each owning 64 query
// rows of every tile (or piece of one) the scheduler hands this CTA. (The
// warp-specialization ablation has consumers only: Traits::kWarpSpecialized.)
#pragma once

#include "epilogue.cuh"
#include "kernel_args.cuh"
#include "mainloop.cuh"
#include "sm90/common/mask.cuh"
#include "scheduler.cuh"
#include "sm90/common/shared_memory.cuh"
#include "softmax.cuh"
#include "traits.cuh"

namespace flash3::sm90::fwd {

enum class WarpRole { kProducer, kConsumer };

template <class T>
__device__ __forceinline__ SharedStorage<T>& shared_storage() {
  return aligned_shared_storage<SharedStorage<T>, kSmemAlignSlack>();
}

template <class T>
__device__ void init_barriers(SharedStorage<T>& smem) {
  smem.q_full.init(1);
  smem.q_empty.init(T::kQReleaseArrivals);
  // Every consumer thread of every CTA that reads what this CTA's producer
  // writes arrives on "empty" (Mainloop::release).
  const uint32_t releases = T::kConsumerThreads * (T::kClusterKv ? cluster_size() : 1);
#pragma unroll
  for (int s = 0; s < T::kStages; ++s) {
    smem.k_full[s].init(1);  // the producer's arrive_expect_tx
    smem.v_full[s].init(1);
    smem.k_empty[s].init(releases);
    smem.v_empty[s].init(releases);
    if constexpr (T::kOStore == OStore::kInVStages) {
      smem.o_read[s].init(1);
    }
  }
}

// The kernel's tail split (tail_split.hpp); empty where Traits::kTailSplit
// is off, so that those kernels compute none of it.
template <class T, bool kCausal, class Mask>
__device__ TailSchedule tail_schedule(const KernelArgs& args, const Mask& mask) {
  if constexpr (T::kTailSplit) {
    return {kCausal, args.num_tiles, static_cast<int>(gridDim.x), args.group_ctas,
            kCausal ? args.num_m_blocks : mask.n_block_end(0), args.split};
  } else {
    return {};
  }
}

// Varlen and KV-cache kernels schedule with the tile scheduler plus their
// sequences (VarlenTileScheduler, KvCacheTileScheduler); the others with the
// TileScheduler itself, as constructed (a copy of it moved ptxas's
// allocation of those kernels).
struct DenseSequences {};
template <class T>
__device__ auto sequences_scheduler(const TileScheduler& tiles, const KernelArgs& args) {
  if constexpr (T::kVarlen) {
    return VarlenTileScheduler{tiles, args.varlen};
  } else if constexpr (T::kKvCache) {
    return KvCacheTileScheduler{tiles, args.cache};
  } else {
    return DenseSequences{};
  }
}
template <class T, class Sequences>
__device__ const SchedulerOf<T>& scheduler_of(const TileScheduler& tiles,
                                              const Sequences& sequences) {
  if constexpr (T::kVarlen || T::kKvCache) {
    return sequences;
  } else {
    return tiles;
  }
}

template <class T, bool kCausal>
__global__ void __launch_bounds__(T::kThreads, 1) forward_kernel(const __grid_constant__ KernelArgs args) {
  SharedStorage<T>& smem = shared_storage<T>();
  const int warpgroup = T::kUniformWarpgroupIndex
                            ? __shfl_sync(0xffffffffu, threadIdx.x / T::kWarpgroupThreads, 0)
                            : static_cast<int>(threadIdx.x / T::kWarpgroupThreads);
  const WarpRole role =
      T::kWarpSpecialized && warpgroup == 0 ? WarpRole::kProducer : WarpRole::kConsumer;

  if (threadIdx.x == 0) {
    init_barriers(smem);
    tma_prefetch_descriptor(&args.q);
    tma_prefetch_descriptor(&args.k);
    tma_prefetch_descriptor(&args.v);
    tma_prefetch_descriptor(&args.o);
  }
  fence_barrier_init();
  if constexpr (T::kClusterKv) {
    cluster_sync();  // the other CTA's barriers are ready before its loads and arrivals
  } else {
    __syncthreads();
  }

  const Mask<T::kBlockM, T::kBlockN, kCausal, T::kLocal> mask{args.seqlen_q, args.seqlen_k,
                                                   args.window_left, args.window_right,
                                                   args.chunk};
  const TileScheduler tiles = [&] {
    if constexpr (T::kLocalUnits) {
      return TileScheduler{args.num_m_blocks, args.heads_q,    args.by_m_blocks,
                           args.by_heads_q,   args.num_tiles,  {},
                           args.local_units,  args.by_local_units};
    } else {
      return TileScheduler{args.num_m_blocks, args.heads_q, args.by_m_blocks, args.by_heads_q,
                           args.num_tiles, tail_schedule<T, T::kCausalPairs>(args, mask)};
    }
  }();
  const auto sequences = sequences_scheduler<T>(tiles, args);
  const SchedulerOf<T>& scheduler = scheduler_of<T>(tiles, sequences);
  Mainloop<T, kCausal> mainloop{smem, args, scheduler, mask};
  typename Mainloop<T, kCausal>::Pipeline pipe;

  if (role == WarpRole::kProducer) {
    registers_release<T::kProducerRegisters>();
    if (threadIdx.x == 0) {
      mainloop.load_all();
    }
  } else {
    if constexpr (T::kWarpSpecialized) {
      registers_acquire<T::kConsumerRegisters>();
    } else {
      mainloop.loads = mainloop.first_load();  // thread 0's; the others never use it
    }
    const int consumer = warpgroup - T::kProducerWarpgroups;
    mainloop.start_turns(consumer);
    WorkOf<T> work;
    constexpr bool kPairs = T::kCausalPairs;
    constexpr bool kUnits = T::kLocalUnits;
    for (auto at = scheduler.template begin<kPairs, kUnits>();
         scheduler.template work<kPairs, T::kTailSplit>(at, mask, work);
         scheduler.template advance<kPairs, kUnits>(at)) {
      float o[T::kOAccRegs];
#pragma unroll
      for (int r = 0; r < T::kOAccRegs; ++r) {
        o[r] = 0.0f;
      }
      typename Mainloop<T, kCausal>::Softmax softmax;
      float o_units = 1.0f;  // fp8: O is in units of a V descale
      mainloop.compute(work, consumer, pipe, at.step, o, softmax, o_units);
      Epilogue<T>::store(smem, args, work, consumer, pipe, at.step, o, softmax, o_units);
    }
    Epilogue<T>::finish();
  }
}

}  // namespace flash3::sm90::fwd
