// The varlen tile space (src/sm90/common/varlen.hpp): every query block of every
// (sequence, head) exactly once, none of padding, a head's blocks together;
// malformed cu_seqlens clamped inside the tensor. And the varlen backward's
// workspace rows (src/sm90/bwd/workspace.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "forward_case.hpp"
#include "src/sm90/bwd/workspace.hpp"
#include "src/sm90/common/varlen.hpp"

namespace {

using flash3::sm90::block_prefix;
using flash3::sm90::seq_range;
using flash3::sm90::VarlenTile;
using flash3::sm90::VarlenTiles;
using flash3::test::cu_seqlens_of;

void expect_every_block_once(const std::vector<int>& lengths, int heads, int block_m) {
  const std::vector<int> cu = cu_seqlens_of(lengths);
  const int batch = static_cast<int>(lengths.size());
  std::vector<int> prefix(batch + 1);
  block_prefix(cu.data(), nullptr, batch, cu.back(), block_m, prefix.data());
  const VarlenTiles tiles{prefix.data(), batch, heads};
  std::set<std::tuple<int, int, int>> seen;
  int expected = 0;
  for (int length : lengths) {
    expected += heads * ((length + block_m - 1) / block_m);
  }
  ASSERT_EQ(tiles.num_tiles(), expected);
  VarlenTile previous{-1, -1, -1, 0};
  for (int index = 0; index < tiles.num_tiles(); ++index) {
    const VarlenTile t = tiles.tile(index);
    ASSERT_GE(t.batch, 0);
    ASSERT_LT(t.batch, batch);
    ASSERT_EQ(t.m_blocks, (lengths[t.batch] + block_m - 1) / block_m) << index;
    ASSERT_LT(t.m_block, t.m_blocks) << index;
    ASSERT_LT(t.head, heads) << index;
    EXPECT_TRUE(seen.insert({t.batch, t.head, t.m_block}).second) << "tile " << index << " twice";
    if (index > 0 && (t.batch != previous.batch || t.head != previous.head)) {
      EXPECT_EQ(previous.m_block, previous.m_blocks - 1) << "a head's blocks split at " << index;
      EXPECT_EQ(t.m_block, 0) << index;
    }
    previous = t;
  }
  EXPECT_EQ(static_cast<int>(seen.size()), expected);
}

TEST(VarlenTiles, EveryQueryBlockOnceWithEmptySequences) {
  expect_every_block_once({0, 1, 128, 129, 0, 0, 1000, 17, 0}, 4, 128);
  expect_every_block_once({3000}, 16, 64);
  expect_every_block_once({0, 0, 5}, 2, 192);
}

TEST(VarlenTiles, RandomRaggedBatches) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 50; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 40);
    std::vector<int> lengths(batch);
    for (int& length : lengths) {
      length = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 3000);
    }
    expect_every_block_once(lengths, 1 + static_cast<int>(rng() % 8), trial % 2 ? 128 : 192);
  }
}

TEST(VarlenTiles, MalformedCuSeqlensStayInsideTheTensor) {
  constexpr int kTotal = 100;
  const std::vector<int> cu = {-5, 40, 30, 120, 90, 100};  // negative, decreasing, past the end
  for (int b = 0; b + 1 < static_cast<int>(cu.size()); ++b) {
    const auto r = seq_range(cu.data(), nullptr, b, kTotal);
    EXPECT_GE(r.begin, 0) << b;
    EXPECT_GE(r.length, 0) << b;
    EXPECT_LE(r.begin + r.length, kTotal) << b;
  }
  EXPECT_EQ(seq_range(cu.data(), nullptr, 0, kTotal).length, 40);  // [0, 40)
  EXPECT_EQ(seq_range(cu.data(), nullptr, 1, kTotal).length, 0);   // 40 -> 30: empty
  EXPECT_EQ(seq_range(cu.data(), nullptr, 2, kTotal).length, 70);  // [30, 100): clamped
  EXPECT_EQ(seq_range(cu.data(), nullptr, 3, kTotal).length, 0);   // starts past the end
}

TEST(VarlenTiles, SequsedKeepsEachSequencesFirstRows) {
  const std::vector<int> cu = {0, 40, 100, 100, 130};
  const std::vector<int> used = {10, 70, 5, -3};  // under, over, in an empty one, negative
  EXPECT_EQ(seq_range(cu.data(), used.data(), 0, 130).length, 10);
  EXPECT_EQ(seq_range(cu.data(), used.data(), 1, 130).length, 60);
  EXPECT_EQ(seq_range(cu.data(), used.data(), 2, 130).length, 0);
  EXPECT_EQ(seq_range(cu.data(), used.data(), 3, 130).length, 0);
  EXPECT_EQ(seq_range(cu.data(), used.data(), 1, 130).begin, 40);
  std::vector<int> prefix(5);
  block_prefix(cu.data(), used.data(), 4, 130, 8, prefix.data());
  EXPECT_EQ(prefix, (std::vector<int>{0, 2, 10, 10, 10}));
}

