// The local kernels' work units (src/sm90/fwd/local_units.hpp): a head's
// units hold each of its query blocks exactly once, and for the windows
// whose first blocks grow (a left side with causal or a bounded right side,
// a causal softcap), a unit costs at most a key block more than the head's
// longest tile and at least half of it, and a pair's longer tile comes first.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "src/sm90/common/mask.cuh"
#include "src/sm90/fwd/local_units.hpp"

namespace {

constexpr int kBlockM = 128, kBlockN = 128;
using LocalMask = flash3::sm90::Mask<kBlockM, kBlockN, true, true>;
using flash3::sm90::fwd::LocalUnits;

struct Case {
  int seqlen_q, seqlen_k, left, right, chunk;  // sides as the kernels take them (INT_MAX: unbounded)
  bool balanced;                               // the window grows from key 0
};

std::string describe(const Case& c) {
  return "seqlen_q " + std::to_string(c.seqlen_q) + " seqlen_k " + std::to_string(c.seqlen_k) +
         " window (" + std::to_string(c.left) + ", " + std::to_string(c.right) + ") chunk " +
         std::to_string(c.chunk);
}

TEST(LocalUnits, EachQueryBlockOnceAndUnitsOfAboutAWindow) {
  constexpr int kUnbounded = LocalMask::kUnbounded;
  const std::vector<Case> cases = {
      {16384, 16384, 4096, 0, 0, true},          // Mistral-style: the benchmark's
      {16384, 16384, 8192, 0, 0, true},
      {16896, 16896, 2048, 0, 0, true},
      {1000, 1000, 300, 0, 0, true},             // partial last block
      {4096, 4096, kUnbounded, 0, 0, true},      // causal softcap: the causal pairs
      {4097, 4097, kUnbounded, 0, 0, true},      // an odd block count: one single
      {3000, 3000, 700, 200, 0, true},           // a right side
      {1024, 8192, 4096, 0, 0, false},           // every row sees a whole window
      {4096, 4096, 1000, kUnbounded, 0, false},  // right side unbounded: none paired
      {4096, 4096, kUnbounded, kUnbounded, 0, false},  // softcap alone
      {4096, 4096, kUnbounded, 0, 1000, false},  // chunks: whatever the units, each block once
      {2000, 700, 100, 0, 0, false},             // more queries than keys
      {100, 100, 10, 0, 0, false},               // one block
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const LocalMask mask{c.seqlen_q, c.seqlen_k, c.left, c.right, c.chunk};
    const int m_blocks = (c.seqlen_q + kBlockM - 1) / kBlockM;
    const LocalUnits units = LocalUnits::of(mask, m_blocks);
    ASSERT_GE(units.short_blocks, 0);
    ASSERT_LE(units.short_blocks, m_blocks);
    const auto cost = [&](int m) { return std::max(0, mask.n_block_end(m) - mask.n_block_begin(m)); };
    int longest = 0;
    for (int m = 0; m < m_blocks; ++m) {
      longest = std::max(longest, cost(m));
    }
    std::vector<int> seen(m_blocks, 0);
    for (int k = 0; k < units.per_head(); ++k) {
      const int first = units.m_block(k, false);
      ASSERT_GE(first, 0);
      ASSERT_LT(first, m_blocks);
      ++seen[first];
      int unit_cost = cost(first);
      if (units.is_pair(k)) {
        const int second = units.m_block(k, true);
        ASSERT_GE(second, 0);
        ASSERT_LT(second, m_blocks);
        ASSERT_NE(second, first);
        ++seen[second];
        EXPECT_GE(cost(first), cost(second)) << "unit " << k << ": the longer tile first";
        unit_cost += cost(second);
      }
      if (c.balanced) {  // about a window: none longer, none under half (an odd pair's middle)
        EXPECT_LE(unit_cost, longest + 1) << "unit " << k;
        EXPECT_GE(2 * unit_cost + 1, longest) << "unit " << k;
      }
    }
    for (int m = 0; m < m_blocks; ++m) {
      EXPECT_EQ(seen[m], 1) << "query block " << m;
    }
    if (c.balanced) {
      EXPECT_GT(units.short_blocks, 1);
    }
  }
}

}  // namespace
