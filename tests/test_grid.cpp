// plan_grid (src/sm90/fwd/grid.hpp): the persistent grid and when two-CTA
// clusters share K and V. A cluster's two CTAs must hold adjacent query
// blocks of one head at every step of the scheduler (CTA c takes tiles
// c, c + G, ... non-causal; pairs 2c, 2c + 1, then + 2G causal), or they
// would multicast different keys to each other.
#include <gtest/gtest.h>

#include "src/sm90/fwd/grid.hpp"

namespace {

using flash3::detail::GridPlan;
using flash3::detail::plan_grid;

constexpr int kSms = 132;
constexpr int kH200Clusters = 66;  // cudaOccupancyMaxActiveClusters, two CTAs, 1 per SM

// Every step of every cluster: both CTAs' tiles valid or both not, and in
// the same head with adjacent query blocks.
void expect_pairs_share_keys(const GridPlan& plan, long long tiles, int num_m_blocks,
                             int tiles_per_step) {
  ASSERT_TRUE(plan.clusters);
  ASSERT_EQ(plan.ctas % 2, 0u);
  const long long step = static_cast<long long>(plan.ctas) * tiles_per_step;
  for (unsigned c = 0; c < plan.ctas; c += 2) {
    for (long long first = static_cast<long long>(c) * tiles_per_step; first < tiles + step;
         first += step) {
      for (int j = 0; j < tiles_per_step; ++j) {
        const long long a = first + j;
        const long long b = a + tiles_per_step;  // the other CTA's tile at this step
        ASSERT_EQ(a < tiles, b < tiles) << "CTA " << c << " tile " << a;
        if (a < tiles) {
          EXPECT_EQ(a / num_m_blocks, b / num_m_blocks) << "CTA " << c << " tile " << a;
          EXPECT_EQ(a % num_m_blocks / (2 * tiles_per_step),
                    b % num_m_blocks / (2 * tiles_per_step));
        }
      }
    }
  }
}

TEST(GridPlan, NonCausalPairsWhenQueryBlocksPairUp) {
  // (batch * heads, num_m_blocks): the grid's 16k and 1k cells, few tiles, GQA-like.
  for (const auto& [heads, m_blocks] : {std::pair{16, 128}, {256, 8}, {2, 8}, {1, 2}, {48, 22}}) {
    const long long tiles = static_cast<long long>(heads) * m_blocks;
    const GridPlan plan = plan_grid(tiles, m_blocks, 1, kSms, true, kH200Clusters);
    EXPECT_EQ(plan.ctas, static_cast<unsigned>(std::min<long long>(tiles, 2 * kH200Clusters)));
    expect_pairs_share_keys(plan, tiles, m_blocks, 1);
  }
}

TEST(GridPlan, CausalPairsNeedGroupsOfFour) {
  const GridPlan plan = plan_grid(16 * 128, 128, 2, kSms, true, kH200Clusters);
  EXPECT_EQ(plan.ctas, 132u);
  expect_pairs_share_keys(plan, 16 * 128, 128, 2);
  EXPECT_FALSE(plan_grid(16 * 6, 6, 2, kSms, true, kH200Clusters).clusters);
}

TEST(GridPlan, SingleCtasOtherwise) {
  // Odd query-block counts, no cluster fits, or a kernel without clusters:
  // one CTA per SM at most, causal CTAs taking two tiles a step.
  EXPECT_EQ(plan_grid(16 * 33, 33, 1, kSms, true, kH200Clusters).clusters, false);
  EXPECT_EQ(plan_grid(16 * 33, 33, 1, kSms, true, kH200Clusters).ctas, 132u);
  EXPECT_EQ(plan_grid(16 * 128, 128, 1, kSms, true, 0).clusters, false);
  EXPECT_EQ(plan_grid(3, 3, 1, kSms, true, kH200Clusters).ctas, 3u);
  EXPECT_EQ(plan_grid(16 * 128, 128, 1, kSms, false, kH200Clusters).clusters, false);
  EXPECT_EQ(plan_grid(5, 5, 2, kSms, false, 0).ctas, 3u);
  EXPECT_EQ(plan_grid(1000, 1000, 2, kSms, false, 0).ctas, 132u);
}

}  // namespace
