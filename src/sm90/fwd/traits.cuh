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
template <int kHeadDim, bool kCausal, bool kShort>
struct TileConfig;
template <bool kFp8, int kHeadDim, bool kCausal>
inline constexpr int kShortMaxSeqlen = 0;

// Details of the key-block loop (Traits says what each does), off unless a
// tile config turns them on, and kUniformWarpgroupIndex, on unless one turns
// it off. Their effect is not monotone: each changes how ptxas schedules and
// allocates the whole loop, and the same change gains on one kernel and
// loses on another (H200, same-run A/Bs, bf16 and fp8, three rounds: the four
// sum chains alone took fp8 d128 non-causal 16k from 846 to 729-767 TFLOP/s
// and fp8 d256 non-causal 16k from 1120 to 1144-1226). So each is set by
// measurement; each kernel's SASS was checked identical (md5 of the
// instruction text) to the build that was timed.
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
// kOStore: how O leaves (epilogue.cuh; Traits::kOStore has the measurements).
// Shared memory: Q kBlockM x D, plus 2 x kStages tiles of kBlockN x D, plus
// an O tile of kBlockM x D if kOStore is kSeparateTile.
template <bool kCausal, bool kShort>
struct TileConfig<64, kCausal, kShort> : LoopDefaults {
  // O is only 32 registers, so three consumer warpgroups (192 query rows)
  // share each K/V tile, and the turns rotate over three; 24 KB Q + 6 x 16 KB
  // K/V, so a deeper ring is free. Short causal sequences take 128 rows (two
  // consumer warpgroups): fewer rows wasted on the diagonal and more tiles to
  // balance. H200, bf16, same run, 192 vs 128 rows: 1k 237 vs 266, 2k 280 vs
  // 332, 4k 421 vs 379, 16k 500 vs 425 TFLOP/s. Not non-causal: 128 rows
  // lose at every length (512 363 -> 340, 2k 495 -> 426).
  static constexpr int kBlockM = kShort && kCausal ? 128 : 192, kBlockN = 128, kStages = 3;
  // The short variants stage O in a tile of its own (24 KB more;
  // Traits::kOStore), its store's read waited for late. H200, bf16, same
  // run, three rounds, direct -> staged: causal 512 202-204 -> 223-224, 1k
  // 275-278 -> 302, 2k 349-353 -> 369-372 TFLOP/s; non-causal 512 366-368
  // -> 382, 1k 424 -> 430. Longer sequences stay direct (causal 4k -1% with
  // the short variant; non-causal 2k equal, 4k -1%).
  static constexpr OStore kOStore = kShort ? OStore::kSeparateTile : OStore::kDirect;
  static constexpr bool kDeferOStoreWait = kShort;
  // Causal: four sum chains and skipping unchanged rescales, bf16, same run,
  // two rounds: 1k 259 -> 270, 4k 379 -> 401, 16k 445 -> 472 (and no spill).
  static constexpr bool kSumChains = kCausal, kSkipUnchangedRescale = kCausal;
  // Non-causal: K and V shared by two-CTA clusters (Traits::kClusterKv):
  // same run, three rounds, bf16 1k 415-419 -> 424-425, 4k 509-518 ->
  // 519-521, 16k 496-530 -> 508-529.
  static constexpr bool kKvMulticast = !kCausal;
  // Short non-causal: O rescaled right after the PV wait
  // (Traits::kRescaleAfterPv), bf16, same run, three rounds: 512 382-386
  // -> 393-396, 1k 431-435 -> 441-442 (36 bytes of spill with it). Not the
  // others: causal -1..-3%, long non-causal equal or -1%, d128 -2..-5%.
  static constexpr bool kRescaleAfterPv = kShort && !kCausal;
  // The running max moved only past a slack of 2^8 (Traits::kMaxSlackLog2),
  // bf16, same run, three rounds: non-causal 1k 438-440 -> 441-446, 2k
  // 495-498 -> 515-517, 16k 508-516 -> 528-531; causal 4k 449-450 ->
  // 462-468. Not the short causal variant: 1k 324-326 -> 308-310, 2k
  // 396-398 -> 367-370.
  static constexpr int kMaxSlackLog2 = kShort && kCausal ? 0 : 8;
  // Long causal: the hidden keys of a tile's first block skipped
  // (Traits::kSkipHiddenKeys; with 192 rows and 128 keys a warpgroup's
  // first block is often half or wholly hidden), bf16, same run, three
  // rounds: 4k 462-468 -> 474-480, 16k 506-507 -> 512-546 (and 465-468 ->
  // 478-479, 499-522 -> 514-554 in an earlier version that skipped only
  // halves). Not the short causal variant: 1k 325-328 -> 312-313, 2k
  // 396-401 -> 371-372; nor non-causal (no hidden keys on the grid; -1..-4%).
  static constexpr bool kSkipHiddenKeys = kCausal && !kShort;
};
template <>
inline constexpr int kShortMaxSeqlen<false, 64, true> = 2048;
template <>
inline constexpr int kShortMaxSeqlen<false, 64, false> = 1024;
template <bool kCausal, bool kShort>
struct TileConfig<128, kCausal, kShort> : LoopDefaults {
  // Long non-causal: 176 keys per block amortise the softmax and barrier cost
  // over more GEMM work (S 88 + P 44 + O 64 registers); 32 KB Q + 4 x 44 KB
  // K/V = 208 KB, O staged in the Q tile. Causal and short: 128 keys (fewer
  // wasted on the diagonal and past seqlen), which leaves room for an O tile
  // of its own, so Q frees after the tile's last Q K^T GEMM and the next
  // tile's Q load overlaps this tile's last PV GEMM and epilogue:
  // 32 KB Q + 32 KB O + 4 x 32 KB K/V = 192 KB. H200, bf16, same run, two
  // rounds (TFLOP/s), O in Q and 176 / 128 keys -> O apart and 128 keys:
  // causal 512 254 -> 296, 1k 358 -> 397, 2k 449 -> 480, 4k 525 -> 541,
  // 16k 583 -> 585; non-causal 512 437 -> 499, 1k 541 -> 575, 2k 610 ->
  // 619, 4k 645 -> 641, 8k 645 -> 588: short below 4k.
  static constexpr bool kOApart = kCausal || kShort;
  static constexpr int kBlockM = 128, kBlockN = kOApart ? 128 : 176, kStages = 2;
  static constexpr OStore kOStore = kOApart ? OStore::kSeparateTile : OStore::kInQTile;
  // Causal: four sum chains and skipping unchanged rescales (the skip now
  // comes with kMaxSlackLog2 below), bf16, same run, two rounds: 1k 388 ->
  // 390, 4k 523 -> 535, 16k 575 -> 598; non-causal unchanged.
  // Non-causal, once the max slack skips most rescales, the sum chains
  // too: same run, three rounds, bf16 512 525-527 -> 531-533, 1k 610-611 ->
  // 621-622, 2k 661-662 -> 676, 4k 686-687 -> 698-699, 16k 674-709 ->
  // 677-750; fp16 1k 595-596 -> 607-609, 4k 666-668 -> 677-678.
  // (Descriptor adds for non-causal then: +0.2-0.9%, not taken.)
  static constexpr bool kSumChains = true;
  // Non-causal: two-CTA clusters share K and V (Traits::kClusterKv): same
  // run, three rounds, bf16 1k 527-530 -> 539-544, 4k 600-609 -> 616-617,
  // 16k 617-659 -> 630-636; sustained (300 calls, power-capped) 16k 620 ->
  // 628 TFLOP/s.
  static constexpr bool kKvMulticast = !kCausal;
  // The last wave split in pieces (Traits::kTailSplit), where a step has
  // kMinSplitStepBlocks (grid.hpp) key blocks or more: same run, three
  // rounds, bf16 causal 4k 555-564 -> 566-576, 8k 589-597 -> 611-622, 16k
  // 606-607 -> 625-632 (1k-2k, unsplit, equal); non-causal (176-key
  // variant) 8k 631-656 -> 669-688, 16k 641-643 -> 648-654. Not the short
  // non-causal variant (it had under 32 blocks a step when this was
  // measured).
  static constexpr bool kTailSplit = kCausal || !kShort;
  // With the O tile apart, its store's read waited for before the next
  // write (Traits::kDeferOStoreWait): same run, three rounds, bf16 causal
  // 512 298-300 -> 306-309, 1k 402-406 -> 413-416, 2k 486-493 -> 497-502,
  // 4k 556-564 -> 564-565; non-causal 512 507-511 -> 513-515, 1k 587-591
  // -> 592-595.
  static constexpr bool kDeferOStoreWait = kOApart;
  // Causal: descriptors as the tile's plus an offset (Traits::kDescAdd),
  // bf16, same run, three rounds, two runs: 1k 412-418 -> 415-426 and
  // 416-420 -> 416-422, 4k 570-575 -> 576-588 and 570-576 -> 579-580, 16k
  // 626-632 -> 632-643 and 627-631 -> 630-635, 512 and 2k equal.
  // Non-causal: equal (4k within its noise). The turn around the
  // exponentials (design.md, lessons) lost causal 2-4% (4k 570-575 ->
  // 553-559) and non-causal 3-6% (cells timed apart, five rounds: 1k
  // 600-604 -> 564-569).
  static constexpr bool kDescAdd = kCausal;
  // The running max moved only past a slack of 2^8 (Traits::kMaxSlackLog2),
  // bf16, same run, three rounds: non-causal 512 510-512 -> 517-519, 1k 591
  // -> 603-604, 2k 638-639 -> 655-656, 4k 672-673 -> 687-688; causal 1k
  // 461-462 -> 470-471, 4k 630-631 -> 646, 16k 645-699 -> 712-715; fp16
  // non-causal 1k 577-578 -> 587-589, 4k 649-655 -> 660-667.
  static constexpr int kMaxSlackLog2 = 8;
};
template <>
inline constexpr int kShortMaxSeqlen<false, 128, false> = 2048;
template <bool kCausal, bool kShort>
struct TileConfig<256, kCausal, kShort> : LoopDefaults {
  // O alone takes 128 registers per thread, so S stays at 80 columns
  // (40 regs); 64 KB Q + 4 x 40 KB K/V = 224 KB, the most that fits. Short
  // causal sequences take 64 keys (less waste on the diagonal): H200, bf16,
  // same run, two rounds, 80 -> 64 keys: causal 512 295, 274 -> 305, 309;
  // 1k 432, 401 -> 432, 439; 2k equal; 4k 653, 595 -> 611, 584. Non-causal
  // loses from 1k (608 -> 573).
  static constexpr int kBlockM = 128, kBlockN = kShort ? 64 : 80, kStages = 2;
  // Causal: O staged in the V ring (OStore::kInVStages), so Q frees after
  // the last Q K^T GEMM and the next tile's Q load no longer waits for the
  // O store (the clock64 trace of CTA 0 at 1k: 11-14% of a step waiting for
  // Q; 4% after). H200, same run, bf16 causal, two rounds: 512 311-313 ->
  // 336-338, 1k 440-443 -> 457-460, 2k 575-578 -> 592-593, 4k 663-665 ->
  // 670-672. A first version that picked the stage per step (three rounds:
  // 512 +10%, 1k +6%, 2k +7%, 4k +4%; equal to this one when re-measured
  // side by side) lost non-causal from 1k (2k 691-693 -> 680-683, 16k
  // 707-750 -> 683-689), so non-causal keeps O in Q.
  static constexpr OStore kOStore = kCausal ? OStore::kInVStages : OStore::kInQTile;
  // The softmax pinned under the PV GEMM (Traits::kSoftmaxUnderPv): H200,
  // same run, two rounds, TFLOP/s, bf16 non-causal 4k 721 -> 727, 8k 733 ->
  // 758, 16k 751 -> 777; causal 1k 383 -> 392, 8k 627 -> 650; fp16
  // non-causal 16k 650 -> 683, causal 4k 555 -> 569; 512 equal.
  static constexpr bool kSoftmaxUnderPv = true;
  // No two-CTA clusters (Traits::kClusterKv): with two 80-key stages the
  // pair's lockstep probably costs more than the L2 traffic saves (same
  // run, three rounds, bf16 non-causal 1k 552-556 -> 537-542, 4k 665-669 -> 628-631,
  // 16k 695-701 -> 649-656).
  // Causal: descriptors as the tile's plus an offset (Traits::kDescAdd),
  // bf16, same run, three rounds, two runs: 512 299-301 -> 305-306 and
  // 299-302 -> 302-304, 1k 406-409 -> 412-414 and 403-409 -> 407-410, 2k
  // 530-537 -> 540-548 and 527-535 -> 534-536, 4k 604-614 -> 619-627 and
  // 601-608 -> 604-611, 16k 666-671 -> 663-668 and 648-658 -> 660-667;
  // non-causal equal or -1..-2% (2k). The turn around the exponentials
  // (design.md, lessons) lost 1-2%.
  static constexpr bool kDescAdd = kCausal;
  // The running max moved only past a slack of 2^8 (Traits::kMaxSlackLog2),
  // bf16, same run, three rounds: non-causal 512 489-491 -> 506-507, 1k
  // 622-624 -> 647-649, 2k 689-690 -> 724-727, 4k 729-731 -> 769-772, 16k
  // 697-715 -> 751-823; causal 512 334-336 -> 347-349, 1k 455 -> 483-485,
  // 4k 665-666 -> 708, 16k 671-728 -> 766-785.
  static constexpr int kMaxSlackLog2 = 8;
  // With it, the four sum chains (OnlineSoftmax): same run, three rounds,
  // bf16 non-causal 1k 644-648 -> 650-652, 2k 716-720 -> 725-727, 4k
  // 752-764 -> 769, 16k 747-803 -> 748-803; causal 2k 619-620 -> 622-623,
  // 16k 727-785 -> 774-791.
  static constexpr bool kSumChains = true;
  // Causal: the hidden keys of a tile's first block skipped
  // (Traits::kSkipHiddenKeys; at 64 keys the first block of the first
  // warpgroup is wholly hidden), bf16, same run, three rounds: 512 348 ->
  // 354-355, 1k 490 -> 500-501, 2k 629-630 -> 635, 4k 719-720 -> 724 (16k
  // within its power-capped spread).
  static constexpr bool kSkipHiddenKeys = kCausal;
};
template <>
inline constexpr int kShortMaxSeqlen<false, 256, true> = 1024;

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
  // Non-causal: Q K^T one block ahead (Traits::kQkAhead; S 2 x 64 + P 16 +
  // O 64 registers, no spill). H200, same run, three rounds, TFLOP/s, bf16
  // out: 1k 691 -> 718, 4k 831 -> 855, 16k 876 -> 896. Causal spills 72
  // bytes with it and loses (16k 766 -> 740).
  static constexpr bool kQkAhead = !kCausal;
  // And S_{n-1}'s row max amid S_n's exponentials (Traits::kNextMaxEarly):
  // same run, 4 rounds, 4k 859-862 -> 868-875, 8k 861-888 -> 896-909, 16k
  // 829-862 -> 851-872; the hook after 1/4 or 3/4 of them loses (4k 817-851).
  static constexpr bool kNextMaxEarly = !kCausal;
  // Non-causal: two-CTA clusters share K and V (Traits::kClusterKv): same
  // run, three rounds, 4k 868-872 -> 860-864, 16k 879-922 -> 906-911;
  // sustained (400 calls, power-capped) 16k 845 -> 861 at 1830 -> 1860 MHz.
  static constexpr bool kKvMulticast = !kCausal;
  // Non-causal: the last wave split in pieces (Traits::kTailSplit): same
  // run, three rounds, 16k 875-878 -> 890-900, 8k 890-891 -> 892-902; 4k
  // lost (860-864 -> 850-857), and unsplit, 1k-2k lost 5-6% to the
  // kernel's other code (1k 699-703 -> 660), hence a short variant without
  // it up to 4096. Causal 16k lost when split (802-807 -> 778-779).
  static constexpr bool kTailSplit = !kCausal && !kShort;
};
template <>
inline constexpr int kShortMaxSeqlen<true, 128, false> = 4096;
template <bool kCausal, bool kShort>
struct TileConfigFp8<256, kCausal, kShort> : LoopDefaults {
  // 32 KB Q + 64 KB O + 2 x 2 x 32 KB K/V = 224 KB.
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr OStore kOStore = OStore::kSeparateTile;
  // Non-causal: four sum chains, same run, three rounds: 4k 1120 -> 1168,
  // 16k 1115 -> 1186 TFLOP/s (bf16 out). Not for causal d256 (16k 1087 ->
  // 1079) nor d128 (causal 16k 743 -> 735; non-causal 856 -> 857).
  static constexpr bool kSumChains = !kCausal;
  // Non-causal loses with the Q descriptors in uniform registers (same run,
  // three rounds: 4k 1130, 1145, 1119 -> 1087, 1138, 1110; 16k 1189, 1201,
  // 1186 -> 1139, 1096, 1143), so it keeps them in regular ones.
  static constexpr bool kUniformWarpgroupIndex = kCausal;
  // Non-causal: two-CTA clusters share K and V (Traits::kClusterKv): same
  // run, three rounds, 4k 1072-1078 -> 1104-1132, 16k 1111-1164 ->
  // 1144-1187.
  static constexpr bool kKvMulticast = !kCausal;
  // Non-causal: the last wave split in pieces (Traits::kTailSplit): same
  // run, three rounds, 4k 1145-1165 -> 1188-1195, 8k 1187-1200 ->
  // 1254-1258, 16k 1119-1151 -> 1203-1282. Unsplit (seqlen 2k and under),
  // 512 and 1k lost 3-5% to the kernel's other code (512 728-735 ->
  // 693-698), hence a short variant without it up to 2048 (two rounds
  // against the build before the split: 512 734-745 -> 728-730, 1k 963 ->
  // 926-930; design.md, next steps). Causal gained at 16k (1111-1128 ->
  // 1160-1202) but lost 3-6% from 512 to 8k.
  static constexpr bool kTailSplit = !kCausal && !kShort;
  // Causal: the O store's read waited for before the next write
  // (Traits::kDeferOStoreWait): same run, three rounds, 1k 634-652 ->
  // 647-666, 2k 800-835 -> 821-846, 4k 919-964 -> 962-1003, 512 and 8k-16k
  // equal. Not non-causal (mixed, -1.5% at 512; the short kernel then
  // spills 44 bytes), nor fp8 d128 (causal -3..-6%, non-causal 512 -3%).
  static constexpr bool kDeferOStoreWait = kCausal;
  // Causal: the hidden keys of a tile's first block skipped
  // (Traits::kSkipHiddenKeys), same run, three rounds: 512 492-496 ->
  // 498-504, 1k 719-720 -> 729-737, 2k 913-915 -> 926-932, 4k 1056-1059 ->
  // 1065-1072, 16k 1167-1181 -> 1188-1190. Not fp8 d128 causal (512 +5%,
  // 2k-16k -3..-6%).
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

// kDType: of Q, K, V; kOutDType: of O (the same, or fp16/bf16 for fp8).
template <DType kDType, int kHeadDim, bool kCausal, DType kOutDType = kDType,
          bool kShort = false>
struct Traits {
  static constexpr bool kFp8 = kDType == DType::kFloat8E4M3;
  using Config = std::conditional_t<kFp8, TileConfigFp8<kHeadDim, kCausal, kShort>,
                                    TileConfig<kHeadDim, kCausal, kShort>>;
  using Element = typename ElementOf<kDType>::type;
  using OutElement = typename ElementOf<kOutDType>::type;
  static_assert(kOutDType != DType::kFloat8E4M3, "O is 16-bit");
  static constexpr int kHeadDimV = kHeadDim;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;
  // The consumer warpgroups take turns issuing GEMMs (mainloop.cuh). Not for
  // fp8 non-causal, where the softmax outlasts the other warpgroup's (twice
  // as fast) GEMMs and the turns only serialise: H200, same run, seqlen 16k,
  // turns off vs on: d128 757 -> 796 TFLOP/s, d256 1084 -> 1198; causal
  // d256 keeps them (1133 with, 1030 without).
  static constexpr bool kPingPong = kPingPongEnabled && !(kFp8 && !kCausal);
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
  // loses where the softmax is long against the PV GEMM (same run, 16k
  // non-causal: bf16 d128 643 -> 615, d64 562 -> 526, fp8 d128 869 -> 843,
  // fp8 d256 1239 -> 1176) and gains at d256 (TileConfig<256>).
  static constexpr bool kSoftmaxUnderPv = Config::kSoftmaxUnderPv && kIntraWgOverlap;

