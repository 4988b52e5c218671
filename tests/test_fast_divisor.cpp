// FastDivisor (src/sm90/problem.hpp): the kernels' multiply-high division by a
// runtime block size must equal integer division over the kernels' range.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "src/sm90/problem.hpp"

namespace {

using flash3::detail::FastDivisor;

constexpr int kMaxInt = 0x7fffffff;

TEST(FastDivisor, MatchesDivisionOnEdgesAndRandomNumerators) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> any(0, kMaxInt);
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) {
    divisors.push_back(d);
  }
  for (int s = 12; s < 31; ++s) {
    for (int delta : {-1, 0, 1}) {
      divisors.push_back((1 << s) + delta);
    }
  }
  divisors.push_back(kMaxInt);
  for (int i = 0; i < 2000; ++i) {
    divisors.push_back(1 + any(rng) % kMaxInt);
  }
  for (int d : divisors) {
    const FastDivisor f = FastDivisor::of(d);
    std::vector<int> numerators = {0, 1, d - 1, d, kMaxInt, kMaxInt - 1};
    if (d < kMaxInt) {
      numerators.push_back(d + 1);
    }
    for (int k : {2, 3, 1000}) {
      const int64_t multiple = static_cast<int64_t>(d) * k;
      if (multiple - 1 <= kMaxInt) {
        numerators.push_back(static_cast<int>(multiple - 1));
      }
      if (multiple <= kMaxInt) {
        numerators.push_back(static_cast<int>(multiple));
      }
    }
    for (int i = 0; i < 64; ++i) {
      numerators.push_back(any(rng));
    }
    for (int n : numerators) {
      ASSERT_EQ(f.divide(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
