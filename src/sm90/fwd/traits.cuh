// The one table of forward-kernel choices per (dtype, head dim), and every
// size derived from it.
#pragma once

#include <cutlass/numeric_types.h>

#include <type_traits>

#include "flash3/flash3.hpp"
#include "kernel_args.cuh"
#include "sm90/common/element.cuh"
#include "sm90/common/register_budget.hpp"
#include "sm90/common/wgmma.cuh"

namespace flash3::sm90::fwd {

// kShort: the variant for short sequences, which launch.cuh takes for
// seqlen_q up to kShortMaxSeqlen<kFp8, kHeadDim, kCausal> (0: none).
// kHeadDimV: V's and O's head dim (head_dims.hpp: ForwardValueDims), the
// same as Q's and K's but where a head dim has another.
template <int kHeadDim, bool kCausal, bool kShort, int kHeadDimV = kHeadDim>
struct TileConfig;
template <bool kFp8, int kHeadDim, bool kCausal>
inline constexpr int kShortMaxSeqlen = 0;

// Details of the key-block loop (Traits says what each does), off unless a
// tile config turns them on, and kUniformWarpgroupIndex, on unless one turns
// it off. Their effect is not monotone: each changes how ptxas schedules and
// allocates the whole loop, and the same change gains on one kernel and loses
// on another (the four sum chains lose fp8 d128 non-causal and gain fp8 d256
// non-causal). So each is set by measurement; each kernel's SASS was checked
// identical (md5 of the instruction text) to the build that was timed. The
// A/Bs behind every choice below: docs/performance.md, 'Forward tuning
// record'.
struct LoopDefaults {
  static constexpr bool kSumChains = false;
  static constexpr bool kSkipUnchangedRescale = false;
  static constexpr bool kQkAhead = false;
  static constexpr bool kNextMaxEarly = false;
  static constexpr bool kSoftmaxUnderPv = false;
  static constexpr bool kUniformWarpgroupIndex = true;
  static constexpr bool kKvMulticast = false;
  static constexpr bool kTailSplit = false;
  static constexpr bool kDeferOStoreWait = false;
  static constexpr bool kDescAdd = false;
  static constexpr bool kRescaleAfterPv = false;
  static constexpr int kMaxSlackLog2 = 0;
  static constexpr bool kSkipHiddenKeys = false;
};

// kBlockM: query rows per CTA (64 per consumer warpgroup).
// kBlockN: key rows per pipeline stage; the S accumulator is kBlockN/2 floats
//          per thread, P kBlockN/4 registers, O kHeadDim/2 floats.
// kStages: depth of the K and V rings.
// kOStore: how O leaves (epilogue.cuh; Traits::kOStore).
// Shared memory: Q kBlockM x D, plus 2 x kStages tiles of kBlockN x D, plus
// an O tile of kBlockM x D if kOStore is kSeparateTile.
template <bool kCausal, bool kShort>
struct TileConfig<64, kCausal, kShort, 64> : LoopDefaults {
  // O is only 32 registers, so three consumer warpgroups (192 query rows)
  // share each K/V tile, and the turns rotate over three; 24 KB Q + 6 x 16 KB
  // K/V, so a deeper ring is free. Short causal sequences take 128 rows (two
  // consumer warpgroups): fewer rows wasted on the diagonal and more tiles to
  // balance. Not non-causal: 128 rows lose at every length.
  static constexpr int kBlockM = kShort && kCausal ? 128 : 192, kBlockN = 128, kStages = 3;
  // The short variants stage O in a tile of its own (24 KB more;
  // Traits::kOStore), its store's read waited for late: faster. Longer
  // sequences stay direct (staged is equal or slower there).
  static constexpr OStore kOStore = kShort ? OStore::kSeparateTile : OStore::kDirect;
  static constexpr bool kDeferOStoreWait = kShort;
  // Causal: four sum chains and skipping unchanged rescales: faster, and no
  // spill.
  static constexpr bool kSumChains = kCausal, kSkipUnchangedRescale = kCausal;
  // Non-causal: K and V shared by two-CTA clusters (Traits::kClusterKv);
  // faster at every length measured.
  static constexpr bool kKvMulticast = !kCausal;
  // Short non-causal: O rescaled right after the PV wait
  // (Traits::kRescaleAfterPv); faster despite a small spill. Not the others:
  // causal and d128 lose, long non-causal equal or slower.
  static constexpr bool kRescaleAfterPv = kShort && !kCausal;
  // The running max moved only past a slack of 2^8 (Traits::kMaxSlackLog2):
  // faster non-causal and long causal. Not the short causal variant: it
  // loses.
  static constexpr int kMaxSlackLog2 = kShort && kCausal ? 0 : 8;
  // Long causal: the hidden keys of a tile's first block skipped
  // (Traits::kSkipHiddenKeys; with 192 rows and 128 keys a warpgroup's first
  // block is often half or wholly hidden). Not the short causal variant
  // (loses), nor non-causal (no hidden keys on the grid; slightly slower).
  static constexpr bool kSkipHiddenKeys = kCausal && !kShort;
};
template <>
inline constexpr int kShortMaxSeqlen<false, 64, true> = 2048;
template <>
inline constexpr int kShortMaxSeqlen<false, 64, false> = 1024;
template <bool kCausal, bool kShort>
struct TileConfig<128, kCausal, kShort, 128> : LoopDefaults {
  // Long non-causal: 176 keys per block amortise the softmax and barrier cost
  // over more GEMM work (S 88 + P 44 + O 64 registers); 32 KB Q + 4 x 44 KB
  // K/V = 208 KB, O staged in the Q tile. Causal and short: 128 keys (fewer
  // wasted on the diagonal and past seqlen), which leaves room for an O tile
  // of its own, so Q frees after the tile's last Q K^T GEMM and the next
  // tile's Q load overlaps this tile's last PV GEMM and epilogue: 32 KB Q +
  // 32 KB O + 4 x 32 KB K/V = 192 KB. Faster causal (equal at 16k) and
  // non-causal below 4k, hence the short non-causal variant.
  static constexpr bool kOApart = kCausal || kShort;
  static constexpr int kBlockM = 128, kBlockN = kOApart ? 128 : 176, kStages = 2;
  static constexpr OStore kOStore = kOApart ? OStore::kSeparateTile : OStore::kInQTile;
  // Four sum chains. Causal: with skipping unchanged rescales (which now
  // comes with kMaxSlackLog2 below), faster. Non-causal: faster once the max
  // slack skips most rescales. (Descriptor adds for non-causal then: a
  // fraction of a percent, not taken.)
  static constexpr bool kSumChains = true;
  // Non-causal: two-CTA clusters share K and V (Traits::kClusterKv); faster
  // in short runs and sustained under the power cap.
  static constexpr bool kKvMulticast = !kCausal;
  // The last wave split in pieces (Traits::kTailSplit), where a step has
  // kMinSplitStepBlocks (grid.hpp) key blocks or more: faster causal from 4k
  // and long non-causal. Not the short non-causal variant (it had under 32
  // blocks a step when this was measured).
  static constexpr bool kTailSplit = kCausal || !kShort;
  // With the O tile apart, its store's read waited for before the next write
  // (Traits::kDeferOStoreWait): faster causal and short non-causal.
  static constexpr bool kDeferOStoreWait = kOApart;
  // Causal: descriptors as the tile's plus an offset (Traits::kDescAdd):
  // faster or equal at every length. Non-causal: equal. The turn around the
  // exponentials (design.md, lessons) lost both.
  static constexpr bool kDescAdd = kCausal;
  // The running max moved only past a slack of 2^8 (Traits::kMaxSlackLog2):
  // faster causal and non-causal, bf16 and fp16.
  static constexpr int kMaxSlackLog2 = 8;
};
template <>
inline constexpr int kShortMaxSeqlen<false, 128, false> = 2048;
template <bool kCausal, bool kShort>
struct TileConfig<96, kCausal, kShort, 96> : TileConfig<128, kCausal, kShort, 128> {
  // Head dim 96 (issue 25): 1.5 swizzle blocks a row, so its tiles are laid
  // out as head dim 128's (the second block half empty: TMA fills the
  // columns past 96 with zeros), the Q K^T GEMM reduces over 96 and the PV
  // GEMM covers 64 + 32 columns (Mainloop::gemm_pv). Head dim 128's choices,
  // not yet measured at 96: the same shared memory, 16 fewer O registers.
};
template <>
inline constexpr int kShortMaxSeqlen<false, 96, false> = 2048;
// Head dim 256's loop details (TileConfig<256> says why each), shared by the
// head dims whose O takes most of the registers.
template <bool kCausal>
struct WideHeadLoop : LoopDefaults {
  static constexpr OStore kOStore = kCausal ? OStore::kInVStages : OStore::kInQTile;
  static constexpr bool kSoftmaxUnderPv = true;
  static constexpr bool kDescAdd = kCausal;
  static constexpr int kMaxSlackLog2 = 8;
  static constexpr bool kSumChains = true;
  static constexpr bool kSkipHiddenKeys = kCausal;
};
template <bool kCausal, bool kShort, int kHeadDimV>
struct TileConfig<192, kCausal, kShort, kHeadDimV> : WideHeadLoop<kCausal> {
  // FlashAttention-3's tiles (issue 25; design.md): 128 x 112 for (192, 192),
  // O 96 registers per thread, S 56, P 28, 48 KB Q + 2 x (42 + 42) KB K/V =
  // 216 KB; 128 x 128 for V's head dim 128 (DeepSeek's (192, 128)), O 64,
  // S 64, P 32, 48 KB Q + 2 x (48 + 32) KB K/V = 208 KB. Head dim 256's
  // loop details (WideHeadLoop), not measured at 192; no short variant.
  static_assert(kHeadDimV == 192 || kHeadDimV == 128, "V head dims of 192");
  static constexpr int kBlockM = 128, kBlockN = kHeadDimV == 128 ? 128 : 112, kStages = 2;
};
template <bool kCausal, bool kShort>
struct TileConfig<256, kCausal, kShort, 256> : WideHeadLoop<kCausal> {
  // O alone takes 128 registers per thread, so S stays at 80 columns (40
  // regs); 64 KB Q + 4 x 40 KB K/V = 224 KB, the most that fits. Short causal
  // sequences take 64 keys (less waste on the diagonal). Not non-causal: it
  // loses with 64 keys.
  static constexpr int kBlockM = 128, kBlockN = kShort ? 64 : 80, kStages = 2;
  // Its loop details (WideHeadLoop), each measured here:
  // - causal: O staged in the V ring (OStore::kInVStages), so Q frees after
  //   the last Q K^T GEMM and the next tile's Q load no longer waits for the
  //   O store (a clock64 trace showed that wait, and its drop); faster. A
  //   first version that picked the stage per step lost non-causal, so
  //   non-causal keeps O in Q;
  // - the softmax pinned under the PV GEMM (Traits::kSoftmaxUnderPv): faster
  //   bf16 and fp16, causal and non-causal (512 equal);
  // - causal: descriptors as the tile's plus an offset (Traits::kDescAdd),
  //   faster up to 4k; non-causal equal or slightly slower. The turn around
  //   the exponentials (design.md, lessons) lost;
  // - the running max moved only past a slack of 2^8 (Traits::kMaxSlackLog2):
  //   faster at every length, causal and non-causal; with it, the four sum
  //   chains (OnlineSoftmax): faster or equal;
  // - causal: the hidden keys of a tile's first block skipped
  //   (Traits::kSkipHiddenKeys; at 64 keys the first block of the first
  //   warpgroup is wholly hidden): faster up to 4k.
  // No two-CTA clusters (Traits::kClusterKv): with two 80-key stages the
  // pair's lockstep probably costs more than the L2 traffic saves (non-causal
  // loses).
};
template <>
inline constexpr int kShortMaxSeqlen<false, 256, true> = 1024;
template <bool kCausal, bool kShort>
struct TileConfig<64, kCausal, kShort, 256> : WideHeadLoop<kCausal> {
  // V and O of head dim 256 beside q and k of 64 (FlashAttention-3's dv !=
  // d): O takes 128 registers per thread as at 256, so head dim 256's 80
  // keys (S 40, P 20 registers); 16 KB Q + 2 x (10 + 40) KB K/V + 64 KB O
  // = 180 KB, O staged in a tile of its own (Q's 16 KB cannot hold it; the V
  // stages could, but not under the decoding kernels' tail split). Head dim
  // 256's loop details (WideHeadLoop), not measured here.
  static constexpr int kBlockM = 128, kBlockN = 80, kStages = 2;
  static constexpr OStore kOStore = OStore::kSeparateTile;
};

// FP8 (e4m3) inputs: the GEMMs run at twice the rate, so a key block costs
// half as long, and the ring needs more depth or larger blocks to keep up.
// Shared memory: Q kBlockM x D bytes, 2 x kStages tiles of kBlockN x D bytes,
// plus a separate 16-bit O staging tile (the 1-byte Q tile is too small).
template <int kHeadDim, bool kCausal, bool kShort>
struct TileConfigFp8;
template <bool kCausal, bool kShort>
struct TileConfigFp8<128, kCausal, kShort> : LoopDefaults {
  // 16 KB Q + 32 KB O + 4 x 2 x 16 KB K/V = 176 KB.
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 4;
  static constexpr OStore kOStore = OStore::kSeparateTile;
  // Non-causal: Q K^T one block ahead (Traits::kQkAhead; S 2 x 64 + P 16 + O
  // 64 registers, no spill): faster. Causal spills with it and loses.
  static constexpr bool kQkAhead = !kCausal;
  // And S_{n-1}'s row max amid S_n's exponentials (Traits::kNextMaxEarly):
  // faster; the hook after 1/4 or 3/4 of them loses.
  static constexpr bool kNextMaxEarly = !kCausal;
  // Non-causal: two-CTA clusters share K and V (Traits::kClusterKv): faster
  // at 16k and sustained under the power cap (4k slightly slower).
  static constexpr bool kKvMulticast = !kCausal;
  // Non-causal: the last wave split in pieces (Traits::kTailSplit): faster
  // from 8k; 4k lost, and unsplit, shorter sequences lost to the kernel's
  // other code, hence a short variant without it. Causal lost when split.
  static constexpr bool kTailSplit = !kCausal && !kShort;
};
template <>
inline constexpr int kShortMaxSeqlen<true, 128, false> = 4096;
template <bool kCausal, bool kShort>
struct TileConfigFp8<64, kCausal, kShort> : TileConfigFp8<128, kCausal, kShort> {
  // Head dim 64 (issue 26): half a 128-byte row, so Q and K tiles are laid
  // out as head dim 128's (TMA fills the second half with zeros) and the
  // Q K^T GEMM reduces over 2 k-steps; V (Fp8V) is 64 rows of keys, O 32
  // registers. Head dim 128's choices, not yet measured at 64: 16 KB Q +
  // 16 KB O + 4 x (16 + 8) KB K/V = 128 KB.
};
template <>
inline constexpr int kShortMaxSeqlen<true, 64, false> = 4096;
template <bool kCausal, bool kShort>
struct TileConfigFp8<256, kCausal, kShort> : LoopDefaults {
  // 32 KB Q + 64 KB O + 2 x 2 x 32 KB K/V = 224 KB.
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr OStore kOStore = OStore::kSeparateTile;
  // Non-causal: four sum chains, faster. Not for causal d256 nor d128 (equal
  // or slower).
  static constexpr bool kSumChains = !kCausal;
  // Non-causal loses with the Q descriptors in uniform registers, so it keeps
  // them in regular ones.
  static constexpr bool kUniformWarpgroupIndex = kCausal;
  // Non-causal: two-CTA clusters share K and V (Traits::kClusterKv): faster.
  static constexpr bool kKvMulticast = !kCausal;
  // Non-causal: the last wave split in pieces (Traits::kTailSplit): faster
  // from 4k. Unsplit, short sequences lost to the kernel's other code, hence
  // a short variant without it (design.md, next steps). Causal gained at 16k
  // but lost at shorter lengths.
  static constexpr bool kTailSplit = !kCausal && !kShort;
  // Causal: the O store's read waited for before the next write
  // (Traits::kDeferOStoreWait): faster or equal. Not non-causal (mixed; the
  // short kernel then spills), nor fp8 d128 (slower).
  static constexpr bool kDeferOStoreWait = kCausal;
  // Causal: the hidden keys of a tile's first block skipped
  // (Traits::kSkipHiddenKeys): faster at every length. Not fp8 d128 causal
  // (faster only at 512, slower from 2k).
  static constexpr bool kSkipHiddenKeys = kCausal;
};
template <>
inline constexpr int kShortMaxSeqlen<true, 256, false> = 2048;

// Ablation switches (CMake FLASH3_ABLATION), to measure what each technique
// is worth; the default build has all three on.
#if defined(FLASH3_ABLATE_WARP_SPECIALIZATION)
inline constexpr bool kWarpSpecializationEnabled = false;
#else
inline constexpr bool kWarpSpecializationEnabled = true;
#endif
#if defined(FLASH3_ABLATE_PINGPONG)
inline constexpr bool kPingPongEnabled = false;
#else
inline constexpr bool kPingPongEnabled = true;
#endif
#if defined(FLASH3_ABLATE_INTRA_WG_OVERLAP)
inline constexpr bool kIntraWgOverlapEnabled = false;
#else
inline constexpr bool kIntraWgOverlapEnabled = true;
#endif

// A tile config for packed variable-length batches (varlen.hpp): no tail
// split and no K/V clusters (both pair tiles of one sequence length), and O
// stored straight from registers, row by row, since a TMA store clips only
// at the packed tensor's end, not at its sequence's.
template <class Config>
struct VarlenConfig : Config {
  static constexpr bool kTailSplit = false;
  static constexpr bool kKvMulticast = false;
  static constexpr OStore kOStore = OStore::kDirect;
  static constexpr bool kDeferOStoreWait = false;
};

// Key blocks of the decoding kernels (split-KV, KV cache): the tile config's,
// rounded down to a multiple of 64 rows (head dim 128: 176 -> 128; 256: 80
// -> 64), so that a paged cache's pages of 64, 128, 256 ... keys load a
// block in boxes of 64 rows or more (kv_cache.hpp: paged_box_rows). At head
// dim 128 the KV-cache kernel's blocks of 128 also read K/V 0-10% faster
// than the split-KV kernel's 176 did in the same runs (H100, session 33).
constexpr int decode_block_n(int block_n) { return block_n / 64 * 64; }

// A tile config for decode-shaped launches (decode.hpp): few tiles of many
// key blocks, cut in pieces over the SMs by the tail split.
template <class Config>
struct SplitKvConfig : Config {
  static constexpr bool kTailSplit = true;
  static constexpr int kBlockN = decode_block_n(Config::kBlockN);
};

// A tile config for a KV cache (kv_cache.hpp): each batch's own key count,
// so non-causal launches split like decoding's (causal ones cannot: their
// tail split pairs tiles of equal cost), and no K/V clusters (the pair's
// tiles would need one key count).
template <class Config, bool kCausal>
struct KvCacheConfig : Config {
  static constexpr bool kTailSplit = !kCausal;
  static constexpr bool kKvMulticast = false;
  static constexpr int kBlockN = decode_block_n(Config::kBlockN);
};

// Which sequences a kernel takes (KernelArgs): kDense, one seqlen_q and one
// seqlen_k for the whole batch; kSplitKv, the same with the tail split on
// (SplitKvConfig), for tile configs without it; kVarlen, Q, K, V, O packed
// (1, total, heads, headdim), sequences from cu_seqlens (KernelArgs::varlen);
// kKvCache, each batch's key count and K/V batch from the device
// (KernelArgs::cache).
enum class Sequences { kDense, kSplitKv, kVarlen, kKvCache };

// x rounded up to a multiple of `to`.
constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }

