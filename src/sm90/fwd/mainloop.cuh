// The forward mainloop: the producer's TMA loads and a consumer warpgroup's
// GEMMs and softmax over the key blocks of one query tile.
//
// Order, per key block n (from the last block down, so the masked blocks
// come first): S = Q K_n^T (wgmma, both operands in shared memory); release
// K_n; mask; online softmax; P = S in 16-bit registers; O += P V_n (wgmma, P
// from registers); release V_n. Issue 3 overlaps these (ping-pong between the
// two consumer warpgroups, and the GEMM of block n-1 issued before the
// softmax of block n).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_args.cuh"
#include "mask.cuh"
#include "scheduler.cuh"
#include "sm90/common/sync.cuh"
#include "sm90/common/tma.cuh"
#include "sm90/common/wgmma.cuh"
#include "softmax.cuh"

namespace flash3::sm90::fwd {

template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// Position of this thread in the wgmma accumulator layout of its warpgroup.
struct FragmentCoord {
  int warp;  // warp in the warpgroup: rows 16*warp .. 16*warp+15
  int row;   // g = lane / 4: rows g and g + 8 of the warp's 16
  int col;   // 2 * (lane % 4): columns col, col + 1 of every 8
  __device__ static FragmentCoord current() {
    const int lane = threadIdx.x % 32;
    return {static_cast<int>((threadIdx.x / 32) % 4), lane / 4, 2 * (lane % 4)};
  }
};

template <class T, bool kCausal>
struct Mainloop {
  using Element = typename T::Element;
  using Storage = SharedStorage<T>;
  using Pipeline = PipelineState<T::kStages>;
  static constexpr int kBlockM = T::kBlockM;
  static constexpr int kBlockN = T::kBlockN;
  static constexpr int kHeadDim = T::kHeadDimV;

  Storage& smem;
  const KernelArgs& args;

  // ---------------------------------------------------------------- producer (one thread)
  __device__ void load(const Tile& tile, int n_block_end) {
    const int head_kv = tile.head / args.heads_per_kv_head;
    smem.q_full.arrive_expect_tx(T::kQTileBytes);
#pragma unroll
    for (int b = 0; b < T::kColBlocks; ++b) {
      tma_load(&args.q, &smem.q_full.word, smem.q + b * kBlockM * kSwizzleCols16,
               b * kSwizzleCols16, tile.m_block * kBlockM, tile.head, tile.batch);
    }
    Pipeline pipe;
    for (int n = n_block_end - 1; n >= 0; --n) {
      load_kv(smem.k[pipe.stage], smem.k_full[pipe.stage], smem.k_empty[pipe.stage], &args.k,
              pipe.phase, n, head_kv, tile.batch);
      load_kv(smem.v[pipe.stage], smem.v_full[pipe.stage], smem.v_empty[pipe.stage], &args.v,
              pipe.phase, n, head_kv, tile.batch);
      pipe.advance();
    }
  }

  __device__ void load_kv(Element* dst, Mbarrier& full, Mbarrier& empty, const CUtensorMap* map,
                          uint32_t phase, int n_block, int head_kv, int batch) {
    empty.wait(phase ^ 1u);  // the first pass finds every stage free
    full.arrive_expect_tx(T::kKVTileBytes);
#pragma unroll
    for (int b = 0; b < T::kColBlocks; ++b) {
      tma_load(map, &full.word, dst + b * kBlockN * kSwizzleCols16, b * kSwizzleCols16,
               n_block * kBlockN, head_kv, batch);
    }
  }

  // ---------------------------------------------------------------- consumer (one warpgroup)
  // S (64 x kBlockN) = Q rows of this warpgroup times K^T.
  __device__ void gemm_qk(uint32_t q_addr, uint32_t k_addr, float (&s)[T::kSAccRegs]) {
    fence_operands(s);
    mma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kMmaK16; ++kk) {
      const int block = kk / (kSwizzleCols16 / kMmaK16);
      const int offset = (kk % (kSwizzleCols16 / kMmaK16)) * kMmaK16 * 2;
      const uint64_t a = desc_k_major(q_addr + block * kBlockM * kSwizzleRowBytes + offset);
      const uint64_t b = desc_k_major(k_addr + block * kBlockN * kSwizzleRowBytes + offset);
      mma_ss<Element, kBlockN, gmma::Major::K>(a, b, s, kk > 0);
    }
    mma_commit();
    fence_operands(s);
  }

  // O (64 x kHeadDim) += P (registers) times V.
  __device__ void gemm_pv(const uint32_t (&p)[T::kSAccRegs / 2], uint32_t v_addr,
                          float (&o)[T::kOAccRegs]) {
    fence_operands(o);
    mma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / kMmaK16; ++kk) {
      const uint64_t b = desc_mn_major(v_addr + kk * kMmaK16 * kSwizzleRowBytes,
                                       kBlockN * kSwizzleRowBytes);
      mma_rs<Element, kHeadDim, gmma::Major::MN>(&p[4 * kk], b, o);
    }
    mma_commit();
    fence_operands(o);
  }

  __device__ void compute(const Tile& tile, int n_block_end, int warpgroup,
                          float (&o)[T::kOAccRegs], OnlineSoftmax& softmax) {
    const Mask<kBlockM, kBlockN, kCausal> mask{args.seqlen_q, args.seqlen_k};
    const FragmentCoord c = FragmentCoord::current();
    const int row0 = tile.m_block * kBlockM + warpgroup * kMmaM + c.warp * 16 + c.row;
    const uint32_t q_addr = smem_u32(smem.q) + warpgroup * kMmaM * kSwizzleRowBytes;

    smem.q_full.wait(0);
    Pipeline pipe;
    for (int n = n_block_end - 1; n >= 0; --n) {
      float s[T::kSAccRegs];
      smem.k_full[pipe.stage].wait(pipe.phase);
      gemm_qk(q_addr, smem_u32(smem.k[pipe.stage]), s);
      mma_wait<0>();
      fence_operands(s);
      smem.k_empty[pipe.stage].arrive();

      if (mask.needs_mask(tile.m_block, n)) {
        mask.apply(s, row0, n * kBlockN + c.col);
      }
      float rescale[OnlineSoftmax::kRows];
      softmax.step(s, rescale);
#pragma unroll
      for (int i = 0; i < T::kOAccRegs; ++i) {
        o[i] *= rescale[acc_row(i)];
      }
      uint32_t p[T::kSAccRegs / 2];
#pragma unroll
      for (int i = 0; i < T::kSAccRegs / 2; ++i) {
        p[i] = pack2<Element>(s[2 * i], s[2 * i + 1]);
      }

      smem.v_full[pipe.stage].wait(pipe.phase);
      gemm_pv(p, smem_u32(smem.v[pipe.stage]), o);
      mma_wait<0>();
      fence_operands(o);
      smem.v_empty[pipe.stage].arrive();
      pipe.advance();
    }
  }
};

}  // namespace flash3::sm90::fwd
