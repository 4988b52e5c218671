// plan_grid (src/sm90/fwd/grid.hpp): the persistent grid and when two-CTA
// clusters share K and V. A cluster's two CTAs must hold adjacent query
// blocks of one head at every step of the scheduler (CTA c takes tiles
// c, c + G, ... non-causal; pairs 2c, 2c + 1, then + 2G causal), or they
// would multicast different keys to each other.
// The tail split (src/sm90/fwd/tail_split.hpp): every key block of every
// tile done exactly once, each cut tile finished by the CTA that does its
// piece last, after the pieces it waits for were done first.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "src/sm90/fwd/grid.hpp"

namespace {

using flash3::detail::GridPlan;
using flash3::detail::plan_grid;
using flash3::detail::split_steps;
using flash3::sm90::fwd::Piece;
using flash3::sm90::fwd::TailSchedule;

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

// Every CTA's pieces of one launch plan, checked against the rules above.
// Causal: tiles in the scheduler's order (per head M-1, 0, M-2, 1, ...),
// tile m_block with m_block + 1 key blocks (n_blocks is M).
void expect_valid_tail(const GridPlan& plan, long long tiles, int num_m_blocks, int n_blocks,
                       bool causal = false) {
  const int group_ctas = plan.clusters ? 2 : 1;
  const TailSchedule schedule{causal, static_cast<int>(tiles), static_cast<int>(plan.ctas),
                              group_ctas, n_blocks, plan.tail};
  const auto blocks_of = [&](int tile) {
    if (!causal) {
      return n_blocks;
    }
    const int m = tile % num_m_blocks;
    return (m % 2 == 0 ? num_m_blocks - 1 - m / 2 : m / 2) + 1;
  };
  std::vector<std::vector<int>> seen(tiles, std::vector<int>(causal ? n_blocks : n_blocks, 0));
  std::map<int, std::set<int>> partial_ctas;  // tile -> CTAs that wrote a piece of it
  std::map<int, std::pair<int, int>> finals;  // tile -> (CTA, partners)
  for (int cta = 0; cta < static_cast<int>(plan.ctas); ++cta) {
    std::vector<Piece> pieces;
    for (Piece p; schedule.piece(cta, static_cast<int>(pieces.size()), &p);) {
      pieces.push_back(p);
      ASSERT_LT(pieces.size(), 100000u);
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      Piece p = pieces[i];
      ASSERT_GE(p.tile, 0);
      ASSERT_LT(p.tile, tiles);
      if (causal && p.kind == Piece::kWhole) {
        EXPECT_EQ(p.n_end, 0) << "whole causal tiles take their blocks from the mask";
        p.n_end = blocks_of(p.tile);
      }
      ASSERT_LE(0, p.n_begin);
      ASSERT_LT(p.n_begin, p.n_end);
      ASSERT_LE(p.n_end, blocks_of(p.tile));
      for (int n = p.n_begin; n < p.n_end; ++n) {
        ++seen[p.tile][n];
      }
      if (p.kind == Piece::kPartial) {
        EXPECT_LT(p.n_end, blocks_of(p.tile)) << "a written piece is not the tile's first";
        EXPECT_TRUE(i == 0 || pieces[i - 1].tile < plan.tail.split_tiles)
            << "CTA " << cta << ": a written piece is its first in the tail";
        partial_ctas[p.tile].insert(cta);
      } else if (p.kind == Piece::kFinal) {
        EXPECT_EQ(p.n_end, blocks_of(p.tile)) << "the finishing piece holds the last key block";
        EXPECT_EQ(i, pieces.size() - 1) << "CTA " << cta << ": the finishing piece is its last";
        EXPECT_GT(p.partners, 0);
        finals[p.tile] = {cta, p.partners};
      } else {
        EXPECT_EQ(p.n_begin, 0);
        EXPECT_EQ(p.n_end, blocks_of(p.tile));
      }
      if (plan.clusters) {  // the other CTA of the cluster: the pair's other query block
        const int other_cta = cta ^ 1;
        Piece q;
        ASSERT_TRUE(schedule.piece(other_cta, static_cast<int>(i), &q));
        if (q.kind == Piece::kWhole) {
          q.n_end = p.n_end;  // (whole pieces are checked on their own)
        }
        EXPECT_EQ(q.tile, p.tile ^ 1);
        EXPECT_EQ(q.tile / num_m_blocks, p.tile / num_m_blocks);
        EXPECT_EQ(q.n_begin, p.n_begin);
        EXPECT_EQ(q.n_end, p.n_end);
      }
    }
  }
  for (long long t = 0; t < tiles; ++t) {
    for (int n = 0; n < n_blocks; ++n) {
      ASSERT_EQ(seen[t][n], n < blocks_of(static_cast<int>(t)) ? 1 : 0)
          << "tile " << t << " key block " << n;
    }
  }
  EXPECT_EQ(partial_ctas.size(), finals.size());
  for (const auto& [tile, final] : finals) {
    const auto& [cta, partners] = final;
    std::set<int> expected;
    for (int j = 1; j <= partners; ++j) {
      expected.insert(cta + j * group_ctas);
    }
    EXPECT_EQ(partial_ctas[tile], expected) << "tile " << tile;
  }
}

TEST(TailSplit, GridCellsSplitTheirLastWave) {
  // The grid's non-causal cells: 2048 tiles at d128 (16 heads, 128 rows) in
  // 66 clusters, 1024 at d256 in single CTAs: 15.5 and 7.8 waves.
  const GridPlan d128 = plan_grid(2048, 8, 1, kSms, true, kH200Clusters, true, 8);
  EXPECT_TRUE(d128.clusters);
  EXPECT_EQ(d128.tail.split_tiles, 15 * 132);
  EXPECT_EQ(d128.tail.tail_blocks, 5);  // 34 pair-tiles x 8 blocks over 66 clusters
  expect_valid_tail(d128, 2048, 8, 8);
  const GridPlan d256 = plan_grid(1024, 8, 1, kSms, false, 0, true, 13);
  EXPECT_EQ(d256.tail.split_tiles, 7 * 132);
  EXPECT_EQ(d256.tail.tail_blocks, 10);  // 100 tiles x 13 blocks over 132 CTAs
  expect_valid_tail(d256, 1024, 8, 13);
  // Long: 94 blocks of 176 keys at 16k.
  const GridPlan d128_16k = plan_grid(2048, 128, 1, kSms, true, kH200Clusters, true, 94);
  EXPECT_EQ(d128_16k.tail.tail_blocks, 49);
  expect_valid_tail(d128_16k, 2048, 128, 94);
}

TEST(TailSplit, NoSplitWhereItSavesTooLittle) {
  // 512-row sequences of 128-key blocks: the last wave of 4 blocks would take 3.
  const GridPlan plan = plan_grid(2048, 4, 1, kSms, true, kH200Clusters, true, 4);
  EXPECT_EQ(plan.tail.tail_blocks, 0);
  EXPECT_EQ(plan.tail.split_tiles, 2048);
  // Whole waves, one key block, or a kernel that may not split.
  EXPECT_EQ(plan_grid(132 * 4, 4, 1, kSms, false, 0, true, 64).tail.tail_blocks, 0);
  EXPECT_EQ(plan_grid(200, 200, 1, kSms, false, 0, true, 1).tail.tail_blocks, 0);
  EXPECT_EQ(plan_grid(200, 200, 1, kSms, false, 0, false, 64).tail.tail_blocks, 0);
  EXPECT_EQ(plan_grid(200, 200, 1, kSms, false, 0, false, 64).tail.split_tiles, 200);
}

TEST(TailSplit, FewTilesFillTheDevice) {
  // Fewer tiles than SMs: every CTA takes pieces (up to 16 of a tile).
  const GridPlan plan = plan_grid(8, 8, 1, kSms, true, kH200Clusters, true, 64);
  EXPECT_EQ(plan.ctas, 132u);
  EXPECT_EQ(plan.tail.split_tiles, 0);
  expect_valid_tail(plan, 8, 8, 64);
  const GridPlan single = plan_grid(3, 3, 1, kSms, false, 0, true, 40);
  EXPECT_EQ(single.ctas, 132u);
  expect_valid_tail(single, 3, 3, 40);
}

TEST(TailSplit, ManyShapes) {
  for (const int n_blocks : {2, 3, 5, 8, 13, 16, 94}) {
    for (const auto& [heads, m_blocks] :
         {std::pair{16, 8}, {70, 2}, {35, 2}, {3, 7}, {50, 8}, {1, 2}, {256, 8}, {11, 12}}) {
      const long long tiles = static_cast<long long>(heads) * m_blocks;
      for (const bool cluster_kv : {false, true}) {
        SCOPED_TRACE(testing::Message() << "blocks " << n_blocks << " heads " << heads
                                        << " m_blocks " << m_blocks << " clusters " << cluster_kv);
        const GridPlan plan =
            plan_grid(tiles, m_blocks, 1, kSms, cluster_kv, kH200Clusters, true, n_blocks);
        expect_valid_tail(plan, tiles, m_blocks, n_blocks);
      }
    }
  }
}

TEST(TailSplit, CausalPairsOfEqualCost) {
  // The grid's causal d128 cells: 1024 pairs of M + 1 blocks, 7.8 waves
  // (at 512, M = 4, the last wave would take 4 of 5 blocks: not split).
  EXPECT_EQ(plan_grid(2048, 4, 2, kSms, false, 0, true, 5).tail.tail_blocks, 0);
  for (const int m_blocks : {8, 32, 128}) {
    const long long tiles = 16LL * 16384 / (128 * m_blocks) * m_blocks;
    const GridPlan plan = plan_grid(tiles, m_blocks, 2, kSms, false, 0, true, m_blocks + 1);
    SCOPED_TRACE(m_blocks);
    EXPECT_EQ(plan.tail.split_tiles, 7 * 2 * 132);
    EXPECT_GT(plan.tail.tail_blocks, 0);
    EXPECT_LE(plan.tail.tail_blocks, m_blocks + 1 - flash3::detail::kMinTailSaving);
    expect_valid_tail(plan, tiles, m_blocks, m_blocks, true);
  }
  for (const auto& [heads, m_blocks] :
       {std::pair{3, 2}, {70, 2}, {35, 4}, {50, 8}, {1, 6}, {11, 12}}) {
    const long long tiles = static_cast<long long>(heads) * m_blocks;
    SCOPED_TRACE(testing::Message() << "heads " << heads << " m_blocks " << m_blocks);
    const GridPlan plan = plan_grid(tiles, m_blocks, 2, kSms, false, 0, true, m_blocks + 1);
    expect_valid_tail(plan, tiles, m_blocks, m_blocks, true);
  }
}

TEST(TailSplit, WhichLaunchesMaySplit) {
  // bf16 d128 non-causal past 2k: 176-key blocks, 24 at 4k (kMinSplitStepBlocks 16).
  EXPECT_TRUE(split_steps(true, false, 4096, 4096, 128, 176).split);
  EXPECT_EQ(split_steps(true, false, 4096, 4096, 128, 176).blocks, 24);
  EXPECT_FALSE(split_steps(true, false, 4096, 2048, 128, 176).split);  // 12 blocks
  // Causal pairs of M + 1 blocks: 2k has 17, 1k 9.
  EXPECT_TRUE(split_steps(true, true, 2048, 2048, 128, 128).split);
  EXPECT_EQ(split_steps(true, true, 2048, 2048, 128, 128).blocks, 17);
  EXPECT_FALSE(split_steps(true, true, 1024, 1024, 128, 128).split);
  // Pairs of unequal cost: seqlen_q != seqlen_k, blocks not square, odd M.
  EXPECT_FALSE(split_steps(true, true, 4096, 8192, 128, 128).split);
  EXPECT_FALSE(split_steps(true, true, 4096, 4096, 128, 80).split);
  EXPECT_TRUE(split_steps(true, true, 4000, 4000, 128, 128).split);   // M = 32
  EXPECT_FALSE(split_steps(true, true, 3968, 3968, 128, 128).split);  // M = 31
  // A kernel without the split never splits.
  EXPECT_FALSE(split_steps(false, false, 16384, 16384, 128, 176).split);
}

}  // namespace
