// The one table of backward-kernel choices per head dim, and every size
// derived from it.
#pragma once

#include <cutlass/numeric_types.h>

#include "flash3/flash3.hpp"
#include "sm90/common/element.cuh"
#include "sm90/common/register_budget.hpp"
#include "sm90/common/wgmma.cuh"
#include "workspace.hpp"

namespace flash3::sm90::bwd {

// kBlockN: key rows per CTA, whose dK and dV (fp32) stay in the consumer
//          warpgroups' registers across the query blocks: 64 keys each (128
//          keys), or at head dim 256, where 64 keys x 256 of dK and dV would
//          take 256 registers a thread, the same 64 keys and half the head dim
//          of dK and dV each (Traits::kDimSplit).
// kBlockM: query rows per step; S^T and dP^T are 64 keys x kBlockM per
//          warpgroup (kBlockM / 2 floats per thread each).
// kStages: depth of the Q and dO rings.
// Shared memory: K and V (kBlockN x D each), kStages x (Q, dO) tiles of
// kBlockM x D, two dS^T tiles of kBlockN x kBlockM, the fp32 dQ tile
// (kBlockM x D), and per stage kBlockM log-sum-exps and dO.O row sums.
// kSharedSpace: the shared storage kept in the shared address space (LDS /
//          STS; wgmma descriptors as the tile's plus an offset,
//          common/shared_memory.cuh), else reached through its generic
//          address (descriptors made from each address).
// kKFirst: the producer loads K, the first Q, then V and the first dO, so
//          that the first S^T GEMM waits for K and Q alone; else K and V
//          first.
// kDqAtomic: the consumers add their dQ into the workspace from registers
//          (vector reductions, red.global.add.v4.f32) instead of staging it
//          for the dQ writer's bulk reduce-add (FlashAttention-3's head dim
//          256 adds dQ with atomics too).
// kScoresAhead: a step issues the next step's S^T GEMM once its dQ is
//          staged, so that the GEMM runs while the warpgroup hands dQ over
//          and the next step waits for dO (non-split kernels).
// kDkLast: a step's dK GEMM issued after its dQ GEMM (FlashAttention-3's
//          order), so that dQ's hand-off runs under it; Q's stage is
//          released after it.
// Measured (H100, same process, scripts/bench-ab, design.md 'Backward
// step order'): head dim 64 takes kScoresAhead, 128 (and 96) kDkLast, 256
// kDqAtomic and kDkLast; both switches together spill (64) or serialise
// the wgmmas (128: C7512). Head dim 256 keeps the older storage pair: on
// the H100 the shared space cost it 4-11% non-causal and K first 8% causal
// at 1k, where every other head dim gained (design.md, 'Backward kernel
// shape').
// Per (head dim, v's head dim); a v narrower than q ((192, 128)) takes q's
// head dim's tiles.
template <int kHeadDim, int kHeadDimV = kHeadDim>
struct TileConfig : TileConfig<kHeadDim, kHeadDim> {};
template <>
struct TileConfig<64> {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kSharedSpace = true, kKFirst = true, kDqAtomic = false;
  static constexpr bool kScoresAhead = true, kDkLast = false;
};
template <>
struct TileConfig<128> {
  // 32 + 32 KB K, V + 2 x (16 + 16) KB Q, dO + 2 x 16 KB dS + 32 KB dQ = 192 KB.
  static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2;
  static constexpr bool kSharedSpace = true, kKFirst = true, kDqAtomic = false;
  static constexpr bool kScoresAhead = false, kDkLast = true;
};
template <>
struct TileConfig<96> : TileConfig<128> {
  // Head dim 96: head dim 128's tiles (the rows padded to two column blocks,
  // the last 32 columns TMA's zeros), so the same 192 KB less dQ's 8 KB.
};
template <>
struct TileConfig<192> {
  // As 256 (kDimSplit), the head dim split at whole column blocks, 128 + 64
  // (Traits::dkv_cols): 24 + 24 KB K, V + 2 x (24 + 24) KB Q, dO + 2 x 8 KB
  // dS + 48 KB dQ + 2 x 8 KB P = 224 KB.
  static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2;
  static constexpr bool kSharedSpace = true, kKFirst = true, kDqAtomic = false;
  static constexpr bool kScoresAhead = false, kDkLast = false;
};
template <>
struct TileConfig<64, 256> {
  // FlashAttention-3's (64, 256): head dim 256's split (kDimSplit) over the
  // wide dims, dV's 256 columns 128 a warpgroup; dK's and dQ's 64 are one
  // column block each, so warpgroup 0 takes all of dK and warpgroup 1 all of
  // dQ (Traits::kDkvUneven). 8 + 32 KB K, V + 2 x (8 + 32) KB Q, dO + 2 x 8
  // KB dS + 16 KB dQ + 2 x 8 KB P = 168 KB.
  static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2;
  static constexpr bool kSharedSpace = true, kKFirst = true, kDqAtomic = false;
  static constexpr bool kScoresAhead = false, kDkLast = false;
};
template <>
struct TileConfig<256> {
  // dQ added from registers (kDqAtomic), so that a second Q / dO stage fits:
  // 32 + 32 KB K, V + 2 x (32 + 32) KB Q, dO + 2 x 8 KB dS + 2 x 8 KB P =
  // 224 KB (a staged dQ tile, 64 KB, left one stage).
  static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2;
  static constexpr bool kSharedSpace = false, kKFirst = false, kDqAtomic = true;
  static constexpr bool kScoresAhead = false, kDkLast = true;
};

// The deterministic mode's configuration: where dQ comes from registers
// (kDqAtomic), the consumers would wait for each key block's turn on their
// own path (head dim 256 lost 25-40% to its default that way), so the
// deterministic kernels stage dQ for the writer warp, which waits instead,
// with one Q / dO stage (the staging tile takes the second's space) and
// the step order that went with it. The tiles, and so the workspace, stay.
// kOwnKernels: whether this changes anything (else the default kernels run).
template <class Config, bool kDeterministic>
struct ConfigFor : Config {};
template <class Config>
struct ConfigFor<Config, true> : Config {
  static constexpr bool kOwnKernels = Config::kDqAtomic;
  static constexpr int kStages = Config::kDqAtomic ? 1 : Config::kStages;
  static constexpr bool kDqAtomic = false;
  static constexpr bool kDkLast = Config::kDkLast && !Config::kDqAtomic;
};

// kHeadDimV_: v's, dO's and out's head dim, and so dV's (FlashAttention-3's
// dv); q's, k's, dQ's and dK's is kHeadDim_. kDeterministic_: the
// deterministic mode's kernels where their configuration differs
// (ConfigFor).
template <DType kDType, int kHeadDim_, int kHeadDimV_ = kHeadDim_, bool kDeterministic_ = false>
struct Traits {
  using Config = ConfigFor<TileConfig<kHeadDim_, kHeadDimV_>, kDeterministic_>;
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;
  static constexpr bool kSharedSpace = Config::kSharedSpace;
  static constexpr bool kKFirst = Config::kKFirst;
  static constexpr bool kDqAtomic = Config::kDqAtomic;
  static constexpr bool kScoresAhead = Config::kScoresAhead;
  static constexpr bool kDkLast = Config::kDkLast;
  static_assert(kBlockM == block_m(kHeadDim, kHeadDimV) && kBlockN == block_n(kHeadDim, kHeadDimV),
                "workspace.hpp sizes the workspace with these tiles");

