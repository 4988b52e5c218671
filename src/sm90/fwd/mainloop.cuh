// The forward mainloop: the producer's TMA loads and a consumer warpgroup's
// GEMMs and softmax over the key blocks of one query tile.
//
// S = Q K^T takes both operands from shared memory; O += P V takes P from
// registers (the S accumulator layout is already a valid A fragment once
// converted to 16 bits). Consumer order: see compute() and compute_ahead().
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "kernel_args.cuh"
#include "sm90/fp8/prob_offset.hpp"
#include "sm90/common/mask.cuh"
#include "scheduler.cuh"
#include "sm90/common/sync.cuh"
#include "sm90/common/tma.cuh"
#include "sm90/common/fragment.cuh"
#include "sm90/common/wgmma.cuh"
#include "softmax.cuh"

namespace flash3::sm90::fwd {

template <class T, bool kCausal>
struct Mainloop {
  using Element = typename T::Element;
  using Storage = SharedStorage<T>;
  using Pipeline = PipelineState<T::kStages>;
  using Softmax =
      OnlineSoftmax<T::kFp8 ? fp8::kFp8ProbOffsetLog2 : 0, T::kSumChains, T::kMaxSlackLog2>;
  static constexpr int kBlockM = T::kBlockM;
  static constexpr int kBlockN = T::kBlockN;
  static constexpr int kHeadDim = T::kHeadDim;    // of Q and K
  static constexpr int kHeadDimV = T::kHeadDimV;  // of V and O
  static constexpr int kSwizzleCols = T::kSwizzleCols;
  static constexpr int kMmaK = T::kMmaK;

  Storage& smem;
  const KernelArgs& args;

  // ---------------------------------------------------------------- producer (one thread)
  // The loads of this CTA's work, one step (a tile or a piece of one) at a
  // time: K and V of each of its key blocks (the last block first) through
  // the ring, and Q right after the step's first K, whose load then overlaps
  // the previous step's epilogue.
  enum class LoadStep { kK, kQ, kV };
  struct LoadCursor {
    TileScheduler::Cursor at;  // at.step: the parity count of the Q barriers
    bool valid;                // false past the last step
    WorkOf<T> work;
    int head_kv;  // the K/V head of work.tile.head (GQA)
    int n;        // the key block being loaded
    LoadStep next;
    Pipeline pipe;
  };

  const SchedulerOf<T>& scheduler;
  const Mask<kBlockM, kBlockN, kCausal, T::kLocal>& mask;
  LoadCursor loads;  // without warp specialization: consumer thread 0's loads

  __device__ void start_step(LoadCursor& c) const {
    c.valid = scheduler.template work<T::kCausalPairs, T::kTailSplit>(c.at, mask, c.work);
    if (c.valid) {
      c.head_kv = args.by_kv_group.divide(c.work.tile.head);
      c.n = c.work.n_end - 1;
      c.next = c.work.n_end <= c.work.n_begin ? LoadStep::kQ : LoadStep::kK;
    }
  }
  __device__ LoadCursor first_load() const {
    LoadCursor c{};
    c.at = scheduler.template begin<T::kCausalPairs, T::kLocalUnits>();
    start_step(c);
    return c;
  }

