// setmaxnreg budgets of a warp-specialised kernel with one CTA per SM: a
// producer warpgroup that needs only addresses releases registers to the
// consumer warpgroups, which share the rest of the SM's 65536 (multiples of
// 8: 240 each for two consumer warpgroups, 160 for three).
#pragma once

namespace flash3::sm90 {

template <int kConsumerThreads, int kProducerRegs = 24>
struct RegisterBudget {
  static constexpr int kWarpgroupThreads = 128;  // the producer warpgroup
  static constexpr int kPerSm = 65536;
  static constexpr int kProducerRegisters = kProducerRegs;
  static constexpr int kConsumerRegisters =
      (kPerSm - kProducerRegisters * kWarpgroupThreads) / kConsumerThreads / 8 * 8;
  // At launch every thread holds kLaunchRegisters (ptxas takes the whole
  // __launch_bounds__ share when setmaxnreg is used); setmaxnreg.inc blocks
  // until the producer's release covers the consumers' growth, so a release
  // that falls short hangs the kernel (seen on the H200 with a producer at 32).
  static constexpr int kLaunchRegisters = kPerSm / (kWarpgroupThreads + kConsumerThreads) / 8 * 8;
  static constexpr bool kReleaseCoversGrowth =
      (kLaunchRegisters - kProducerRegisters) * kWarpgroupThreads >=
      (kConsumerRegisters - kLaunchRegisters) * kConsumerThreads;
  static constexpr bool kFitsTheSm =
      kProducerRegisters * kWarpgroupThreads + kConsumerRegisters * kConsumerThreads <= kPerSm;
};

}  // namespace flash3::sm90
