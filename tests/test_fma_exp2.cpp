// fma_exp2 (src/sm90/common/fma_exp2.hpp) against exp2 over the softmax's
// range: relative error under 4e-6 for x in [-125, 8], and 2^-125 for
// hidden (-inf) scores.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "src/sm90/common/fma_exp2.hpp"

namespace {

using flash3::sm90::fma_exp2;

TEST(FmaExp2, MatchesExp2AcrossTheSoftmaxRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -125.0f; x <= 8.0f; x += 1.0f / 1024) {
    const double want = std::exp2(static_cast<double>(x));
    const double err = std::abs(fma_exp2(x) / want - 1.0);
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  }
  EXPECT_LT(worst, 4e-6) << "at x = " << worst_x;
}

TEST(FmaExp2, ExactAtIntegersAndTinyForHiddenScores) {
  for (int n = -120; n <= 8; ++n) {
    EXPECT_NEAR(fma_exp2(static_cast<float>(n)), std::exp2(n), 1e-6 * std::exp2(n)) << n;
  }
  const float hidden = fma_exp2(-std::numeric_limits<float>::infinity());
  EXPECT_GT(hidden, 0.0f);
  EXPECT_LE(hidden, std::exp2(-124.9f));
  EXPECT_EQ(fma_exp2(-1000.0f), hidden);
}

}  // namespace