  // Issues the cursor's next load and moves it on. Returns false when every
  // step is loaded or, if !kBlocking, when the load's buffer is not free yet
  // (the caller tries again later).
  template <bool kBlocking>
  __device__ bool load_next(LoadCursor& c) {
    auto acquire = [](Mbarrier& empty, uint32_t parity) {
      if constexpr (kBlocking) {
        empty.wait(parity);
        return true;
      } else {
        return empty.test_wait(parity);
      }
    };
    if (!c.valid) {
      return false;
    }
    switch (c.next) {
      case LoadStep::kQ:
        // The previous step's Q K^T GEMMs (and O staged in Q) are done with it.
        if (c.at.step > 0 && !acquire(smem.q_empty, (c.at.step - 1) & 1)) {
          return false;
        }
        if constexpr (T::kVarlen) {  // the packed tensor's rows from the sequence's first
          load_q(c.work.tile, c.work.q.begin, 0);
        } else {
          load_q(c.work.tile, 0, c.work.tile.batch);
        }
        c.next = LoadStep::kV;
        break;
      case LoadStep::kK:
        // The first pass over the ring finds every stage free.
        if (!acquire(smem.k_empty[c.pipe.stage], c.pipe.phase ^ 1u)) {
          return false;
        }
        if constexpr (T::kVarlen) {
          load_k(c.pipe, c.n, c.head_kv, 0, c.work.k.begin);
        } else if constexpr (T::kKvCache) {  // the batch's K/V batch or pages of the cache
          if (args.cache.page_table != nullptr) {
            load_paged<T::kHeadDimPadded>(&args.k, smem.k_full[c.pipe.stage], smem.k[c.pipe.stage],
                                    c.n, c.head_kv, c.work.k.batch);
          } else {
            load_k(c.pipe, c.n, c.head_kv, c.work.k.batch, c.work.k.begin);
          }
        } else {
          load_k(c.pipe, c.n, c.head_kv, c.work.tile.batch, 0);
        }
        c.next = c.n == c.work.n_end - 1 ? LoadStep::kQ : LoadStep::kV;
        break;
      case LoadStep::kV:
        if (!acquire(smem.v_empty[c.pipe.stage], c.pipe.phase ^ 1u)) {
          return false;
        }
        // O of the previous step staged in this stage (kInVStages) has been
        // stored: every step stages O once in each stage, so the wait is for
        // completion at.step - 1, which cannot be two behind.
        if constexpr (T::kOStore == OStore::kInVStages) {
          if (c.at.step > 0 && !acquire(smem.o_read[c.pipe.stage], (c.at.step - 1) & 1)) {
            return false;
          }
        }
        if constexpr (T::kVarlen) {
          load_v(c.pipe, c.n, c.head_kv, 0, c.work.k.begin);
        } else if constexpr (T::kKvCache) {  // the batch's K/V batch or pages of the cache
          if (args.cache.page_table != nullptr) {
            load_paged<T::kVTileCols>(&args.v, smem.v_full[c.pipe.stage], smem.v[c.pipe.stage],
                                     c.n, c.head_kv, c.work.k.batch);
          } else {
            load_v(c.pipe, c.n, c.head_kv, c.work.k.batch, c.work.k.begin);
          }
        } else {
          load_v(c.pipe, c.n, c.head_kv, c.work.tile.batch, 0);
        }
        c.pipe.advance();
        --c.n;
        c.next = LoadStep::kK;
        break;
    }
    if (c.n < c.work.n_begin && c.next != LoadStep::kQ) {  // the step is loaded
      scheduler.template advance<T::kCausalPairs, T::kLocalUnits>(c.at);
      start_step(c);
    }
    return true;
  }

  // The mask of a work: the kernel's (a reference to it), or (varlen) the
  // sequence's own lengths, or (KV cache) the batch's key count.
  __device__ decltype(auto) mask_of(const WorkOf<T>& w) const {
    if constexpr (T::kVarlen) {
      return mask.with_lengths(w.q.length, w.k.length);
    } else if constexpr (T::kKvCache) {
      return mask.with_lengths(mask.seqlen_q, w.k.length);
    } else {
      return (mask);
    }
  }

  // Rows from row0 in batch `batch` of the tensor: a work's batch from row 0,
  // or (varlen) the packed tensors' rows from the sequence's first, batch 0.
  // Rows past a sequence's end read the next sequence's (or the zeros past
  // the tensor): the mask hides those keys, and those query rows are never
  // stored. (The work's fields are read at the calls, not through a
  // function of the work: that moved ptxas's allocation of the other kernels.)
  __device__ void load_q(const Tile& tile, int row0, int batch) {
    smem.q_full.arrive_expect_tx(T::kQTileBytes);
#pragma unroll
    for (int b = 0; b < T::kColBlocks; ++b) {
      tma_load(&args.q, &smem.q_full.word, smem.q + b * kBlockM * kSwizzleCols,
               b * kSwizzleCols, row0 + tile.m_block * kBlockM, tile.head, batch);
    }
  }