// Overlapping sequences (each clamped into the tensor, not apart from the
// others) would sum to more query blocks than the grid was sized for, past
// 2^31 with enough of them: the prefix saturates, stays non-decreasing, and
// every tile still lands inside its sequence.
TEST(VarlenTiles, OverlappingSequencesSaturateThePrefix) {
  constexpr int kTotal = 1 << 20, kBatch = 1 << 12, kBlockM = 128;
  std::vector<int> cu(kBatch + 1);
  for (int b = 0; b <= kBatch; ++b) {
    cu[b] = b % 2 == 0 ? 0 : kTotal;  // every even sequence is the whole tensor
  }
  std::vector<int> prefix(kBatch + 1);
  block_prefix(cu.data(), nullptr, kBatch, kTotal, kBlockM, prefix.data());
  const int cap = kTotal / kBlockM + kBatch;
  for (int b = 0; b < kBatch; ++b) {
    ASSERT_LE(prefix[b], prefix[b + 1]) << b;
  }
  EXPECT_EQ(prefix[kBatch], cap);
  const VarlenTiles tiles{prefix.data(), kBatch, 3};
  for (int index = 0; index < tiles.num_tiles(); index += 997) {
    const VarlenTile t = tiles.tile(index);
    ASSERT_GE(t.m_blocks, 1) << index;
    ASSERT_LT(t.m_block, t.m_blocks) << index;
    const int length = seq_range(cu.data(), nullptr, t.batch, kTotal).length;
    ASSERT_LT(t.m_block * kBlockM, length) << index;
  }
}

}  // namespace

// The varlen backward's per-query-row workspace (src/sm90/bwd/workspace.hpp):
// each (sequence, head) keeps its whole query blocks in rows of its own,
// inside its head's padded_seqlen_q rows, apart from every other's; with
// seqused_q and with malformed offsets too (apart then only if they do not
// overlap, but always inside). Key blocks fit the layout's num_n_blocks.
void expect_query_rows_apart(const std::vector<int>& cu, const std::vector<int>& used, int heads,
                             int headdim, bool well_formed) {
  namespace bwd = flash3::sm90::bwd;
  const int batch = static_cast<int>(cu.size()) - 1;
  const int total = cu.back() < 0 ? 0 : cu.back();
  const auto w = bwd::WorkspaceLayout::of(1, total, total, heads, heads, headdim, headdim, false,
                                          batch);
  const int block_m = w.block_m;
  const flash3::sm90::VarlenSequences varlen{cu.data(), cu.data(), used.empty() ? nullptr : used.data(),
                                             nullptr, nullptr, batch, total, total};
  std::vector<std::pair<int64_t, int64_t>> regions;
  for (int h = 0; h < heads; ++h) {
    for (int b = 0; b < batch; ++b) {
      const bwd::QueryRows q =
          bwd::query_rows(varlen, b, h, heads, total, w.padded_seqlen_q, block_m);
      ASSERT_EQ(q.batch, 0);
      ASSERT_GE(q.row0, 0);
      ASSERT_LE(q.row0 + q.length, total) << b;
      ASSERT_EQ(q.ws_row0 % block_m, 0) << b;
      const int64_t rows = (q.length + block_m - 1) / block_m * int64_t{block_m};
      ASSERT_GE(q.ws_row0, h * w.padded_seqlen_q) << b;
      ASSERT_LE(q.ws_row0 + rows, (h + 1) * w.padded_seqlen_q) << b;
      ASSERT_EQ(q.lse_row0, int64_t{h} * total + q.row0);
      if (rows > 0) {
        regions.emplace_back(q.ws_row0, q.ws_row0 + rows);
      }
    }
  }
  if (well_formed) {
    std::sort(regions.begin(), regions.end());
    for (size_t i = 1; i < regions.size(); ++i) {
      EXPECT_LE(regions[i - 1].second, regions[i].first) << "workspace rows shared";
    }
  }
  std::vector<int> key_prefix(batch + 1);
  flash3::sm90::block_prefix(cu.data(), nullptr, batch, total, w.block_n, key_prefix.data());
  EXPECT_LE(key_prefix[batch], w.num_n_blocks);
}

TEST(VarlenBackwardWorkspace, SequencesKeepTheirQueryRowsApart) {
  std::mt19937 rng(4321);
  for (int trial = 0; trial < 40; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 30);
    std::vector<int> lengths(batch), used(batch);
    for (int b = 0; b < batch; ++b) {
      lengths[b] = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 700);
      used[b] = static_cast<int>(rng() % (lengths[b] + 2));
    }
    const std::vector<int> cu = cu_seqlens_of(lengths);
    for (const int headdim : {64, 128, 256}) {
      expect_query_rows_apart(cu, {}, 1 + trial % 3, headdim, true);
      expect_query_rows_apart(cu, used, 2, headdim, true);
    }
  }
  // Malformed offsets: clamped inside, never outside the head's rows.
  expect_query_rows_apart({-5, 40, 30, 120, 90, 100}, {}, 2, 128, false);
}
