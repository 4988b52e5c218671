// The backward mainloop of one CTA (one key block of one query head): the
// producer's loads, the dQ writer's reduce-adds, and a consumer warpgroup's
// GEMMs over the query blocks that see the key block.
//
// Per query block m, a consumer warpgroup (64 of the CTA's keys) computes,
// with scores transposed (rows = keys) so that P^T and dS^T come out of the
// accumulators already as the A operands of the dV and dK GEMMs:
//   S^T = K Q^T, dP^T = V dO^T                       (both operands in smem)
//   P^T = exp2(S^T scale log2e - LSE log2e), dS^T = P^T (dP^T - rowsum(dO O))
//   (softcap c, the masked kernels: S^T becomes t = tanh(S^T scale / c),
//   P^T = exp2(t c log2e - LSE log2e), and dS^T gains the factor 1 - t^2)
//   dV += P^T dO, dK += dS^T Q                       (A from registers)
//   dS^T -> smem; dQ_m = dS K (both warpgroups' keys; A, B in smem)
//   dQ_m -> smem -> the dQ writer's bulk reduce-add into the fp32 workspace.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel_args.cuh"
#include "sm90/common/fragment.cuh"
#include "sm90/common/mask.cuh"
#include "sm90/common/math.cuh"
#include "sm90/common/sync.cuh"
#include "sm90/common/tma.cuh"
#include "sm90/common/wgmma.cuh"
#include "traits.cuh"
#include "workspace.hpp"

namespace flash3::sm90::bwd {

template <class T, bool kCausal, bool kLocal>
struct Mainloop {
  using Element = typename T::Element;
  using Pipeline = PipelineState<T::kStages>;
  static constexpr int kBlockM = T::kBlockM;
  static constexpr int kBlockN = T::kBlockN;
  static constexpr int kHeadDim = T::kHeadDim;
  static constexpr int kSwizzleCols = T::kSwizzleCols;
  // A dQ hand-off joins the consumers and one writer warp.
  static constexpr uint32_t kDqSyncThreads = T::kConsumerThreads + 32;

  SharedStorage<T>& smem;
  const KernelArgs& args;
  const Mask<kBlockM, kBlockN, kCausal, kLocal> mask;  // of the block's sequence
  const KeyBlock blk;
  int m_begin, m_end;  // the query blocks that see this key block
  // The unmasked kernels in the default mode: the CTA's first query block is
  // m_begin + m_rotate, and it wraps around from m_end (query_block).
  int m_rotate = 0;
  static constexpr bool kRotates = !kCausal && !kLocal;

  // Sets m_rotate: key block n of N starts at step n M / N of its M.
  __device__ void stagger_start() {
    if constexpr (kRotates) {
      const int count = m_end - m_begin;
      if (!args.deterministic && count > 0) {
        const int key_blocks = (blk.seqlen_k + kBlockN - 1) / kBlockN;
        m_rotate = static_cast<int>(int64_t{blk.n_block} * count / key_blocks);
      }
    }
  }

  // The query block of step m (m_begin <= m < m_end). Every key block of a
  // head reached the same query blocks in the same steps, so that in the
  // unmasked kernels all of them added into one dQ tile at once (and waited
  // for its first writer's store); rotated by n M / N (stagger_start), each
  // query block is first reached by one key block, the others later. Never
  // in deterministic mode, whose turns (dq_turn) are those of the steps in
  // order: a rotated order would wait for CTAs that may not have started.
  __device__ int query_block(int m) const {
    if constexpr (!kRotates) {
      return m;
    } else {
      const int q = m + m_rotate;
      return q < m_end ? q : q - (m_end - m_begin);
    }
  }