  // K: kBlockN rows of the head dim; V for 16 bits kBlockN rows of its own.
  // FP8 V (Fp8V layout) is kHeadDim rows of kBlockN keys.
  __device__ void load_k(const Pipeline& pipe, int n_block, int head_kv, int batch, int row0) {
    Mbarrier& full = smem.k_full[pipe.stage];
    full.arrive_expect_tx(T::kKTileBytes);
#pragma unroll
    for (int b = 0; b < T::kColBlocks; ++b) {
      load_rows<T::kKLoadRows>(&args.k, full, smem.k[pipe.stage] + b * kBlockN * kSwizzleCols,
                               b * kSwizzleCols, row0 + n_block * kBlockN, head_kv, batch);
    }
  }
  __device__ void load_v(const Pipeline& pipe, int n_block, int head_kv, int batch, int row0) {
    Mbarrier& full = smem.v_full[pipe.stage];
    full.arrive_expect_tx(T::kVTileBytes);
#pragma unroll
    for (int b = 0; b < T::kVColBlocks; ++b) {
      if constexpr (T::kFp8) {
        load_rows<T::kVLoadRows>(&args.v, full, smem.v[pipe.stage] + b * kHeadDimV * kSwizzleCols,
                                 n_block * kBlockN + b * kSwizzleCols, 0, head_kv, batch);
      } else {
        load_rows<T::kVLoadRows>(&args.v, full, smem.v[pipe.stage] + b * kBlockN * kSwizzleCols,
                                 b * kSwizzleCols, row0 + n_block * kBlockN, head_kv, batch);
      }
    }
  }
  // A K or V tile (16-bit, kBlockN keys) of a paged cache (kv_cache.hpp):
  // a box of args.cache.box_rows rows at a time, each from the page that
  // holds it (the page table's entries for a block are read once per column
  // block; they stay in L1).
  template <int kCols>  // K's or V's tile columns (its head dim padded)
  __device__ void load_paged(const CUtensorMap* map, Mbarrier& full, Element* tile, int n_block,
                             int head_kv, int table_row) {
    static_assert(!T::kFp8 && !T::kClusterKv, "paged caches: 16-bit, no clusters");
    const int box_rows = args.cache.box_rows;
    full.arrive_expect_tx(kBlockN * kCols * T::kElementBytes);
#pragma unroll
    for (int b = 0; b < kCols / kSwizzleCols; ++b) {
      for (int row = 0; row < kBlockN; row += box_rows) {
        const PageRow at = args.cache.page_row(table_row, n_block * kBlockN + row);
        tma_load(map, &full.word, tile + (b * kBlockN + row) * kSwizzleCols, b * kSwizzleCols,
                 at.row, head_kv, at.page);
      }
    }
  }

  // One column block of a K or V tile, loaded in boxes of kLoadRows rows: the
  // whole block, or (T::kClusterKv) two halves, both here when the kernel
  // runs without clusters, else this CTA's half multicast to the cluster.
  template <int kLoadRows>
  __device__ void load_rows(const CUtensorMap* map, Mbarrier& full, Element* dst, int col, int row,
                            int head, int batch) {
    if constexpr (!T::kClusterKv) {
      tma_load(map, &full.word, dst, col, row, head, batch);
    } else if (cluster_size() == 2) {
      const int half = static_cast<int>(cluster_rank());
      tma_load_multicast(map, &full.word, dst + half * kLoadRows * kSwizzleCols, 0b11, col,
                         row + half * kLoadRows, head, batch);
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        tma_load(map, &full.word, dst + half * kLoadRows * kSwizzleCols, col,
                 row + half * kLoadRows, head, batch);
      }
    }
  }

  // The producer warp's whole job.
  __device__ void load_all() {
    LoadCursor c = first_load();
    while (load_next<true>(c)) {
    }
    if constexpr (T::kClusterKv) {
      // The other CTA's consumers arrive on this CTA's empty barriers: wait
      // for their last arrivals (every stage free again) before exiting.
#pragma unroll 1
      for (int i = 0; i < T::kStages; ++i) {
        smem.k_empty[c.pipe.stage].wait(c.pipe.phase ^ 1u);
        smem.v_empty[c.pipe.stage].wait(c.pipe.phase ^ 1u);
        c.pipe.advance();
      }
    }
  }

  // A consumer thread is done reading a K or V stage. T::kClusterKv: the
  // producers of both CTAs of the cluster write that stage here, so the
  // thread arrives on both CTAs' barriers. (Every thread: a lane-dependent
  // predicate, even on a predicated arrive, costs ptxas the uniform
  // registers of the wgmma descriptors, 80 more R2UR in the d128 loop.)
  __device__ void release(Mbarrier& empty) const {
    if constexpr (T::kClusterKv) {
      empty.arrive_at(0, true);
      empty.arrive_at(1, cluster_size() == 2);
    } else {
      empty.arrive();
    }
  }

  // Without warp specialization (ablation), consumer thread 0 issues every
  // load whose buffer is free after it frees a stage, and keeps issuing while
  // it waits for data.
  __device__ void issue_ready_loads() {
    if constexpr (!T::kWarpSpecialized) {
      if (threadIdx.x == 0) {
        while (load_next<false>(loads)) {
        }
      }
      __syncwarp();
    }
  }
  __device__ void wait_full(Mbarrier& full, uint32_t parity) {
    if constexpr (!T::kWarpSpecialized) {
      if (threadIdx.x == 0) {
        while (!full.test_wait(parity)) {
          load_next<false>(loads);
        }
      }
      __syncwarp();
    }
    full.wait(parity);
  }

