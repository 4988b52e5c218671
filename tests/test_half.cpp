// The fp16/bf16 conversion helpers of the reference.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "reference/half.hpp"

namespace flash3::ref {
namespace {

constexpr uint32_t kBitPatterns = 1u << 16;
constexpr int kRandomSamples = 200000;
constexpr float kFp16Max = 65504.0f;

struct Format {
  const char* name;
  HalfType type;
  uint16_t positive_inf;
};

const Format kFormats[] = {{"fp16", HalfType::kFloat16, 0x7C00},
                           {"bf16", HalfType::kBFloat16, 0x7F80}};

TEST(HalfConversion, EveryBitPatternRoundTrips) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (uint32_t bits = 0; bits < kBitPatterns; ++bits) {
      const float x = half_to_float(f.type, static_cast<uint16_t>(bits));
      const uint16_t back = float_to_half(f.type, x);
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(half_to_float(f.type, back))) << bits;
        ASSERT_EQ(back & 0x8000, bits & 0x8000) << bits;
      } else {
        ASSERT_EQ(back, bits) << "x = " << x;
      }
    }
  }
}

TEST(HalfConversion, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie: down to even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie: up to even
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(-(1.0f + std::ldexp(1.0f, -8))), 0xBF80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(HalfConversion, Fp16RoundsToNearestEven) {
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie: down to even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie: up to even
  EXPECT_EQ(float_to_fp16(kFp16Max), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // the tie above the largest rounds to inf
  EXPECT_EQ(float_to_fp16(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
}

TEST(HalfConversion, Fp16SubnormalsRoundToNearestEven) {
  const float step = std::ldexp(1.0f, -24);  // the smallest fp16 subnormal
  EXPECT_EQ(float_to_fp16(step), 0x0001);
  EXPECT_EQ(float_to_fp16(step / 2), 0x0000);      // tie: down to even zero
  EXPECT_EQ(float_to_fp16(3 * step / 2), 0x0002);  // tie: up to even
  EXPECT_EQ(float_to_fp16(std::nextafter(step / 2, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_fp16(1023.5f * step), 0x0400);  // tie into the smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_fp16(-step), 0x8001);
}

TEST(HalfConversion, InfinityAndNanSurvive) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    EXPECT_EQ(float_to_half(f.type, inf), f.positive_inf);
    EXPECT_EQ(float_to_half(f.type, -inf), f.positive_inf | 0x8000);
    EXPECT_EQ(half_to_float(f.type, f.positive_inf), inf);
    EXPECT_TRUE(std::isnan(round_to(f.type, std::numeric_limits<float>::quiet_NaN())));
    EXPECT_TRUE(std::isnan(round_to(f.type, -std::numeric_limits<float>::signaling_NaN())));
  }
}

// No neighbour of the rounded value lies closer to x; on a tie the result is even.
TEST(HalfConversion, RandomFloatsRoundToTheNearestValue) {
  std::mt19937 rng(7);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const float limit = f.type == HalfType::kFloat16 ? kFp16Max : 1e38f;
    std::uniform_real_distribution<float> exponent(-30.0f, std::log2(limit));
    for (int i = 0; i < kRandomSamples; ++i) {
      const float x = std::exp2(exponent(rng));
      const uint16_t bits = float_to_half(f.type, x);
      const double error = std::fabs(half_to_float(f.type, bits) - double{x});
      for (const int step : {-1, 1}) {
        const uint16_t neighbour = static_cast<uint16_t>(bits + step);
        if (neighbour >= f.positive_inf) {
          continue;
        }
        const double other = std::fabs(half_to_float(f.type, neighbour) - double{x});
        ASSERT_TRUE(error < other || (error == other && (bits & 1) == 0))
            << "x = " << x << " rounds to bits " << bits;
      }
    }
  }
}

}  // namespace
}  // namespace flash3::ref