// kDType: of Q, K, V; kOutDType: of O (the same, or fp16/bf16 for fp8).
// kHeadDim: of Q and K; kHeadDimV: of V and O (TileConfig).
// kLocalMask: a masked (kCausal) kernel of the local variants (a sliding
// window, an attention chunk, softcap: mask.cuh's kLocal), beside the
// causal kernel of the same configuration, whose code keeps none of them.
template <DType kDType, int kHeadDimQK, int kHeadDimVO, bool kCausal, DType kOutDType = kDType,
          bool kShort = false, Sequences kSequences = Sequences::kDense, bool kLocalMask = false>
struct Traits {
  static constexpr int kHeadDim = kHeadDimQK;
  static constexpr int kHeadDimV = kHeadDimVO;
  static constexpr bool kFp8 = kDType == DType::kFloat8E4M3;
  static constexpr bool kLocal = kLocalMask;
  static_assert(!kLocal || (kCausal && !kFp8), "local kernels: masked and 16-bit");
  static constexpr bool kVarlen = kSequences == Sequences::kVarlen;
  static constexpr bool kKvCache = kSequences == Sequences::kKvCache;
  // The scheduler's causal pairs (scheduler.cuh): causal tiles only. A
  // window's tiles all cost the window but the first few of a head, so the
  // pairs of a long and a short tile that balance causal tiles unbalanced
  // them (CTAs took 34 to 66 key blocks a pair); the dense and KV-cache
  // local kernels take units of about a window (local_units.hpp), the
  // varlen ones tiles one at a time, longest first.
  static constexpr bool kCausalPairs = kCausal && !kLocal;
  static constexpr bool kLocalUnits = kLocal && !kVarlen;
  static_assert(!kFp8 || kHeadDimV == kHeadDim, "fp8: one head dim");
  using BaseConfig = std::conditional_t<kFp8, TileConfigFp8<kHeadDim, kCausal, kShort>,
                                        TileConfig<kHeadDim, kCausal, kShort, kHeadDimV>>;
  using Config = std::conditional_t<
      kVarlen, VarlenConfig<BaseConfig>,
      std::conditional_t<kKvCache, KvCacheConfig<BaseConfig, kCausal>,
                         std::conditional_t<kSequences == Sequences::kSplitKv,
                                            SplitKvConfig<BaseConfig>, BaseConfig>>>;
  static_assert(!(kVarlen || kKvCache) || !kFp8, "varlen and KV caches: 16-bit only so far");
  using Element = typename ElementOf<kDType>::type;
  using OutElement = typename ElementOf<kOutDType>::type;
  static_assert(kOutDType != DType::kFloat8E4M3, "O is 16-bit");
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;
  // The consumer warpgroups take turns issuing GEMMs (mainloop.cuh). Not for
  // fp8 non-causal, where the softmax outlasts the other warpgroup's (twice
  // as fast) GEMMs and the turns only serialise; causal fp8 keeps them (A/Bs:
  // docs/performance.md, 'Forward tuning record', Traits).
  static constexpr bool kPingPong = kPingPongEnabled && !(kFp8 && !kCausal);
  // A consumer warpgroup whose rows all lie past the tile's queries only
  // keeps its turns and releases (Mainloop::drain): decoding's packed GQA
  // tiles hold a few rows of warpgroup 0. Not in the dense kernels, whose
  // tuned plans it would move (decode-shaped launches take kSplitKv).
  static constexpr bool kDrainIdleWarpgroups = kSequences != Sequences::kDense;
  // A warpgroup's softmax of block n runs under its PV GEMM of block n+1.
  static constexpr bool kIntraWgOverlap = kIntraWgOverlapEnabled;
  // wgmma descriptors as the tile's plus an offset (TileDesc): fewer
  // uniform instructions, but ptxas's plan of the kernel moves with it
  // (TileConfig).
  static constexpr bool kDescAdd = Config::kDescAdd;
  // O takes the softmax's factor right after the PV GEMM in flight is done,
  // where ptxas interleaves it with the exponentials (as cuDNN's SASS
  // does), instead of before the next PV GEMM's issue (Mainloop::compute).
  static constexpr bool kRescaleAfterPv =
      Config::kRescaleAfterPv && !kFp8 && !Config::kQkAhead && !Config::kSoftmaxUnderPv;
  // Key-block loop details (LoopDefaults): the softmax sums a block's rows
  // in four chains (OnlineSoftmax); O's rescale is skipped when no row of
  // the warp changed its max (Mainloop::rescale_for_next_pv).
  static constexpr bool kSumChains = Config::kSumChains;
  // The running max moves only when a block's max passes it by more than
  // 2^kMaxSlackLog2 (OnlineSoftmax; the conditional rescale of
  // FlashAttention-4): P stays <= 2^8, which 16-bit P and the fp32 sums hold
  // exactly as well, and after a row's first blocks its factor stays at 1,
  // so O's rescale is skipped (kSkipUnchangedRescale) in nearly every block
  // instead of in the few where no row's max moved. Not fp8, whose P is
  // already scaled up to the top of e4m3 (fp8::kFp8ProbOffsetLog2).
  static constexpr int kMaxSlackLog2 = Config::kMaxSlackLog2;
  static_assert(!kFp8 || kMaxSlackLog2 == 0, "fp8 P has no room above its offset");
  static constexpr bool kSkipUnchangedRescale =
      Config::kSkipUnchangedRescale || kMaxSlackLog2 > 0;
  // The first key block of a tile (the causal diagonal, or the last keys)
  // with its second half or all of it hidden from a warpgroup's 64 rows:
  // that warpgroup's softmax skips the hidden part (Mainloop::compute).
  static constexpr bool kSkipHiddenKeys = Config::kSkipHiddenKeys;
  // Q K^T of block n-1 issued before the softmax of block n, into a second S
  // accumulator (Mainloop::compute_ahead), so the warpgroup never waits for S.
  static constexpr bool kQkAhead = Config::kQkAhead && kIntraWgOverlap;
  // With kQkAhead: S_{n-1}'s row max taken amid the exponentials of S_n
  // (Mainloop::compute_ahead), off the step's critical path.
  static constexpr bool kNextMaxEarly = Config::kNextMaxEarly && kQkAhead;
  // ptxas sinks the softmax below the wait for the PV GEMM it should overlap
  // (seen in the SASS of every kernel: both waits, then the exponentials);
  // this pins it between the two waits (schedule_after). The true overlap
  // loses where the softmax is long against the PV GEMM (bf16 d64 and d128,
  // fp8 d128 and d256, non-causal) and gains at d256 (TileConfig<256>).
  static constexpr bool kSoftmaxUnderPv = Config::kSoftmaxUnderPv && kIntraWgOverlap;

