// The wgmma accumulator's register layout, host and device (the mask's CPU
// tests apply it as the kernels do).
#pragma once

#include "../problem.hpp"  // FLASH3_HOST_DEVICE

namespace flash3::sm90 {

// Register i of a thread's wgmma accumulator belongs to row (i & 2) ? 1 : 0
// of its two rows (g and g + 8 of its warp's 16).
FLASH3_HOST_DEVICE constexpr int acc_row(int i) { return (i & 2) ? 1 : 0; }

}  // namespace flash3::sm90