  // Warp roles: warpgroup 0 holds the producer warp (TMA loads) and the two
  // dQ writer warps (bulk reduce-adds of dQ); the two others each own 64 keys,
  // or (kDimSplit) both the same 64 keys and half the head dim of dK and dV
  // each (64 keys x 256 of dK and dV would be 256 registers a thread), one
  // computing S^T and P^T, the other dP^T and dS^T (Mainloop::compute_split).
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kKeyWarpgroups = kBlockN / kMmaM;  // warpgroups the keys are split over
  static constexpr bool kDimSplit = kKeyWarpgroups == 1;
  static_assert(kKeyWarpgroups == 1 || kKeyWarpgroups == kConsumerWarpgroups, "tile shape");
  static constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
  static constexpr int kThreads = kWarpgroupThreads + kConsumerThreads;
  using Registers = RegisterBudget<kConsumerThreads>;  // common/register_budget.hpp
  static constexpr int kProducerRegisters = Registers::kProducerRegisters;
  static constexpr int kConsumerRegisters = Registers::kConsumerRegisters;
  static_assert(Registers::kReleaseCoversGrowth && Registers::kFitsTheSm,
                "setmaxnreg: the producer must release what the consumers take, within the SM");

  static constexpr int kElementBytes = static_cast<int>(sizeof(Element));
  static constexpr int kSwizzleCols = kSwizzleRowBytes / kElementBytes;
  // The tiles' columns: the head dim rounded up to whole column blocks (96:
  // 128, TMA's zeros past 96, which the boxes' byte counts include). GEMMs
  // whose N is the head dim (MN-major B: dV, dK, dQ) run over its whole
  // blocks and then its last part, each from a block's start (mma_*_cols).
  static constexpr int kHeadDimPadded = (kHeadDim + kSwizzleCols - 1) / kSwizzleCols * kSwizzleCols;
  static constexpr int kColBlocks = kHeadDimPadded / kSwizzleCols;
  static constexpr int kHeadDimVPadded =
      (kHeadDimV + kSwizzleCols - 1) / kSwizzleCols * kSwizzleCols;
  static constexpr int kColBlocksV = kHeadDimVPadded / kSwizzleCols;  // v's, dO's
  static constexpr int kKTileBytes = kBlockN * kHeadDimPadded * kElementBytes;
  static constexpr int kVTileBytes = kBlockN * kHeadDimVPadded * kElementBytes;
  static constexpr int kRowBytes = kBlockM * static_cast<int>(sizeof(float));  // LSE or dpsum