  // ---------------------------------------------------------------- producer (one thread)
  // K, the first Q, V, the first dO, then the Q and dO rings: the first
  // step's S^T GEMM waits for K and Q alone (T::kKFirst; else K and V
  // first). A key block that no query block sees loads nothing (its
  // consumers wait for nothing).
  __device__ void load_all() {
    if (m_begin >= m_end) {
      return;
    }
    load_kv<T::kColBlocks>(&args.k, smem.k_full, smem.k, T::kKTileBytes);
    if constexpr (!T::kKFirst) {
      load_kv<T::kColBlocksV>(&args.v, smem.v_full, smem.v, T::kVTileBytes);
    }
    Pipeline pipe;
    for (int m = m_begin; m < m_end; ++m, pipe.advance()) {
      const int block = query_block(m);
      const int64_t rows = blk.q.ws_row0 + block * kBlockM;
      smem.q_empty[pipe.stage].wait(pipe.phase ^ 1u);  // the first pass finds it free
      load_rows<T::kColBlocks>(&args.q, smem.q_full[pipe.stage], smem.q[pipe.stage],
                smem.lse_log2[pipe.stage], args.lse_log2 + rows, block);
      if (T::kKFirst && m == m_begin) {
        load_kv<T::kColBlocksV>(&args.v, smem.v_full, smem.v, T::kVTileBytes);
      }
      smem.do_empty[pipe.stage].wait(pipe.phase ^ 1u);
      load_rows<T::kColBlocksV>(&args.dout, smem.do_full[pipe.stage], smem.dout[pipe.stage],
                smem.dpsum[pipe.stage], args.dpsum + rows, block);
    }
  }
  // The CTA's K or V tile (kBlocks column blocks of kBlockN keys).
  template <int kBlocks>
  __device__ void load_kv(const CUtensorMap* map, Mbarrier& full, Element* tile, int bytes) {
    full.arrive_expect_tx(bytes);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      tma_load(map, &full.word, tile + b * kBlockN * kSwizzleCols, b * kSwizzleCols,
               blk.k_row0 + blk.n_block * kBlockN, blk.head_kv, blk.q.batch);
    }
  }
  // A Q or dO tile (kBlocks column blocks) of query block m and its rows' statistic.
  template <int kBlocks>
  __device__ void load_rows(const CUtensorMap* map, Mbarrier& full, Element* tile, float* stat,
                            const float* stat_src, int m) {
    full.arrive_expect_tx(kBlockM * kBlocks * kSwizzleCols * T::kElementBytes + T::kRowBytes);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      tma_load(map, &full.word, tile + b * kBlockM * kSwizzleCols, b * kSwizzleCols,
               blk.q.row0 + m * kBlockM, blk.head, blk.q.batch);
    }
    bulk_load(&full.word, stat, stat_src, T::kRowBytes);
  }

  // ---------------------------------------------------------------- dQ writer (one warp)
  // Deterministic mode: this key block's place among the key blocks that add
  // into query block m, which are 0 .. n_block_end(m) - 1 (m_block_begin
  // grows with n). Non-causal: in order of n, as the CTAs start. Causal: from
  // the last down, since key block n starts at query block m_block_begin(n)
  // and so reaches block m after key block n + 1 does; the launch then starts
  // the CTAs in that order too (kernel.cuh: key_block_of), so that no CTA
  // waits for one that cannot start.
  __device__ int dq_turn(int m) const {
    return kCausal ? mask.n_block_end(m) - 1 - blk.n_block : blk.n_block;
  }

  // Per query block: waits for the consumers' dQ tile, puts it into the
  // workspace's sums, and frees the tile once the bulk operation has read it.
  // Nothing zeroes the sums before: the first writer of a block stores its
  // tile, the others add theirs once that store is done (dq_state, a word
  // per block: sync.cuh, semaphore_claim). Deterministic: the key blocks add
  // in order (dq_turn), the first one storing. The post-pass reads a block
  // that nobody wrote as zeros.
  // Two writer warps take the steps in turn (writer w the steps of rank
  // m - m_begin = w mod 2), so that one's wait for its turn (or claim) and
  // the bulk operation's read of the tile run while the other waits for the
  // completion of its own and releases the next key block's turn: one warp
  // took as long as a step (H100, head dim 128, 2.9 us), and head dim 256's
  // deterministic kernels made the consumers wait for it (exp/det-trace).
  // The one staging tile passes from writer to writer: the consumers stage
  // step m once the writer of step m - 1 has read that step's tile
  // (dq_empty(m - 1's writer)), and tell step m's writer (dq_full).
  // T::kDqAtomic: nothing (the consumers add dQ themselves: add_dq, into
  // sums the pre-pass zeroes).
  static constexpr int kDqWriters = 2;
  __device__ static NamedBarrier dq_full(int writer) {
    return writer == 0 ? NamedBarrier::kBwdDqFull0 : NamedBarrier::kBwdDqFull1;
  }
  __device__ static NamedBarrier dq_empty(int writer) {
    return writer == 0 ? NamedBarrier::kBwdDqEmpty0 : NamedBarrier::kBwdDqEmpty1;
  }
  __device__ int dq_writer(int m) const { return (m - m_begin) % kDqWriters; }
  __device__ void write_dq_all(int writer) {
    if constexpr (!T::kDqAtomic) {
      write_dq_staged(writer);
    }
  }
  __device__ void write_dq_staged(int writer) {
    const bool leader = threadIdx.x % 32 == 0;
    // The first step's tile is free: its predecessor's writer says so.
    if (m_begin < m_end && writer == kDqWriters - 1) {
      named_barrier_arrive(dq_empty(writer), kDqSyncThreads);
    }
    for (int m = m_begin + writer; m < m_end; m += kDqWriters) {
      named_barrier_sync(dq_full(writer), kDqSyncThreads);
      const int block = query_block(m);
      int* state = args.dq_state + blk.q.ws_row0 / kBlockM + block;
      const int turn = dq_turn(block);
      bool first = false;
      if (leader) {
        if (args.deterministic) {
          semaphore_wait(state, turn);
          first = turn == 0;
        } else {
          first = semaphore_claim(state);
          if (!first) {
            semaphore_wait_stored(state);
          }
        }
        float* sums = args.dq_accum + (blk.q.ws_row0 + block * kBlockM) * kHeadDim;
        constexpr uint32_t kBytes = T::kDqTileFloats * sizeof(float);
        if (first) {
          bulk_store(sums, smem.dq_staging.dq, kBytes);
        } else {
          bulk_reduce_add_f32(sums, smem.dq_staging.dq, kBytes);
        }
        tma_store_commit();
        tma_store_wait_read();
      }
      __syncwarp();
      if (m + 1 < m_end) {
        named_barrier_arrive(dq_empty(writer), kDqSyncThreads);
      }
      if (leader && (args.deterministic || first)) {
        tma_store_wait_all();
        semaphore_signal(state, args.deterministic ? turn + 1 : 1);
      }
    }
    if (leader) {
      tma_store_wait_all();
    }
  }

  // ---------------------------------------------------------------- consumer (one warpgroup)
  // acc (64 keys x kBlockM queries) = A (this warpgroup's 64 rows of K or V)
  // times B^T (Q or dO): both K-major, reducing over kDim (the head dim, or
  // for V and dO kHeadDimV).
  // kInFlight: issued while other GEMMs of this warpgroup are in flight
  // (T::kScoresAhead), so acc takes no fence before it: ptxas serialises
  // every wgmma when a non-wgmma instruction defines an accumulator between
  // a wgmma's issue and its wait (C7515); the GEMM's own operands order it
  // after acc's last reads.
  template <int kDim, bool kInFlight = false>
  __device__ void gemm_transposed_scores(uint32_t a_addr, uint32_t b_addr,
                                         float (&acc)[T::kSAccRegs]) {
    if constexpr (!kInFlight) {
      fence_operands(acc);
    }
    mma_fence();
    const auto a = desc_k_major<T::kSharedSpace>(a_addr);
    const auto b = desc_k_major<T::kSharedSpace>(b_addr);
#pragma unroll
    for (int kk = 0; kk < kDim / kMmaK16; ++kk) {
      const int block = kk / (kSwizzleCols / kMmaK16);
      const int offset = (kk % (kSwizzleCols / kMmaK16)) * kMmaKBytes;
      mma_ss<Element, kBlockM, gmma::Major::K>(a.at(block * kBlockN * kSwizzleRowBytes + offset),
                                               b.at(block * kBlockM * kSwizzleRowBytes + offset),
                                               acc, kk > 0);
    }
    mma_commit();
    fence_operands(acc);
  }

  // acc (64 keys x kCols columns from col0, a multiple of kSwizzleCols: dV's
  // or dK's) += A (registers: P^T or dS^T, 64 keys x kBlockM) times B (dO or
  // Q: rows are queries, the reduction; MN-major).
  template <int kCols, int kAccRegs>
  __device__ void gemm_accumulate_kv(const uint32_t (&a)[T::kPRegs], uint32_t b_addr, int col0,
                                     float (&acc)[kAccRegs]) {
    fence_operands(acc);
    mma_fence();
    const auto b = desc_mn_major<T::kSharedSpace>(
        b_addr + (col0 / kSwizzleCols) * kBlockM * kSwizzleRowBytes, kBlockM * kSwizzleRowBytes);
    // Head dim 96: the first column block, then the second block's 32.
    constexpr int kWhole = kCols / kSwizzleCols * kSwizzleCols;
    constexpr int kPart = kCols - kWhole;
#pragma unroll
    for (int kk = 0; kk < kBlockM / kMmaK16; ++kk) {
      const uint32_t step = kk * kMmaK16 * kSwizzleRowBytes;
      if constexpr (kPart == 0) {
        mma_rs<Element, kCols, gmma::Major::MN>(&a[4 * kk], b.at(step), acc);
      } else {
        mma_rs_cols<Element, kWhole, gmma::Major::MN, 0>(&a[4 * kk], b.at(step), acc);
        mma_rs_cols<Element, kPart, gmma::Major::MN, kWhole / 2>(
            &a[4 * kk], b.at(kWhole / kSwizzleCols * kBlockM * kSwizzleRowBytes + step), acc);
      }
    }
    fence_operands(acc);
  }

  // The same with A read from a P^T or dS^T tile (K-major: its rows are the
  // 64 keys, the reduction runs along them), kBlockM being one column block;
  // kCols columns from col0 into acc's first registers (T::kDkvUneven: a
  // warpgroup's part, T::dkv_cols or T::dv_cols, fewer than acc holds).
  template <int kCols, int kAccRegs>
  __device__ void gemm_accumulate_kv_from_tile(uint32_t a_addr, uint32_t b_addr, int col0,
                                               float (&acc)[kAccRegs]) {
    static_assert(kBlockM == kSwizzleCols, "the tile is one column block wide");
    fence_operands(acc);
    mma_fence();
    const auto a = desc_k_major<T::kSharedSpace>(a_addr);
    const auto b = desc_mn_major<T::kSharedSpace>(
        b_addr + (col0 / kSwizzleCols) * kBlockM * kSwizzleRowBytes, kBlockM * kSwizzleRowBytes);
#pragma unroll
    for (int kk = 0; kk < kBlockM / kMmaK16; ++kk) {
      mma_ss_cols<Element, kCols, gmma::Major::MN, gmma::Major::K, 0>(
          a.at(kk * kMmaKBytes), b.at(kk * kMmaK16 * kSwizzleRowBytes), acc, true);
    }
    fence_operands(acc);
  }

  // T::kDkvUneven: dq (every 64-row group, kCols columns from col0, whole
  // column blocks: T::dq_cols) = dS (A: the dS^T tile read MN-major) times K.
  template <int kCols>
  __device__ void gemm_dq_cols(uint32_t ds_addr, int col0,
                               float (&dq)[T::kDqRowGroups][T::kDqAccRegs]) {
    static_assert(kCols % kSwizzleCols == 0, "whole column blocks");
    mma_fence();
    const auto b = desc_mn_major<T::kSharedSpace>(
        smem_u32(smem.k) + (col0 / kSwizzleCols) * kBlockN * kSwizzleRowBytes,
        kBlockN * kSwizzleRowBytes);
#pragma unroll
    for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
      const auto a = desc_mn_major<T::kSharedSpace>(ds_addr + rg * kBlockN * kSwizzleRowBytes,
                                                    kBlockN * kSwizzleRowBytes);
#pragma unroll
      for (int kk = 0; kk < kBlockN / kMmaK16; ++kk) {
        const uint32_t step = kk * kMmaK16 * kSwizzleRowBytes;
        mma_ss_cols<Element, kCols, gmma::Major::MN, gmma::Major::MN, 0>(a.at(step), b.at(step),
                                                                         dq[rg], kk > 0);
      }
    }
    mma_commit();
  }

  // T::kDkvUneven: compute_split's GEMMs of a step for warpgroup kW, of its
  // own numbers of dK, dV and dQ columns (T::dkv_cols, T::dv_cols, T::dq_cols;
  // (64, 256): warpgroup 0 has no dQ columns, warpgroup 1 no dK columns).
  template <int kW>
  __device__ void split_gemms(int stage, const Element* p_tile, const Element* ds_tile,
                              float (&dk)[T::kDkvAccRegs], float (&dv)[T::kDvAccRegs],
                              float (&dq)[T::kDqRowGroups][T::kDqAccRegs]) {
    gemm_accumulate_kv_from_tile<T::dv_cols(kW)>(
        smem_u32(p_tile), smem_u32(smem.dout[stage]), T::dv_col_offset(kW), dv);
    if constexpr (T::dkv_cols(kW) > 0) {
      gemm_accumulate_kv_from_tile<T::dkv_cols(kW)>(
          smem_u32(ds_tile), smem_u32(smem.q[stage]), T::dkv_col_offset(kW), dk);
    }
    mma_commit();
    if constexpr (T::dq_cols(kW) > 0) {
      gemm_dq_cols<T::dq_cols(kW)>(smem_u32(ds_tile), T::dq_col_offset(kW), dq);
    }
  }

  // dq (every 64-row group of the kBlockM x headdim tile, this warpgroup's
  // kDqCols columns) = dS (A: the dS^T tile read MN-major) times K (B:
  // MN-major), reducing over all kBlockN keys of the CTA.
  __device__ void gemm_dq(uint32_t ds_addr, int warpgroup,
                          float (&dq)[T::kDqRowGroups][T::kDqAccRegs]) {
    mma_fence();
    if constexpr (T::kDqKeySplit) {
      gemm_dq_own_keys(ds_addr, warpgroup, dq);
      mma_commit();
      return;
    }
    const int col0 = warpgroup * T::kDqCols;
    const auto b = desc_mn_major<T::kSharedSpace>(
        smem_u32(smem.k) + (col0 / kSwizzleCols) * kBlockN * kSwizzleRowBytes +
            (col0 % kSwizzleCols) * T::kElementBytes,
        kBlockN * kSwizzleRowBytes);
#pragma unroll
    for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
      const auto a = desc_mn_major<T::kSharedSpace>(ds_addr + rg * kBlockN * kSwizzleRowBytes,
                                                    kBlockN * kSwizzleRowBytes);
#pragma unroll
      for (int kk = 0; kk < kBlockN / kMmaK16; ++kk) {
        const uint32_t step = kk * kMmaK16 * kSwizzleRowBytes;
        mma_ss<Element, T::kDqCols, gmma::Major::MN, T::kDqAccRegs, gmma::Major::MN>(
            a.at(step), b.at(step), dq[rg], kk > 0);
      }
    }
    mma_commit();
  }

  // T::kDqKeySplit (head dim 96): this warpgroup's partial dQ, every column
  // over its own 64 keys (the rows of the dS^T and K tiles it wrote or
  // owns), in the first column block and then the second block's part.
  __device__ void gemm_dq_own_keys(uint32_t ds_addr, int warpgroup,
                                   float (&dq)[T::kDqRowGroups][T::kDqAccRegs]) {
    constexpr int kWhole = T::kDqCols / kSwizzleCols * kSwizzleCols;
    constexpr int kPart = T::kDqCols - kWhole;
    static_assert(kWhole > 0 && kPart > 0, "whole blocks and a part");
    const int key0 = T::key_offset(warpgroup);
    const auto b = desc_mn_major<T::kSharedSpace>(smem_u32(smem.k), kBlockN * kSwizzleRowBytes);
#pragma unroll
    for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
      const auto a = desc_mn_major<T::kSharedSpace>(ds_addr + rg * kBlockN * kSwizzleRowBytes,
                                                    kBlockN * kSwizzleRowBytes);
#pragma unroll
      for (int kk = 0; kk < kMmaM / kMmaK16; ++kk) {
        const uint32_t step = (key0 + kk * kMmaK16) * kSwizzleRowBytes;
        mma_ss_cols<Element, kWhole, gmma::Major::MN, gmma::Major::MN, 0>(a.at(step), b.at(step),
                                                                          dq[rg], kk > 0);
        mma_ss_cols<Element, kPart, gmma::Major::MN, gmma::Major::MN, kWhole / 2>(
            a.at(step), b.at(kWhole / kSwizzleCols * kBlockN * kSwizzleRowBytes + step), dq[rg],
            kk > 0);
      }
    }
  }

  // A 16-bit P^T or dS^T fragment (this warpgroup's 64 keys) into a tile
  // of kBlockN keys x kBlockM queries, with stmatrix: two 8-column groups of
  // the warp's 16 rows at a time (as the forward stages O); load_tile reads
  // the same registers back with ldmatrix.
  __device__ static uint32_t tile_address(const Element* tile, int key_row0, int j) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int row = key_row0 - lane / 4 + lane % 8 + 8 * ((lane / 8) % 2);
    return smem_u32(tile) + tile_offset16<kBlockN>(row, 8 * (j + lane / 16));
  }
  __device__ static void store_tile(const uint32_t (&x)[T::kPRegs], Element* tile, int key_row0) {
#pragma unroll
    for (int j = 0; j < kBlockM / 8; j += 2) {
      stmatrix_x4(tile_address(tile, key_row0, j), x[2 * j], x[2 * j + 1], x[2 * j + 2],
                  x[2 * j + 3]);
    }
  }
  __device__ static void load_tile(uint32_t (&x)[T::kPRegs], const Element* tile, int key_row0) {
#pragma unroll
    for (int j = 0; j < kBlockM / 8; j += 2) {
      ldmatrix_x4(tile_address(tile, key_row0, j), x[2 * j], x[2 * j + 1], x[2 * j + 2],
                  x[2 * j + 3]);
    }
  }

  // f(i, x) for each float4 x of part w's dQ registers (w: a warpgroup's
  // columns) and its index i in the workspace's thread order: chunk c of
  // thread t at (base(w) + c) * 128 + t, c = row group * (its 8-column
  // groups) + 8-column group (T::kDkvUneven: the two parts' counts differ).
  // stage_dq and add_dq put dQ there; postpass.cuh reads it back.
  template <class F>
  __device__ static void for_each_dq_chunk(const float (&dq)[T::kDqRowGroups][T::kDqAccRegs],
                                           int part, F&& f) {
    const int t = static_cast<int>(threadIdx.x % T::kWarpgroupThreads);
    const int groups = T::kDkvUneven ? T::dq_cols(part) / 8 : T::kDqCols / 8;
    const int base = T::kDkvUneven ? T::dq_chunk_base(part) : part * T::dq_chunks(0);
#pragma unroll
    for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
#pragma unroll
      for (int c = 0; c < T::kDqAccRegs / 4; ++c) {
        if (T::kDkvUneven && c >= groups) {
          continue;
        }
        f((base + rg * groups + c) * T::kWarpgroupThreads + t,
          make_float4(dq[rg][4 * c], dq[rg][4 * c + 1], dq[rg][4 * c + 2], dq[rg][4 * c + 3]));
      }
    }
  }

  // T::kDqAtomic: this warpgroup's dQ added into the workspace's tile of
  // query block m from registers, each float4 where stage_dq would have put
  // it. Never deterministic: that mode's kernels stage dQ (traits.cuh,
  // ConfigFor).
  __device__ void add_dq(const float (&dq)[T::kDqRowGroups][T::kDqAccRegs], int warpgroup, int m) {
    static_assert(!T::kDqKeySplit, "the key split adds its partial sums in the staging tile");
    float* tile = args.dq_accum + (blk.q.ws_row0 + m * kBlockM) * kHeadDim;
    for_each_dq_chunk(dq, warpgroup,
                      [&](int i, const float4& x) { red_add_f32x4(tile + 4 * i, x); });
  }

  // This warpgroup's dQ registers into the staging tile, in the workspace's
  // order (for_each_dq_chunk). T::kDqKeySplit: warpgroup 0's partial sums
  // go in, warpgroup 1 adds its own to them (the same thread-order place:
  // the same fragment layout).
  __device__ void stage_dq(const float (&dq)[T::kDqRowGroups][T::kDqAccRegs], int warpgroup) {
    const bool add = T::kDqKeySplit && warpgroup == 1;
    if (add) {
      named_barrier_sync(NamedBarrier::kBwdDqPartial, T::kConsumerThreads);
    }
    float4* staging = reinterpret_cast<float4*>(smem.dq_staging.dq);
    for_each_dq_chunk(dq, T::kDqKeySplit ? 0 : warpgroup, [&](int i, float4 x) {
      if (add) {
        const float4 first = staging[i];
        x = make_float4(first.x + x.x, first.y + x.y, first.z + x.z, first.w + x.w);
      }
      staging[i] = x;
    });
    if (T::kDqKeySplit && !add) {
      named_barrier_arrive(NamedBarrier::kBwdDqPartial, T::kConsumerThreads);
    }
  }

  // S^T -> P^T in place (masked; each column, a query, has its own
  // log-sum-exp; softcap's tanh first), and dP^T -> dS^T = P^T (dP^T -
  // rowsum(dO O)), which softcap then scales by its slope 1 - t^2.
  __device__ bool capped() const { return kLocal && args.softcap > 0.0f; }
  __device__ void probabilities(float (&s)[T::kSAccRegs], int stage, int m, int key_row0,
                                int col) const {
    float scale_log2 = args.scale_log2;
    if (capped()) {
      const float to_tanh = args.softmax_scale / args.softcap;
#pragma unroll
      for (int i = 0; i < T::kSAccRegs; ++i) {
        s[i] = fast_tanh(s[i] * to_tanh);
      }
      scale_log2 = args.softcap * kLog2e;
    }
    if (mask.needs_mask(m, blk.n_block)) {
      mask.apply_transposed(s, blk.n_block * kBlockN + key_row0, m * kBlockM + col);
    }
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      const float2 lse = *reinterpret_cast<const float2*>(&smem.lse_log2[stage][8 * j + col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] = fast_exp2(fmaf(s[4 * j + e], scale_log2, (e & 1) ? -lse.y : -lse.x));
      }
    }
  }
  // Softcap's slope 1 - t^2 at a probability p = exp2(t c log2e - lse_log2):
  // t = (log2 p + lse_log2) / (c log2e), so that t need not stay in registers
  // until dP^T is there. p = 0 (masked, or below float's range) gives t =
  // -inf and the slope 0.
  __device__ float cap_slope(float p, float lse_log2) const {
    const float t = (fast_log2(p) + lse_log2) * (1.0f / (args.softcap * kLog2e));
    return fmaxf(1.0f - t * t, 0.0f);
  }
  // x times the slope at the probabilities p, in place (x may be p itself:
  // compute_split's warpgroup 0 hands P^T (1 - t^2) over).
  __device__ void scale_by_cap_slope(float (&x)[T::kSAccRegs], const float (&p)[T::kSAccRegs],
                                     int stage, int col) const {
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      const float2 lse = *reinterpret_cast<const float2*>(&smem.lse_log2[stage][8 * j + col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[4 * j + e] *= cap_slope(p[4 * j + e], (e & 1) ? lse.y : lse.x);
      }
    }
  }
  __device__ void score_gradients(const float (&p)[T::kSAccRegs], float (&dp)[T::kSAccRegs],
                                  int stage, int col) const {
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      const float2 dsum = *reinterpret_cast<const float2*>(&smem.dpsum[stage][8 * j + col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dp[4 * j + e] = p[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? dsum.y : dsum.x));
      }
    }
  }

  // This warpgroup's dQ handed to the dQ writer (T::kDqAtomic: added into
  // the workspace from registers); staged(): what the warpgroup does once dQ
  // is staged, before the hand-off's fence and arrive (kScoresAhead: the
  // next S^T).
  // m: the step (its query block is query_block(m)).
  template <class Staged = void (*)()>
  __device__ void hand_off_dq(const float (&dq)[T::kDqRowGroups][T::kDqAccRegs], int warpgroup,
                              int m, Staged staged = [] {}) {
    if constexpr (T::kDqAtomic) {
      add_dq(dq, warpgroup, query_block(m));
      staged();
    } else {
      const int writer = dq_writer(m);
      named_barrier_sync(dq_empty(writer == 0 ? kDqWriters - 1 : writer - 1), kDqSyncThreads);
      stage_dq(dq, warpgroup);
      staged();
      fence_view_async_shared();
      named_barrier_arrive(dq_full(writer), kDqSyncThreads);
    }
  }
  // The end of a step: the Q and dO stage released, and dQ handed over.
  __device__ void finish_step(int stage, const float (&dq)[T::kDqRowGroups][T::kDqAccRegs],
                              int warpgroup, int m) {
    smem.q_empty[stage].arrive();
    smem.do_empty[stage].arrive();
    hand_off_dq(dq, warpgroup, m);
  }

  // Every query block of the CTA's key block; dk and dv accumulate (dK
  // without the softmax scale).
  __device__ void compute(int warpgroup, float (&dk)[T::kDkvAccRegs],
                          float (&dv)[T::kDvAccRegs]) {
    if constexpr (T::kDimSplit) {
      compute_split(warpgroup, dk, dv);
      return;
    }
    const FragmentCoord c = FragmentCoord::current();
    const int key_row0 = T::key_offset(warpgroup) + c.warp * 16 + c.row;  // in the CTA's block
    const uint32_t k_addr = smem_u32(smem.k) + T::key_offset(warpgroup) * kSwizzleRowBytes;
    const uint32_t v_addr = smem_u32(smem.v) + T::key_offset(warpgroup) * kSwizzleRowBytes;
    Pipeline pipe;
    float s[T::kSAccRegs];
    if constexpr (T::kScoresAhead) {  // the first step's S^T
      if (m_begin >= m_end) {
        return;
      }
      smem.k_full.wait(0);
      smem.q_full[pipe.stage].wait(pipe.phase);
      gemm_transposed_scores<kHeadDim>(k_addr, smem_u32(smem.q[pipe.stage]), s);
    }
    // kScoresAhead: the loop ends at the last step's break alone, so that no
    // path leaves it with the next S^T in flight (ptxas then serialises the
    // wgmmas: C7514, C7517).
    for (int m = m_begin; T::kScoresAhead || m < m_end; ++m, pipe.advance()) {
      const int stage = pipe.stage;
      float dp[T::kSAccRegs];
      if constexpr (!T::kScoresAhead) {
        smem.k_full.wait(0);  // K and V: loaded once, so done after the first step
        smem.q_full[stage].wait(pipe.phase);
        gemm_transposed_scores<kHeadDim>(k_addr, smem_u32(smem.q[stage]), s);
      }
      smem.v_full.wait(0);
      smem.do_full[stage].wait(pipe.phase);
      gemm_transposed_scores<T::kHeadDimV>(v_addr, smem_u32(smem.dout[stage]), dp);

      mma_wait<1>();  // S^T
      fence_operands(s);
      probabilities(s, stage, query_block(m), key_row0, c.col);
      mma_wait<0>();  // dP^T
      fence_operands(dp);
      score_gradients(s, dp, stage, c.col);
      if (capped()) {
        scale_by_cap_slope(dp, s, stage, c.col);
      }
      uint32_t p16[T::kPRegs], ds16[T::kPRegs];
#pragma unroll
      for (int i = 0; i < T::kPRegs; ++i) {
        p16[i] = pack2<Element>(s[2 * i], s[2 * i + 1]);
        ds16[i] = pack2<Element>(dp[2 * i], dp[2 * i + 1]);
      }
      gemm_accumulate_kv<T::kDvCols>(p16, smem_u32(smem.dout[stage]), T::dv_col_offset(warpgroup),
                                     dv);
      const auto gemm_dk = [&] {
        gemm_accumulate_kv<T::kDkvCols>(ds16, smem_u32(smem.q[stage]),
                                        T::dkv_col_offset(warpgroup), dk);
        mma_commit();
      };
      if constexpr (!T::kDkLast) {
        gemm_dk();
      } else {
        mma_commit();
      }

      Element* ds_tile = smem.ds[(m - m_begin) & 1];
      store_tile(ds16, ds_tile, key_row0);
      fence_view_async_shared();
      named_barrier_sync(NamedBarrier::kBwdDsReady, T::kConsumerThreads);
      float dq[T::kDqRowGroups][T::kDqAccRegs];
      gemm_dq(smem_u32(ds_tile), warpgroup, dq);
      // T::kDkLast: dK's GEMM after dQ's, so that dQ's hand-off runs under it.
      if constexpr (T::kDkLast) {
        gemm_dk();
        mma_wait<1>();  // dV, dQ
      } else {
        mma_wait<0>();
        fence_operands(dk);
        fence_operands(ds16);
        smem.q_empty[stage].arrive();
      }
      fence_operands(dv);
      fence_operands(p16);
#pragma unroll
      for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
        fence_operands(dq[rg]);
      }
      smem.do_empty[stage].arrive();
      // kDkLast: the step's last GEMM (dK) done, but (kNext) the next S^T.
      const auto release_q = [&](auto next) {
        if constexpr (T::kDkLast) {
          mma_wait<decltype(next)::value ? 1 : 0>();
          fence_operands(dk);
          fence_operands(ds16);
          smem.q_empty[stage].arrive();
        }
      };
      if (!T::kScoresAhead || m + 1 == m_end) {
        hand_off_dq(dq, warpgroup, m);
        release_q(std::false_type{});
        if (T::kScoresAhead) {
          break;
        }
        continue;
      }
      // kScoresAhead: the next step's S^T GEMM issued once dQ is staged (its
      // registers free), so that it runs while this warpgroup hands dQ
      // over and the next step waits for dO.
      hand_off_dq(dq, warpgroup, m, [&] {
        Pipeline next = pipe;
        next.advance();
        smem.q_full[next.stage].wait(next.phase);
        gemm_transposed_scores<kHeadDim, true>(k_addr, smem_u32(smem.q[next.stage]), s);
      });
      release_q(std::true_type{});
    }
  }

  // T::kDimSplit (head dim 256): both warpgroups hold the same 64 keys.
  // Warpgroup 0 computes S^T and P^T, warpgroup 1 dP^T and, with P^T from
  // warpgroup 0's tile, dS^T; each hands its 16-bit result over in a tile
  // (two steps deep, as dS^T elsewhere), and both then take half of the head
  // dim of dV += P^T dO, dK += dS^T Q and dQ = dS K, A read from the tiles.
  // Softcap: warpgroup 0 also hands over P^T (1 - t^2), in the dS^T tile
  // (each warp reads its own 16 rows of it back before writing dS^T there).
  __device__ void compute_split(int warpgroup, float (&dk)[T::kDkvAccRegs],
                                float (&dv)[T::kDvAccRegs]) {
    // A loop per role, so that each allocates its own registers (one loop
    // with both roles behind branches had ptxas serialize every wgmma of
    // head dim 192's non-causal kernels: C7511).
    if (warpgroup == 0) {
      compute_split_as<0>(dk, dv);
    } else {
      compute_split_as<1>(dk, dv);
    }
  }
  template <int kW>
  __device__ void compute_split_as(float (&dk)[T::kDkvAccRegs], float (&dv)[T::kDvAccRegs]) {
    const FragmentCoord c = FragmentCoord::current();
    const int key_row0 = c.warp * 16 + c.row;
    Pipeline pipe;
    for (int m = m_begin; m < m_end; ++m, pipe.advance()) {
      const int stage = pipe.stage;
      // K (S^T, and every dQ GEMM) and V (dP^T): loaded once, so done after the first step.
      smem.k_full.wait(0);
      if constexpr (kW == 1) {
        smem.v_full.wait(0);
      }
      Element* p_tile = smem.p.tile[(m - m_begin) & 1];
      Element* ds_tile = smem.ds[(m - m_begin) & 1];
      float acc[T::kSAccRegs];
      uint32_t x16[T::kPRegs];
      smem.q_full[stage].wait(pipe.phase);
      smem.do_full[stage].wait(pipe.phase);
      if constexpr (kW == 0) {
        gemm_transposed_scores<kHeadDim>(smem_u32(smem.k), smem_u32(smem.q[stage]), acc);
        mma_wait<0>();
        fence_operands(acc);
        probabilities(acc, stage, query_block(m), key_row0, c.col);
#pragma unroll
        for (int i = 0; i < T::kPRegs; ++i) {
          x16[i] = pack2<Element>(acc[2 * i], acc[2 * i + 1]);
        }
        store_tile(x16, p_tile, key_row0);
        if (capped()) {  // P^T (1 - t^2) for warpgroup 1, in the dS^T tile it overwrites
          scale_by_cap_slope(acc, acc, stage, c.col);
#pragma unroll
          for (int i = 0; i < T::kPRegs; ++i) {
            x16[i] = pack2<Element>(acc[2 * i], acc[2 * i + 1]);
          }
          store_tile(x16, ds_tile, key_row0);
        }
        fence_view_async_shared();
        named_barrier_arrive(NamedBarrier::kBwdPReady, T::kConsumerThreads);
      } else {
        gemm_transposed_scores<T::kHeadDimV>(smem_u32(smem.v), smem_u32(smem.dout[stage]), acc);
        mma_wait<0>();
        fence_operands(acc);
        named_barrier_sync(NamedBarrier::kBwdPReady, T::kConsumerThreads);
        load_tile(x16, capped() ? ds_tile : p_tile, key_row0);
        float p[T::kSAccRegs];
#pragma unroll
        for (int i = 0; i < T::kPRegs; ++i) {
          const float2 pair = unpack2<Element>(x16[i]);
          p[2 * i] = pair.x;
          p[2 * i + 1] = pair.y;
        }
        score_gradients(p, acc, stage, c.col);
#pragma unroll
        for (int i = 0; i < T::kPRegs; ++i) {
          x16[i] = pack2<Element>(acc[2 * i], acc[2 * i + 1]);
        }
        store_tile(x16, ds_tile, key_row0);
        fence_view_async_shared();
      }
      named_barrier_sync(NamedBarrier::kBwdDsReady, T::kConsumerThreads);
      float dq[T::kDqRowGroups][T::kDqAccRegs];
      if constexpr (T::kDkvUneven) {  // each warpgroup's parts of its own sizes
        split_gemms<kW>(stage, p_tile, ds_tile, dk, dv, dq);
      } else if constexpr (T::kDkLast) {
        // dV, dQ, then dK: dQ's hand-off (kDqAtomic: its reductions) runs
        // under dK's GEMM, and Q's stage is released after it.
        gemm_accumulate_kv_from_tile<T::kDvCols>(smem_u32(p_tile), smem_u32(smem.dout[stage]),
                                                 T::dv_col_offset(kW), dv);
        mma_commit();
        gemm_dq(smem_u32(ds_tile), kW, dq);
        gemm_accumulate_kv_from_tile<T::kDkvCols>(smem_u32(ds_tile), smem_u32(smem.q[stage]),
                                                  T::dkv_col_offset(kW), dk);
        mma_commit();
        mma_wait<1>();  // dV, dQ
        fence_operands(dv);
#pragma unroll
        for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
          fence_operands(dq[rg]);
        }
        smem.do_empty[stage].arrive();
        hand_off_dq(dq, kW, m);
        mma_wait<0>();
        fence_operands(dk);
        smem.q_empty[stage].arrive();
        continue;
      } else {
        gemm_accumulate_kv_from_tile<T::kDvCols>(smem_u32(p_tile), smem_u32(smem.dout[stage]),
                                                 T::dv_col_offset(kW), dv);
        gemm_accumulate_kv_from_tile<T::kDkvCols>(smem_u32(ds_tile), smem_u32(smem.q[stage]),
                                                  T::dkv_col_offset(kW), dk);
        mma_commit();
        gemm_dq(smem_u32(ds_tile), kW, dq);
      }
      mma_wait<0>();
      fence_operands(dv);
      fence_operands(dk);
#pragma unroll
      for (int rg = 0; rg < T::kDqRowGroups; ++rg) {
        fence_operands(dq[rg]);
      }
      finish_step(stage, dq, kW, m);
    }
    if (kW == 0 && m_begin < m_end) {
      smem.v_full.wait(0);  // V landed before the dK / dV epilogue may write over it
    }
  }
};

}  // namespace flash3::sm90::bwd
