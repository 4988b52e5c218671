// The one table of forward-kernel choices per (dtype, head dim), and every
// size derived from it.
#pragma once

#include <cutlass/numeric_types.h>

#include "flash3/flash3.hpp"
#include "sm90/common/wgmma.cuh"

namespace flash3::sm90::fwd {

template <int kHeadDim, bool kCausal>
struct TileConfig;

// kBlockM: query rows per CTA (64 per consumer warpgroup).
// kBlockN: key rows per pipeline stage; the S accumulator is kBlockN/2 floats
//          per thread, P kBlockN/4 registers, O kHeadDim/2 floats.
// kStages: depth of the K and V rings.
// Shared memory: Q kBlockM x D, plus 2 x kStages tiles of kBlockN x D.
template <bool kCausal>
struct TileConfig<64, kCausal> {
  // O is only 32 registers, so three consumer warpgroups (192 query rows)
  // share each K/V tile, and the turns rotate over three; 24 KB Q + 6 x 16 KB
  // K/V, so a deeper ring is free.
  static constexpr int kBlockM = 192, kBlockN = 128, kStages = 3;
};
template <bool kCausal>
struct TileConfig<128, kCausal> {
  // Non-causal: 176 keys per block amortise the softmax and barrier cost over
  // more GEMM work (S 88 + P 44 + O 64 registers); causal keeps 128 so that
  // the diagonal blocks waste less. 32 KB Q + 4 x 44 KB K/V = 208 KB.
  static constexpr int kBlockM = 128, kBlockN = kCausal ? 128 : 176, kStages = 2;
};
template <bool kCausal>
struct TileConfig<256, kCausal> {
  // O alone takes 128 registers per thread, so S stays at 80 columns
  // (40 regs); 64 KB Q + 4 x 40 KB K/V = 224 KB, the most that fits.
  static constexpr int kBlockM = 128, kBlockN = 80, kStages = 2;
};

// Ablation switches (CMake FLASH3_ABLATION), to measure what each technique
// is worth; the default build has both techniques on.
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

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};

template <DType kDType, int kHeadDim, bool kCausal>
struct Traits {
  using Config = TileConfig<kHeadDim, kCausal>;
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDimV = kHeadDim;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;
  // The consumer warpgroups take turns issuing GEMMs (mainloop.cuh).
  static constexpr bool kPingPong = kPingPongEnabled;
  // A warpgroup's softmax of block n runs under its PV GEMM of block n+1.
  static constexpr bool kIntraWgOverlap = kIntraWgOverlapEnabled;

  // Warp roles: warpgroup 0 produces (TMA), the others consume (wgmma + softmax).
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kConsumerWarpgroups = kBlockM / kMmaM;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
  static constexpr int kThreads = kWarpgroupThreads + kConsumerThreads;

  // setmaxnreg budgets: 65536 registers per SM, one CTA per SM; the producer
  // needs only addresses, the consumers hold S, P and O and share the rest
  // (240 each for two consumer warpgroups, 160 for three; multiples of 8).
  static constexpr int kRegistersPerSm = 65536;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters =
      (kRegistersPerSm - kProducerRegisters * kWarpgroupThreads) / kConsumerThreads / 8 * 8;
  static_assert(kConsumerWarpgroups == 2 || kConsumerWarpgroups == 3,
                "one producer plus two or three consumer warpgroups");
  // At launch every thread holds kLaunchRegisters (ptxas takes the whole
  // __launch_bounds__ share when setmaxnreg is used); setmaxnreg.inc blocks
  // until the producer's release covers the consumers' growth, so a release
  // that falls short hangs the kernel (seen on the H200 with a producer at 32).
  static constexpr int kLaunchRegisters = kRegistersPerSm / kThreads / 8 * 8;
  static_assert((kLaunchRegisters - kProducerRegisters) * kWarpgroupThreads >=
                    (kConsumerRegisters - kLaunchRegisters) * kConsumerThreads,
                "setmaxnreg: the producer must release what the consumers take");
  static_assert(kProducerRegisters * kWarpgroupThreads +
                    kConsumerRegisters * kConsumerThreads <= kRegistersPerSm,
                "register budget exceeds the SM");

  static constexpr int kColBlocks = kHeadDim / kSwizzleCols16;  // 64-column swizzle blocks
  static constexpr int kQTileBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * 2;
  static constexpr int kSAccRegs = kBlockN / 2;   // 64 x kBlockN fp32 over 128 threads
  static constexpr int kOAccRegs = kHeadDim / 2;  // 64 x kHeadDim fp32 over 128 threads
  static_assert(kHeadDim % kSwizzleCols16 == 0, "head dim must be a multiple of 64");
  static_assert(kBlockN % kMmaK16 == 0 && kBlockM % kMmaM == 0, "tile shape");
};

}  // namespace flash3::sm90::fwd