  // Per consumer thread: S^T, dP^T (64 keys x kBlockM), their 16-bit forms
  // as A fragments, and dK, dV (64 keys x kDkvCols of the head dim).
  static constexpr int kSAccRegs = kBlockM / 2;
  static constexpr int kPRegs = kSAccRegs / 2;
  // kDimSplit: the head dim's column blocks over the two warpgroups, the
  // first taking the larger part where they do not halve (192: 128 + 64).
  static constexpr int kHeadBlocks = kColBlocks;
  static constexpr bool kDkvUneven = kDimSplit && kHeadBlocks % 2 == 1;
  static constexpr int kDkvCols0 = kDimSplit ? (kHeadBlocks + 1) / 2 * kSwizzleCols : kHeadDim;
  static constexpr int kDkvCols1 = kDimSplit ? kHeadBlocks / 2 * kSwizzleCols : kHeadDim;
  static constexpr int kDkvCols = kDkvCols0;  // the larger part: the registers' size
  static constexpr int kDkvAccRegs = kDkvCols / 2;
  // A consumer warpgroup's first key in the CTA's block, and its columns of
  // dK and dV.
  static constexpr int key_offset(int warpgroup) { return kDimSplit ? 0 : warpgroup * kMmaM; }
  static constexpr int dkv_cols(int warpgroup) { return warpgroup == 0 ? kDkvCols0 : kDkvCols1; }
  static constexpr int dkv_col_offset(int warpgroup) {
    return kDkvUneven ? (warpgroup == 1 ? kDkvCols0 : 0) : kDimSplit ? warpgroup * kDkvCols : 0;
  }
  // dV's columns, split as dK's are but over kHeadDimV's column blocks.
  static constexpr bool kDvUneven = kDimSplit && kColBlocksV % 2 == 1;
  static constexpr int kDvCols0 = kDimSplit ? (kColBlocksV + 1) / 2 * kSwizzleCols : kHeadDimV;
  static constexpr int kDvCols1 = kDimSplit ? kColBlocksV / 2 * kSwizzleCols : kHeadDimV;
  static constexpr int kDvCols = kDvCols0;
  static constexpr int kDvAccRegs = kDvCols / 2;
  static constexpr int dv_cols(int warpgroup) { return warpgroup == 0 ? kDvCols0 : kDvCols1; }
  static constexpr int dv_col_offset(int warpgroup) {
    return kDvUneven ? (warpgroup == 1 ? kDvCols0 : 0) : kDimSplit ? warpgroup * kDvCols : 0;
  }
  // dQ (kBlockM x headdim) of a step: each consumer warpgroup computes
  // kDqCols columns of every 64-row group of it; or (kDqKeySplit: the
  // halves of 96 columns would run from inside a column block into the
  // next, which no MN-major descriptor describes) every column over its own
  // 64 keys, the two partial sums added in the staging tile.
  static constexpr bool kDqKeySplit =
      !kDimSplit && (kHeadDim / kConsumerWarpgroups) % kSwizzleCols != 0 &&
      kSwizzleCols % (kHeadDim / kConsumerWarpgroups) != 0;
  // Uneven (192): warpgroup 0, holding the larger dK/dV part, takes the
  // smaller dQ part, the last columns (64), warpgroup 1 the first 128.
  static constexpr int kDqWarpgroups = kDqKeySplit ? 1 : kConsumerWarpgroups;  // column parts
  static constexpr int kDqRowGroups = kBlockM / kMmaM;
  static constexpr int kDqCols0 = kDkvUneven ? kDkvCols1 : kHeadDim / kDqWarpgroups;
  static constexpr int kDqCols1 = kDkvUneven ? kDkvCols0 : kHeadDim / kDqWarpgroups;
  static constexpr int kDqCols = kDqCols0 > kDqCols1 ? kDqCols0 : kDqCols1;  // registers' size
  static constexpr int kDqAccRegs = kDqCols / 2;  // per row group
  static constexpr int dq_cols(int warpgroup) { return warpgroup == 0 ? kDqCols0 : kDqCols1; }
  static constexpr int dq_col_offset(int warpgroup) {
    return kDqKeySplit ? 0 : kDkvUneven ? (warpgroup == 0 ? kDqCols1 : 0) : warpgroup * kDqCols0;
  }
  // Part w's float4 chunks in the workspace's thread order, and where they begin.
  static constexpr int dq_chunks(int warpgroup) { return kDqRowGroups * dq_cols(warpgroup) / 8; }
  static constexpr int dq_chunk_base(int warpgroup) { return warpgroup == 0 ? 0 : dq_chunks(0); }
  static constexpr int kDqTileFloats = kBlockM * kHeadDim;

