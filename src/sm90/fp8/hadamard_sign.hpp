// The random signs of the randomized Hadamard transform (incoherent
// processing), one definition for the CPU reference (reference/fp8.hpp) and
// the quantization kernel's launch (quantize.cu), which must agree bit for
// bit. Sign of head-dim column `index`: the top bit of
// splitmix64(seed * kGoldenGamma + index), 1 -> -1, 0 -> +1. The same signs
// serve every row, head and batch of Q and K.
#pragma once

#include <cstdint>

namespace flash3::incoherent {

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// Steele, Lea and Flood's SplitMix64 step: state += gamma, then the finaliser.
constexpr uint64_t splitmix64(uint64_t state) {
  uint64_t z = state + kGoldenGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr int8_t hadamard_sign(uint64_t seed, int index) {
  return (splitmix64(seed * kGoldenGamma + static_cast<uint64_t>(index)) >> 63) != 0 ? -1 : 1;
}

}  // namespace flash3::incoherent