  // The warpgroup index from lane 0 (__shfl_sync), so that ptxas knows it is
  // warp-uniform and keeps the Q tile's wgmma descriptors in uniform
  // registers instead of regular ones copied (R2UR) before every wgmma: no
  // kernel spills with it, and d128 / d256 gain (design.md, lessons).
  static constexpr bool kUniformWarpgroupIndex = Config::kUniformWarpgroupIndex;

  // The last wave of tiles cut into pieces of key blocks shared out evenly
  // (tail_split.hpp), where grid.hpp finds it pays; kernels without it take
  // whole tiles only and carry none of its code. Split everywhere, the
  // pieces' own costs (a Q load and pipeline start each, the partial O
  // written and folded) lost on short sequences, and 16-bit d64 and d256 lost
  // at most lengths: on for the tile configs that gained.
  // (Not the local kernels: their units are whole tiles.)
  static constexpr bool kTailSplit = Config::kTailSplit && !kLocal;

  // Warp roles: warpgroup 0 produces (TMA), the others consume (wgmma +
  // softmax). Without warp specialization (ablation only) there is no
  // producer: consumer thread 0 issues the loads in between its own work
  // (Mainloop::issue_ready_loads, wait_full), and no registers move between
  // warpgroups.
  static constexpr bool kWarpSpecialized = kWarpSpecializationEnabled;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kProducerWarpgroups = kWarpSpecialized ? 1 : 0;
  static constexpr int kConsumerWarpgroups = kBlockM / kMmaM;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
  static constexpr int kThreads = kProducerWarpgroups * kWarpgroupThreads + kConsumerThreads;