  static_assert(kHeadDim % 16 == 0 && kBlockM % kSwizzleCols == 0,
                "whole 16-column steps; query tiles fill whole swizzle rows");
  // A warpgroup's columns of an MN-major operand (Mainloop's gemm_dq and
  // gemm_accumulate_kv*): whole swizzle blocks, or (dQ) a part of one; a
  // range that starts inside a block and runs into the next has no
  // descriptor. Head dim 192 split in two 96-column halves would be one
  // (design.md: its backward).
  static_assert(!kDimSplit || (kDkvCols0 % kSwizzleCols == 0 && kDkvCols1 % kSwizzleCols == 0 &&
                                kDvCols0 % kSwizzleCols == 0 && kDvCols1 % kSwizzleCols == 0),
                "a warpgroup's dK/dV columns start a swizzle block");
  static_assert(kDqKeySplit || kDkvUneven || kDqCols % kSwizzleCols == 0 ||
                    kSwizzleCols % kDqCols == 0,
                "a warpgroup's dQ columns are whole swizzle blocks or within one");
  static_assert(!kDqKeySplit || kKeyWarpgroups == 2, "the key split adds two partial sums");
  static_assert(kDqAccRegs % 4 == 0, "dQ leaves in float4 chunks");
  static_assert(!(kDimSplit && kScoresAhead), "compute_split issues no S^T ahead");
};

}  // namespace flash3::sm90::bwd