  // The warpgroup index from lane 0 (__shfl_sync), so that ptxas knows it is
  // warp-uniform and keeps the Q tile's wgmma descriptors in uniform
  // registers instead of regular ones copied (R2UR) before every wgmma: no
  // kernel spills with it, and d128 / d256 gain 1-3% (design.md, lessons).
  static constexpr bool kUniformWarpgroupIndex = Config::kUniformWarpgroupIndex;

  // The last wave of tiles cut into pieces of key blocks shared out evenly
  // (tail_split.hpp), where grid.hpp finds it pays; kernels without it take
  // whole tiles only and carry none of its code. Split everywhere, the
  // pieces' own costs (a Q load and pipeline start each, the partial O
  // written and folded) lost 2-6% on sequences up to 2k (bf16 d128 causal
  // 1k 410 -> 399), and 16-bit d64 and d256 lost at most lengths (same run,
  // three rounds, d256 non-causal 1k 559 -> 525-536, 16k 707-708 ->
  // 708-710): on for the tile configs that gained.
  static constexpr bool kTailSplit = Config::kTailSplit;

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
  // Under the power cap that traffic costs clock: loading K and V twice took
  // bf16 d128 non-causal 16k from 623 to 577 TFLOP/s sustained (SM clock 1690
  // -> 1575 MHz at 700 W) and fp8 d128 857 -> 819 (1845 -> 1760 MHz).
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
  static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
  static constexpr int kQTileBytes = kBlockM * kHeadDim * kElementBytes;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * kElementBytes;
  // Rows of one K or V load (a TMA box): half a tile with kClusterKv.
  static constexpr int kKLoadRows = kBlockN / kClusterCtas;
  static constexpr int kVLoadRows = (kFp8 ? kHeadDim : kBlockN) / kClusterCtas;
  static constexpr int kSAccRegs = kBlockN / 2;   // 64 x kBlockN fp32 over 128 threads
  static constexpr int kPRegs = kSAccRegs * kElementBytes / 4;  // P packed in 32-bit registers
  static constexpr int kOAccRegs = kHeadDim / 2;  // 64 x kHeadDim fp32 over 128 threads
  static constexpr int kOColBlocks = kHeadDim / kSwizzleCols16;  // O is 16-bit
  // FP8: V arrives transposed (Fp8V layout: headdim rows of keys), so its
  // tile is kHeadDim rows of kBlockN keys in kBlockN / 128 column blocks;
  // O gets its own staging tile.
  static constexpr int kVColBlocks = kFp8 ? kBlockN / kSwizzleCols : kColBlocks;
  // How O leaves (epilogue.cuh), chosen per tile config: straight from
  // registers (4-byte global stores), staged in the warpgroup's rows of the
  // Q tile for a TMA store, staged in a tile of its own (fp8, whose 1-byte
  // Q tile is too small; d128 where 128-key blocks leave room; d64 short
  // causal), or staged in a V stage of the ring (d256 causal, which has no
  // room for a tile: the producer's next V load there waits for the store).
  // All but staging in Q free the Q tile after the last Q K^T GEMM, so the
  // next tile's Q load overlaps the last PV GEMM and the epilogue; staging
  // in Q frees it once the store has read the staging rows. Same-run A/B on
  // the H200, bf16, direct vs staged in Q: d64 non-causal 512 311 -> 357
  // TFLOP/s, 1k 385 -> 416; d128 non-causal 4k 621 -> 600, d256 512 431 ->
  // 405 (the others: TileConfig).
  static constexpr OStore kOStore = Config::kOStore;
  // Who frees the Q tile: every consumer thread after its last Q K^T GEMM,
  // or, where O is staged in Q, each warpgroup's leader once its store has
  // read the staging rows. H200, same run, fp8, Q kept until the store ->
  // freed early: non-causal d128 16k 745 -> 793, d256 1138 -> 1179 TFLOP/s;
  // causal (three rounds, since no kernel spills) d128 1k 433 -> 495, 4k
  // 662 -> 720, 16k 754 -> 802, d256 1k 640 -> 718, 4k 1019 -> 1055, 16k
  // 1185 -> 1188.
  static constexpr bool kEarlyQRelease = kOStore != OStore::kInQTile;
  // With an O tile of its own: the leader of a warpgroup waits for its
  // store's read of the tile before the next write to it (epilogue.cuh)
  // rather than right after issuing it, where the wait holds up the
  // warpgroup's next GEMMs (wgmma takes all four warps). It moves ptxas's
  // plan of the whole kernel, so it is set by measurement (TileConfig).
  static constexpr bool kDeferOStoreWait =
      Config::kDeferOStoreWait && kOStore == OStore::kSeparateTile;
  static constexpr int kQReleaseArrivals = kEarlyQRelease ? kConsumerThreads : kConsumerWarpgroups;
  static_assert(kHeadDim % kSwizzleCols == 0, "head dim must fill whole swizzle rows");
  static_assert(!kFp8 || kBlockN % kSwizzleCols == 0, "fp8 key blocks fill whole swizzle rows");
  static_assert(kBlockN % kMmaK16 == 0 && kBlockM % kMmaM == 0, "tile shape");
  static_assert(kKLoadRows % 8 == 0 && kVLoadRows % 8 == 0,
                "half tiles keep whole 8-row swizzle atoms");
};

}  // namespace flash3::sm90::fwd