  // Non-causal K and V tiles shared by a cluster of two CTAs that work on two
  // query blocks of the same head (launch.cuh launches clusters when a head's
  // query blocks pair up, else single CTAs): each CTA loads half of every K
  // and V tile and multicasts it to both, which halves the L2 -> SM traffic.
  // Under the power cap that traffic costs clock: loading K and V twice
  // lowered the sustained SM clock and throughput (bf16 and fp8 d128
  // non-causal).
  static constexpr bool kClusterKv = Config::kKvMulticast && !kCausal && kWarpSpecialized;
  static constexpr int kClusterCtas = kClusterKv ? 2 : 1;

  // setmaxnreg budgets (common/register_budget.hpp): the consumers hold S, P
  // and O.
  using Registers = RegisterBudget<kConsumerThreads>;
  static constexpr int kProducerRegisters = Registers::kProducerRegisters;
  static constexpr int kConsumerRegisters = Registers::kConsumerRegisters;
  static_assert(kConsumerWarpgroups == 2 || kConsumerWarpgroups == 3,
                "one producer plus two or three consumer warpgroups");
  static_assert(!kWarpSpecialized || Registers::kReleaseCoversGrowth,
                "setmaxnreg: the producer must release what the consumers take");
  static_assert(!kWarpSpecialized || Registers::kFitsTheSm, "register budget exceeds the SM");

