// The FP8 forward's P = exp2(scaled score - row max + kFp8ProbOffsetLog2):
// P lies in [0, 256], so e4m3 keeps its normal range (2^-6 .. 448) for
// probabilities down to 2^-14 instead of 2^-6; the offset cancels in the
// normalisation. One definition for the kernel (mainloop.cuh) and its CPU
// emulation (reference/fp8.cpp).
#pragma once

namespace flash3::fp8 {

inline constexpr int kFp8ProbOffsetLog2 = 8;

}  // namespace flash3::fp8