  // ---------------------------------------------------------------- consumer (one warpgroup)
  // S (64 x kBlockN) = Q rows of this warpgroup times K^T.
  __device__ void gemm_qk(uint32_t q_addr, uint32_t k_addr, float (&s)[T::kSAccRegs]) {
    fence_operands(s);
    mma_fence();
    const auto q = desc_k_major<T::kDescAdd>(q_addr);
    const auto k = desc_k_major<T::kDescAdd>(k_addr);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kMmaK; ++kk) {
      const int block = kk / (kSwizzleCols / kMmaK);
      const int offset = (kk % (kSwizzleCols / kMmaK)) * kMmaKBytes;
      const uint64_t a = q.at(block * kBlockM * kSwizzleRowBytes + offset);
      const uint64_t b = k.at(block * kBlockN * kSwizzleRowBytes + offset);
      mma_ss<Element, kBlockN, gmma::Major::K>(a, b, s, kk > 0);
    }
    mma_commit();
    fence_operands(s);
  }

  // O (64 x kHeadDimV) += P (registers) times V: V's rows are keys (16-bit,
  // MN-major B), or for fp8 its rows are the head dim (K-major B).
  __device__ void gemm_pv(const uint32_t (&p)[T::kPRegs], uint32_t v_addr,
                          float (&o)[T::kOAccRegs]) {
    fence_operands(o);
    mma_fence();
    const auto v = T::kFp8 ? desc_k_major<T::kDescAdd>(v_addr)
                           : desc_mn_major<T::kDescAdd>(v_addr, kBlockN * kSwizzleRowBytes);
#pragma unroll
    for (int kk = 0; kk < kBlockN / kMmaK; ++kk) {
      if constexpr (T::kFp8) {
        const int block = kk / (kSwizzleCols / kMmaK);
        const int offset = (kk % (kSwizzleCols / kMmaK)) * kMmaKBytes;
        const uint64_t b = v.at(block * kHeadDimV * kSwizzleRowBytes + offset);
        mma_rs<Element, kHeadDimV, gmma::Major::K>(&p[4 * kk], b, o);
      } else if constexpr (kHeadDimV % kSwizzleCols == 0) {
        const uint64_t b = v.at(kk * kMmaK * kSwizzleRowBytes);
        mma_rs<Element, kHeadDimV, gmma::Major::MN>(&p[4 * kk], b, o);
      } else {
        // A head dim of 1.5 column blocks (96): the whole blocks in one wgmma,
        // the last block's first columns in another, each from its block's
        // start (no descriptor runs a partial block into the next). O's
        // registers of N = 96 are those of N = 64 then N = 32.
        constexpr int kWhole = kHeadDimV / kSwizzleCols * kSwizzleCols;
        const uint32_t row = kk * kMmaK * kSwizzleRowBytes;
        mma_rs_cols<Element, kWhole, gmma::Major::MN, 0>(&p[4 * kk], v.at(row), o);
        mma_rs_cols<Element, kHeadDimV - kWhole, gmma::Major::MN, kWhole / 2>(
            &p[4 * kk], v.at(kWhole / kSwizzleCols * kBlockN * kSwizzleRowBytes + row), o);
      }
    }
    mma_commit();
    fence_operands(o);
  }

  // Ping-pong between the consumer warpgroups: a warpgroup issues its GEMMs
  // only in its turn and then hands the turn to the next one (0, 1, .., 0),
  // so one warpgroup's softmax runs while the others' GEMMs keep the tensor
  // cores busy. Each turn barrier joins the waiting warpgroup and the one
  // passing the turn.
  static constexpr uint32_t kTurnThreads = 2 * T::kWarpgroupThreads;

  __device__ static NamedBarrier turn_barrier(int warpgroup) {
    return static_cast<NamedBarrier>(static_cast<uint32_t>(NamedBarrier::kSchedulerConsumer0) +
                                     warpgroup);
  }
  __device__ static void wait_for_turn(int warpgroup) {
    if constexpr (T::kPingPong) {
      named_barrier_sync(turn_barrier(warpgroup), kTurnThreads);
    }
  }
  __device__ static void pass_turn(int warpgroup) {
    if constexpr (T::kPingPong) {
      named_barrier_arrive(turn_barrier((warpgroup + 1) % T::kConsumerWarpgroups), kTurnThreads);
    }
  }
  // Consumer 0 moves first: the last consumer pre-arrives on consumer 0's
  // turn. Once per kernel: the turns then rotate across all of the CTA's tiles.
  __device__ static void start_turns(int warpgroup) {
    if (warpgroup == T::kConsumerWarpgroups - 1) {
      pass_turn(warpgroup);
    }
  }

  // P as the A operand of the PV wgmma. 16 bits: the S accumulator layout is
  // the A fragment layout. FP8: an A register holds 4 consecutive k of one
  // row, but a thread's S registers hold keys (2t, 2t + 1) of each 8-column
  // group; registers are packed from groups (j, j + 1) as they are, so A
  // position 4t + i of every 16 is key (2t, 2t + 1, 8 + 2t, 9 + 2t)[i], and
  // the Fp8V layout stores V's keys in that order (kFp8VKeyOrder).
  __device__ void scores_to_p(const float (&s)[T::kSAccRegs], uint32_t (&p)[T::kPRegs]) {
    if constexpr (T::kFp8) {
#pragma unroll
      for (int g = 0; g < T::kSAccRegs / 8; ++g) {  // 16 keys: S registers 8g .. 8g + 7
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // row g (registers 0, 1 of a group) or g + 8 (2, 3)
          p[2 * g + r] = pack4_e4m3(s[8 * g + 2 * r], s[8 * g + 2 * r + 1], s[8 * g + 4 + 2 * r],
                                    s[8 * g + 5 + 2 * r]);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < T::kPRegs; ++i) {
        p[i] = pack2<Element>(s[2 * i], s[2 * i + 1]);
      }
    }
  }

  __device__ static void rescale_o(float (&o)[T::kOAccRegs], const float (&rescale)[2]) {
#pragma unroll
    for (int i = 0; i < T::kOAccRegs; ++i) {
      o[i] *= rescale[acc_row(i)];
    }
  }

  // FP8 descales (1 for 16 bits): the scale of row `row` of (batch, head).
  __device__ static float descale(const flash3::detail::DescaleParams& d, int batch, int heads, int head,
                                  int row) {
    if constexpr (T::kFp8) {
      // Rows past seqlen (a warpgroup's rows in a ragged last tile) take the last block.
      return __ldg(d.data + (static_cast<int64_t>(batch) * heads + head) * d.blocks_per_head +
                   min(d.by_block_rows.divide(row), d.blocks_per_head - 1));
    } else {
      return 1.0f;
    }
  }

  // Overlap order within a warpgroup, per key block n (from the last block
  // down, so the masked blocks come first):
  //   issue S_n = Q K_n^T; rescale O; issue O += P_{n+1} V_{n+1};
  //   wait S_n; softmax(S_n) while the PV GEMM runs; wait PV; P_n = S_n.
  // T::kRescaleAfterPv moves "rescale O" (by softmax(S_n)'s factor) to just
  // after the PV wait; O starts at zero, so the first block's factor is
  // never applied.
  // In the SASS the PV wait comes before the softmax unless T::kSoftmaxUnderPv
  // pins it (ptxas sinks the softmax below it; design.md, lessons).
  // FP8: the scores of block n are scaled by dq * dk_n (folded into the
  // softmax's scale_log2), and O is accumulated in units of the V descale of
  // the last block added (`o_units`, rescaled with the softmax's factor when
  // the next block's scale differs); the epilogue multiplies it back.
  __device__ void compute(const WorkOf<T>& work, int warpgroup, Pipeline& pipe, int step,
                          float (&o)[T::kOAccRegs], Softmax& softmax, float& o_units) {
    const Tile& tile = work.tile;
    decltype(auto) mask = mask_of(work);
    // (Whole tiles of the local kernels start at their window's first block.)
    const int n_begin = T::kTailSplit || T::kLocal ? work.n_begin : 0, n_end = work.n_end;
    const FragmentCoord c = FragmentCoord::current();
    const int wg_row0 = tile.m_block * kBlockM + warpgroup * kMmaM;
    const int row0 = wg_row0 + c.warp * 16 + c.row;
    const uint32_t q_addr = smem_u32(smem.q) + warpgroup * kMmaM * kSwizzleRowBytes;
    const int head_kv = args.by_kv_group.divide(tile.head);
    const int heads_kv = args.heads_q / args.heads_per_kv_head;
    // Softcap (the local kernels): scores become tanh(s * scale / softcap)
    // before the mask, and the softmax's scale softcap * log2(e).
    const bool capped = T::kLocal && args.softcap > 0.0f;
    const float q_scale_log2 =
        capped ? args.softcap * kLog2e
               : args.softmax_scale * kLog2e *
                     descale(args.q_descale, tile.batch, args.heads_q, tile.head,
                             tile.m_block * kBlockM + warpgroup * kMmaM);
    auto cap = [&](auto& s) {
      const float to_tanh = args.softmax_scale / args.softcap;
#pragma unroll
      for (float& x : s) {
        x = fast_tanh(x * to_tanh);
      }
    };
    auto k_scale = [&](int n) {
      return descale(args.k_descale, tile.batch, heads_kv, head_kv, n * kBlockN);
    };
    auto v_scale = [&](int n) {
      return descale(args.v_descale, tile.batch, heads_kv, head_kv, n * kBlockN);
    };
    auto mask_block = [&](float(&s)[T::kSAccRegs], int n) {
      if (mask.needs_mask(tile.m_block, n)) {
        mask.apply(s, row0, n * kBlockN + c.col);
      }
    };
    auto block_scale = [&](int n) { return T::kFp8 ? q_scale_log2 * k_scale(n) : q_scale_log2; };
    // The softmax of a block's scores s (all of them, or the first half):
    // with softcap, its tanh first (MUFU.TANH beside the exponentials'
    // MUFU.EX2: FlashAttention-4's exp2 on the FMA pipe, for a share of 1/4
    // to all of them, lost 5-21%, session 36), then the mask.
    auto masked_softmax = [&](auto& s, int n, float(&rescale)[2], auto&& mask_scores) {
      if constexpr (T::kLocal) {
        if (capped) {
          cap(s);
        }
      }
      mask_scores(s);
      softmax.step(s, rescale, block_scale(n));
    };
    auto softmax_step = [&](float(&s)[T::kSAccRegs], int n, float(&rescale)[2]) {
      masked_softmax(s, n, rescale, [&](float(&x)[T::kSAccRegs]) { mask_block(x, n); });
    };
    // The first block (the causal diagonal or the last keys) with its second
    // half, or all of it, hidden from every row of the warpgroup
    // (T::kSkipHiddenKeys): P is 0 there, without exponentials, maxima or
    // sums. O is still 0, so a fully hidden block leaves the softmax as it is.
    auto first_softmax_step = [&](float(&s)[T::kSAccRegs], int n, float(&rescale)[2]) {
      constexpr int kHalf = T::kSAccRegs / 2;
      const int visible = T::kSkipHiddenKeys ? mask.visible_keys(wg_row0, kMmaM, n)
                                             : kBlockN;
      if (visible > kBlockN / 2) {
        softmax_step(s, n, rescale);
        return;
      }
      if (visible > 0) {
        float(&first)[kHalf] = *reinterpret_cast<float(*)[kHalf]>(&s[0]);
        masked_softmax(first, n, rescale,
                       [&](float(&x)[kHalf]) { mask.apply(x, row0, n * kBlockN + c.col); });
      } else {
#pragma unroll
        for (int i = 0; i < kHalf; ++i) {
          s[i] = 0.0f;
        }
        rescale[0] = rescale[1] = 1.0f;
      }
#pragma unroll
      for (int i = kHalf; i < T::kSAccRegs; ++i) {
        s[i] = 0.0f;
      }
    };

    wait_full(smem.q_full, step & 1);
    if (n_end <= n_begin) {
      release_q();
      return;
    }
    if constexpr (T::kDrainIdleWarpgroups) {
      if (wg_row0 >= mask.seqlen_q) {
        drain(n_begin, n_end, warpgroup, pipe);
        return;
      }
    }
    if constexpr (T::kQkAhead) {
      static_assert(!kCausal, "the local kernels' softcap is applied in softmax_step only");
      compute_ahead(n_begin, n_end, warpgroup, pipe, q_addr, o, o_units, softmax, v_scale,
                    mask_block, block_scale);
      return;
    }
    Pipeline& k_pipe = pipe;
    float rescale[Softmax::kRows];
    uint32_t p[T::kPRegs];
    float p_units = 1.0f;  // V descale of the block whose P is in p
    {
      float s[T::kSAccRegs];
      wait_for_turn(warpgroup);
      wait_full(smem.k_full[k_pipe.stage], k_pipe.phase);
      gemm_qk(q_addr, smem_u32(smem.k[k_pipe.stage]), s);
      pass_turn(warpgroup);
      mma_wait<0>();
      fence_operands(s);
      release(smem.k_empty[k_pipe.stage]);
      issue_ready_loads();
      if (n_end - 1 == n_begin) {
        release_q();
      }
      first_softmax_step(s, n_end - 1, rescale);
      scores_to_p(s, p);
      if constexpr (T::kFp8) {
        p_units = v_scale(n_end - 1);
        o_units = p_units;
      }
    }
    Pipeline v_pipe = k_pipe;  // V of a block sits in the same stage as its K
    k_pipe.advance();
    for (int n = n_end - 2; n >= n_begin; --n) {
      float s[T::kSAccRegs];
      wait_for_turn(warpgroup);
      wait_full(smem.k_full[k_pipe.stage], k_pipe.phase);
      gemm_qk(q_addr, smem_u32(smem.k[k_pipe.stage]), s);
      if constexpr (!T::kRescaleAfterPv) {
        rescale_for_next_pv(o, rescale, o_units, p_units);
      }
      wait_full(smem.v_full[v_pipe.stage], v_pipe.phase);
      gemm_pv(p, smem_u32(smem.v[v_pipe.stage]), o);
      pass_turn(warpgroup);
      if constexpr (!T::kIntraWgOverlap) {
        mma_wait<0>();  // ablation: the PV GEMM finishes before the softmax starts
      }
      mma_wait<1>();  // S_n is ready; the PV GEMM may still run
      fence_operands(s);
      release(smem.k_empty[k_pipe.stage]);
      issue_ready_loads();
      if (n == n_begin) {
        release_q();
      }
      softmax_step(s, n, rescale);
      if constexpr (T::kFp8) {
        p_units = v_scale(n);
      }
      keep_softmax_under_pv(softmax);
      mma_wait<0>();
      fence_operands(o);
      if constexpr (T::kRescaleAfterPv) {
        rescale_for_next_pv(o, rescale, o_units, p_units);
      }
      release(smem.v_empty[v_pipe.stage]);
      issue_ready_loads();
      scores_to_p(s, p);
      v_pipe = k_pipe;
      k_pipe.advance();
    }
    last_pv(o, rescale, o_units, p_units, p, v_pipe);
  }

  // A warpgroup whose rows all lie past the tile's queries
  // (T::kDrainIdleWarpgroups): no GEMM and no softmax, only its part of the
  // protocol, per key block its turn and its releases of the K and V stages
  // (and of Q with the last block's). O stays 0 and the softmax empty, as
  // for rows that see no key; the epilogue stores none of these rows.
  __device__ void drain(int n_begin, int n_end, int warpgroup, Pipeline& pipe) {
    for (int n = n_end - 1; n >= n_begin; --n) {
      wait_for_turn(warpgroup);
      wait_full(smem.k_full[pipe.stage], pipe.phase);
      pass_turn(warpgroup);
      release(smem.k_empty[pipe.stage]);
      if (n == n_begin) {
        release_q();
      }
      wait_full(smem.v_full[pipe.stage], pipe.phase);
      release(smem.v_empty[pipe.stage]);
      issue_ready_loads();
      pipe.advance();
    }
  }

  // The last O += P V of the work (key block n_begin), after O's rescale for it.
  __device__ void last_pv(float (&o)[T::kOAccRegs], float (&rescale)[2], float& o_units,
                          float p_units, const uint32_t (&p)[T::kPRegs], const Pipeline& v_pipe) {
    if constexpr (!T::kRescaleAfterPv) {
      rescale_for_next_pv(o, rescale, o_units, p_units);
    }
    wait_full(smem.v_full[v_pipe.stage], v_pipe.phase);
    gemm_pv(p, smem_u32(smem.v[v_pipe.stage]), o);
    mma_wait<0>();
    fence_operands(o);
    release(smem.v_empty[v_pipe.stage]);
    issue_ready_loads();
  }

  // Q K^T one block ahead (T::kQkAhead): two S accumulators, so the
  // warpgroup never waits for S. Per key block n:
  //   issue S_{n-1} = Q K_{n-1}^T; rescale O; issue O += P_{n+1} V_{n+1};
  //   softmax(S_n) (S_n was waited for in the step before); wait both;
  //   P_n = S_n. (ptxas puts that wait before the softmax, as in compute().)
  // T::kNextMaxEarly: the row max of S_{n-1} is taken in the middle of the
  // exponentials of S_n (after waiting for S_{n-1} there), so the next step
  // starts with its exponentials.
  template <class VScale, class MaskBlock, class BlockScale>
  __device__ void compute_ahead(int n_begin, int n_end, int warpgroup, Pipeline& pipe,
                                uint32_t q_addr, float (&o)[T::kOAccRegs], float& o_units,
                                Softmax& softmax,
                                VScale& v_scale, MaskBlock& mask_block, BlockScale& block_scale) {
    const int n0 = n_end - 1;
    Pipeline qk_pipe = pipe;  // the next K to multiply
    Pipeline pv_pipe = pipe;  // the next V to multiply
    Pipeline s_pipe = pipe;   // the stage of the last S issued
    float rescale[Softmax::kRows];
    uint32_t p[T::kPRegs];
    float p_units = 1.0f;  // V descale of the block whose P is in p
    float sa[T::kSAccRegs], sb[T::kSAccRegs];
    auto issue_qk = [&](float(&s)[T::kSAccRegs]) {
      wait_full(smem.k_full[qk_pipe.stage], qk_pipe.phase);
      gemm_qk(q_addr, smem_u32(smem.k[qk_pipe.stage]), s);
      s_pipe = qk_pipe;
      qk_pipe.advance();
    };
    wait_for_turn(warpgroup);
    issue_qk(sa);
    pass_turn(warpgroup);
    mma_wait<0>();  // here, not in the first step: see below
    fence_operands(sa);
    release(smem.k_empty[pipe.stage]);
    issue_ready_loads();
    float next_max[Softmax::kRows];  // T::kNextMaxEarly: of the S block waited for last
    if constexpr (T::kNextMaxEarly) {
      mask_block(sa, n0);
      Softmax::row_max_quad(sa, next_max);
    }
    // One key block: kQk issues S_{n-1}, kPv issues O += P_{n+1} V_{n+1}.
    // Both are compile-time and the first and last blocks are peeled: a wgmma
    // skipped at run time, or a wait only some steps take, makes ptxas
    // serialise every wgmma of the loop (C7514/C7515).
    auto step = [&](auto qk, auto pv, int n, float(&s)[T::kSAccRegs],
                    float(&s_next)[T::kSAccRegs]) {
      constexpr bool kQk = decltype(qk)::value, kPv = decltype(pv)::value;
      wait_for_turn(warpgroup);
      if constexpr (kQk) {
        issue_qk(s_next);
      }
      if constexpr (kPv) {
        rescale_for_next_pv(o, rescale, o_units, p_units);
        wait_full(smem.v_full[pv_pipe.stage], pv_pipe.phase);
        gemm_pv(p, smem_u32(smem.v[pv_pipe.stage]), o);
      }
      pass_turn(warpgroup);
      if (n == n_begin) {
        release_q();
      }
      if constexpr (T::kNextMaxEarly) {
        // next_max is read before mid() overwrites it with S_{n-1}'s.
        softmax.template step_from_max<true>(s, next_max, rescale, block_scale(n), [&] {
          if constexpr (kQk) {
            // The first half of the exponentials stays before the wait.
            schedule_after(softmax.row_sum[0], softmax.row_sum[1]);
            mma_wait<kPv ? 1 : 0>();  // S_{n-1} (the PV GEMM may still run)
            fence_operands(s_next);
            mask_block(s_next, n - 1);
            Softmax::row_max_quad(s_next, next_max);
          }
        });
      } else {
        mask_block(s, n);
        softmax.step(s, rescale, block_scale(n));
      }
      const float units = T::kFp8 ? v_scale(n) : 1.0f;
      keep_softmax_under_pv(softmax);
      mma_wait<0>();
      fence_operands(o);
      fence_operands(s_next);
      if constexpr (kPv) {
        release(smem.v_empty[pv_pipe.stage]);
        pv_pipe.advance();
      }
      if constexpr (kQk) {
        release(smem.k_empty[s_pipe.stage]);
      }
      issue_ready_loads();
      scores_to_p(s, p);
      p_units = units;
      if constexpr (!kPv && T::kFp8) {
        o_units = units;
      }
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if (n0 == n_begin) {
      step(No{}, No{}, n0, sa, sb);
    } else {
      step(Yes{}, No{}, n0, sa, sb);
      for (int n = n0 - 1;; n -= 2) {  // S_n is in sb
        if (n == n_begin) {
          step(No{}, Yes{}, n, sb, sa);
          break;
        }
        step(Yes{}, Yes{}, n, sb, sa);
        if (n == n_begin + 1) {
          step(No{}, Yes{}, n_begin, sa, sb);
          break;
        }
        step(Yes{}, Yes{}, n - 1, sa, sb);
      }
    }
    last_pv(o, rescale, o_units, p_units, p, pv_pipe);
    pipe = qk_pipe;
  }

  // T::kSoftmaxUnderPv: the softmax's row sums (fed by every exponential)
  // feed a scheduling fence just before the PV wait, so ptxas cannot sink
  // the softmax below that wait.
  __device__ static void keep_softmax_under_pv(const Softmax& softmax) {
    if constexpr (T::kSoftmaxUnderPv) {
      schedule_after(softmax.row_sum[0], softmax.row_sum[1]);
    }
  }

  // The tile's last Q K^T GEMM is done: free the Q tile here if
  // Traits::kEarlyQRelease, else the epilogue frees it once its TMA store
  // has read the staging rows.
  __device__ void release_q() {
    if constexpr (T::kEarlyQRelease) {
      smem.q_empty.arrive();
    }
  }

  // Before O += P V of the block whose V descale is p_units: the softmax's
  // factor, and for fp8 the change of units from o_units to p_units.
  __device__ static void rescale_for_next_pv(float (&o)[T::kOAccRegs], float (&rescale)[2],
                                             float& o_units, float p_units) {
    if constexpr (T::kFp8) {
      const float units = __fdividef(o_units, p_units);  // no IEEE division in the loop
      rescale[0] *= units;
      rescale[1] *= units;
      o_units = p_units;
    }
    if constexpr (T::kSkipUnchangedRescale) {
      // A row's running max rarely moves after its first blocks: when no row
      // of the warp changed scale, O stays as it is (a warp-uniform branch).
      if (__all_sync(0xffffffffu, rescale[0] == 1.0f && rescale[1] == 1.0f)) {
        return;
      }
    }
    rescale_o(o, rescale);
  }
};

}  // namespace flash3::sm90::fwd