  // Operand tiles: rows of kSwizzleRowBytes in column blocks of kSwizzleCols
  // elements (64 for 16 bits, 128 for fp8); a wgmma reduces over kMmaK
  // elements (32 bytes) of them.
  static constexpr int kElementBytes = static_cast<int>(sizeof(Element));
  static constexpr int kSwizzleCols = kSwizzleRowBytes / kElementBytes;
  static constexpr int kMmaK = kMmaKBytes / kElementBytes;
  // The tiles' columns: the head dims rounded up to whole column blocks (96
  // at 16 bits and 64 in fp8: 128), the columns past the head dim TMA's
  // zeros, which the boxes' byte counts include. FP8 V arrives transposed
  // (Fp8V layout: its rows are the head dim, unpadded, of kBlockN keys); O,
  // 16-bit, takes 64-column blocks of its own.
  static constexpr int kHeadDimPadded = round_up(kHeadDim, kSwizzleCols);
  static constexpr int kVTileRows = kFp8 ? kHeadDimV : kBlockN;
  static constexpr int kVTileCols = kFp8 ? kBlockN : round_up(kHeadDimV, kSwizzleCols);
  static constexpr int kOCols = round_up(kHeadDimV, kSwizzleCols16);
  static constexpr int kColBlocks = kHeadDimPadded / kSwizzleCols;  // of Q and K
  static constexpr int kQTileBytes = kBlockM * kHeadDimPadded * kElementBytes;
  static constexpr int kKTileBytes = kBlockN * kHeadDimPadded * kElementBytes;
  static constexpr int kVTileBytes = kVTileRows * kVTileCols * kElementBytes;
  // Rows of one K or V load (a TMA box): half a tile with kClusterKv.
  static constexpr int kKLoadRows = kBlockN / kClusterCtas;
  static constexpr int kVLoadRows = (kFp8 ? kHeadDim : kBlockN) / kClusterCtas;
  static constexpr int kSAccRegs = kBlockN / 2;   // 64 x kBlockN fp32 over 128 threads
  static constexpr int kPRegs = kSAccRegs * kElementBytes / 4;  // P packed in 32-bit registers
  static constexpr int kOAccRegs = kHeadDimV / 2;  // 64 x kHeadDimV fp32 over 128 threads
  static constexpr int kOColBlocks = kOCols / kSwizzleCols16;
  // FP8: V's tile is kHeadDim rows of kBlockN keys in kBlockN / 128 column
  // blocks; O gets its own staging tile.
  static constexpr int kVColBlocks = kVTileCols / kSwizzleCols;
  // How O leaves (epilogue.cuh), chosen per tile config: straight from
  // registers (4-byte global stores), staged in the warpgroup's rows of the Q
  // tile for a TMA store, staged in a tile of its own (fp8, whose 1-byte Q
  // tile is too small; d128 where 128-key blocks leave room; d64 short
  // causal), or staged in a V stage of the ring (d256 causal, which has no
  // room for a tile: the producer's next V load there waits for the store).
  // All but staging in Q free the Q tile after the last Q K^T GEMM, so the
  // next tile's Q load overlaps the last PV GEMM and the epilogue; staging in
  // Q frees it once the store has read the staging rows. Direct vs staged in
  // Q: direct is faster at d64 non-causal, slower at d128 and d256 (the
  // others: TileConfig).
  static constexpr OStore kOStore = Config::kOStore;
  // Who frees the Q tile: every consumer thread after its last Q K^T GEMM,
  // or, where O is staged in Q, each warpgroup's leader once its store has
  // read the staging rows. Freeing early is faster for fp8 d128 and d256,
  // causal and non-causal.
  static constexpr bool kEarlyQRelease = kOStore != OStore::kInQTile;
  // With an O tile of its own: the leader of a warpgroup waits for its
  // store's read of the tile before the next write to it (epilogue.cuh)
  // rather than right after issuing it, where the wait holds up the
  // warpgroup's next GEMMs (wgmma takes all four warps). It moves ptxas's
  // plan of the whole kernel, so it is set by measurement (TileConfig).
  static constexpr bool kDeferOStoreWait =
      Config::kDeferOStoreWait && kOStore == OStore::kSeparateTile;
  static constexpr int kQReleaseArrivals = kEarlyQRelease ? kConsumerThreads : kConsumerWarpgroups;
  static_assert(kHeadDim % kMmaK == 0 && kHeadDimV % 16 == 0,
                "whole 16-column steps of the Q K^T GEMM and of O's stores");
  static_assert(!kFp8 || kHeadDimV % kMmaK == 0, "fp8: PV's N in whole steps");
  static_assert(!kFp8 || kBlockN % kSwizzleCols == 0, "fp8 key blocks fill whole swizzle rows");
  static_assert(kBlockN % kMmaK16 == 0 && kBlockM % kMmaM == 0, "tile shape");
  static_assert(kKLoadRows % 8 == 0 && kVLoadRows % 8 == 0,
                "half tiles keep whole 8-row swizzle atoms");
};

}  // namespace flash3::sm90::fwd
