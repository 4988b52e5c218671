// Synchronisation primitives of the Hopper kernels: mbarriers (transaction
// barriers that TMA completes), named barriers between warpgroups, and the
// register reallocation of warp-specialised kernels.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

namespace flash3::sm90 {

// An mbarrier in shared memory: a phase completes when `count` arrivals and
// all expected transaction bytes have landed.
struct Mbarrier {
  uint64_t word;

  __device__ void init(uint32_t count) { cutlass::arch::ClusterBarrier::init(&word, count); }
  // Producer side: one arrival that also announces `bytes` of TMA traffic.
  __device__ void arrive_expect_tx(uint32_t bytes) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&word, bytes);
  }
  __device__ void arrive() { cutlass::arch::ClusterBarrier::arrive(&word); }
  // One arrival on the barrier at this one's offset in CTA `cta` of the
  // cluster, if `pred` (a predicated instruction, not a branch).
  __device__ void arrive_at(uint32_t cta, bool pred) {
    cutlass::arch::ClusterBarrier::arrive(&word, cta, pred ? 1u : 0u);
  }
  // Blocks until the phase of the given parity has completed.
  __device__ void wait(uint32_t parity) { cutlass::arch::ClusterBarrier::wait(&word, parity); }
  // Whether it has, without waiting.
  __device__ bool test_wait(uint32_t parity) {
    return cutlass::arch::ClusterBarrier::test_wait(&word, parity, 1u);
  }
};

// Makes barrier initialisation visible to the async proxy (TMA) and the other warps.
__device__ inline void fence_barrier_init() { cutlass::arch::fence_barrier_init(); }

// Thread block clusters: this CTA's rank and the cluster's size (1 when the
// kernel is launched without clusters), and a barrier over every thread of
// the cluster (release / acquire: shared-memory writes before it, barrier
// initialisation among them, are visible to the cluster after it).
__device__ inline uint32_t cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));  // constant: no volatile
  return r;
}
__device__ inline uint32_t cluster_size() {
  uint32_t n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// Named hardware barriers (bar.sync). Id 0 is __syncthreads; every other use
// has a name here.
enum class NamedBarrier : uint32_t {
  kEpilogueConsumer0 = 1,  // the threads of consumer warpgroup 0 before its TMA store
  kEpilogueConsumer1 = 2,
  kEpilogueConsumer2 = 3,
  kSchedulerConsumer0 = 4,  // ping-pong: consumer warpgroup 0 may issue its GEMMs
  kSchedulerConsumer1 = 5,
  kSchedulerConsumer2 = 6,
  // Backward (bwd/mainloop.cuh): both consumer warpgroups' dS tiles are in
  // shared memory; the dQ tile is staged (consumers -> dQ writer) and free
  // again (writer -> consumers), one pair per dQ writer warp (the steps of
  // even and of odd rank); the GQA dK/dV hand-off in deterministic mode.
  kBwdDsReady = 7,
  kBwdDqFull0 = 8,
  kBwdDqEmpty0 = 9,
  kBwdDkvStored = 10,
  kBwdPReady = 11,  // kDimSplit: warpgroup 0's P^T tile is in shared memory
  kBwdDqPartial = 12,  // kDqKeySplit: warpgroup 0's partial dQ is staged
  kBwdDqFull1 = 13,
  kBwdDqEmpty1 = 14,
  kScheduleFence = 15,  // one warp arrives, nobody waits: see schedule_after()
};

__device__ inline void named_barrier_sync(NamedBarrier id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(static_cast<uint32_t>(id)), "r"(num_threads) : "memory");
}

__device__ inline void named_barrier_arrive(NamedBarrier id, uint32_t num_threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(static_cast<uint32_t>(id)), "r"(num_threads) : "memory");
}

// A flag in global memory between CTAs (the tail split's partial outputs):
// the writer's release publishes what its warpgroup wrote before a named
// barrier (fence.acq_rel then a relaxed store, as a cumulative release); the
// reader acquires it and sets it back to 0 for the next kernel.
__device__ inline void flag_release(uint32_t* flag) {
  asm volatile("fence.acq_rel.gpu;\n\tst.relaxed.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(1u)
               : "memory");
}
__device__ inline void flag_acquire(uint32_t* flag) {
  uint32_t value;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
    if (value != 0) {
      break;
    }
    __nanosleep(64);
  }
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(0u) : "memory");
}

// A turn counter in global memory (the backward's deterministic sums): the
// writers of one sum take turns in a fixed order. The waiter acquires the
// counter, then orders its next bulk (async-proxy) operation after that
// acquire; the signaller orders its completed bulk operations before the
// release. The same word serves a sum without turns (the backward's dQ sums
// in any order): 0 while nobody wrote it; the one writer that claims it
// (-1) stores its part, then signals 1; the others wait for that, then add.
template <class Ready>
__device__ inline void semaphore_wait_until(const int* sem, Ready ready) {
  int seen;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(sem) : "memory");
    if (ready(seen)) {
      break;
    }
    __nanosleep(32);
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
__device__ inline void semaphore_wait(const int* sem, int value) {
  semaphore_wait_until(sem, [value](int seen) { return seen == value; });
}
// True for the one caller that finds the sum unwritten (it then holds -1).
__device__ inline bool semaphore_claim(int* sem) { return atomicCAS(sem, 0, -1) == 0; }
// Until the claimed sum's first part is stored (any count past 0).
__device__ inline void semaphore_wait_stored(const int* sem) {
  semaphore_wait_until(sem, [](int seen) { return seen > 0; });
}
__device__ inline void semaphore_signal(int* sem, int value) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(sem), "r"(value) : "memory");
}

// dst[0..3] += x, one vector reduction in global memory (sm_90; 16-byte aligned).
__device__ inline void red_add_f32x4(float* dst, const float4& x) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(x.x), "f"(x.y),
               "f"(x.z), "f"(x.w)
               : "memory");
}

// A fence for ptxas's scheduler, not for the hardware: every instruction that
// feeds `a` or `b` issues before it, and so does everything the program puts
// after it that ptxas keeps behind barriers (wgmma waits among them). ptxas
// sinks pure arithmetic below a wgmma wait that does not depend on it; this
// makes the arithmetic's results feed a barrier instead. The warp arrives on
// kScheduleFence (32 threads, so each arrival completes it; nobody waits)
// under a predicate that is true for every a + b >= 0 or NaN, which ptxas
// cannot prove.
__device__ inline void schedule_after(float a, float b) {
  asm volatile(
      "{\n .reg .pred p;\n .reg .f32 t;\n add.f32 t, %0, %1;\n setp.lt.f32 p, t, 0f00000000;\n"
      " @!p bar.arrive %2, 32;\n}" ::"f"(a),
      "f"(b), "n"(static_cast<uint32_t>(NamedBarrier::kScheduleFence))
      : "memory");
}

template <uint32_t kRegisters>
__device__ inline void registers_release() {
  cutlass::arch::warpgroup_reg_dealloc<kRegisters>();
}

template <uint32_t kRegisters>
__device__ inline void registers_acquire() {
  cutlass::arch::warpgroup_reg_alloc<kRegisters>();
}

// Generic-proxy writes to shared memory (st.shared) become visible to the
// async proxy (TMA store, wgmma) after this fence plus a barrier.
__device__ inline void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Ring position of a multi-stage pipeline: stage index and the parity of the
// current pass over the ring.
template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;

  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace flash3::sm90
