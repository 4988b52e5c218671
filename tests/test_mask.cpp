// The kernels' mask (src/sm90/common/mask.cuh) against the float64
// reference's visible keys (reference/attention_ref.hpp:
// visible_key_range): for causal, sliding windows (either side bounded or
// not, with causal or not) and no mask, over random lengths, the key blocks
// a query tile visits hold every key its rows see, a block that hides a key
// from a row of the tile is masked, and apply() hides exactly the keys a
// row does not see, in the wgmma accumulator's layout. The backward's side:
// the query blocks a key block meets hold every row that sees one of its
// keys, key block n meets query block m exactly when the forward's tile m
// visits n (the deterministic dQ order counts on it), and apply_transposed
// hides exactly the hidden (key, query) pairs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "reference/attention_ref.hpp"
#include "src/sm90/common/mask.cuh"

namespace {

using flash3::ref::KeyRange;
using flash3::ref::Shape;
using flash3::ref::Variant;

struct Window {
  bool causal;
  int left;   // -1: unbounded
  int right;  // -1: unbounded
  int chunk = 0;  // attention_chunk, 0: none
};

std::string describe(const Shape& s, const Window& w) {
  return "seqlen_q " + std::to_string(s.seqlen_q) + " seqlen_k " + std::to_string(s.seqlen_k) +
         (w.causal ? " causal" : "") + " window (" + std::to_string(w.left) + ", " +
         std::to_string(w.right) + ") chunk " + std::to_string(w.chunk);
}

// What the launch gives the kernels (problem.hpp: mask_window_left/right).
template <int kBlockM, int kBlockN, bool kMasked>
flash3::sm90::Mask<kBlockM, kBlockN, kMasked> mask_of(const Shape& s, const Window& w) {
  flash3::detail::AttentionProblem p;
  p.seqlen_q = s.seqlen_q;
  p.seqlen_k = s.seqlen_k;
  p.causal = w.causal;
  p.window_left = w.left;
  p.window_right = w.right;
  p.attention_chunk = w.chunk;
  EXPECT_EQ(p.masked(), kMasked);
  return {s.seqlen_q, s.seqlen_k, p.mask_window_left(), p.mask_window_right(), p.mask_chunk()};
}

template <int kBlockM, int kBlockN, bool kMasked>
void expect_mask_matches(const Shape& s, const Window& w) {
  SCOPED_TRACE(describe(s, w) + " blocks " + std::to_string(kBlockM) + "x" +
               std::to_string(kBlockN));
  const auto mask = mask_of<kBlockM, kBlockN, kMasked>(s, w);
  const Variant variant{w.left, w.right, 0.0, {}, w.chunk};
  const auto seen = [&](int row) { return flash3::ref::visible_key_range(s, w.causal, variant, row); };
  const int m_blocks = (s.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_blocks = (s.seqlen_k + kBlockN - 1) / kBlockN;
  for (int m = 0; m < m_blocks; ++m) {
    const int begin = mask.n_block_begin(m), end = mask.n_block_end(m);
    ASSERT_GE(begin, 0);
    ASSERT_LE(end, n_blocks);
    const int last_row = std::min((m + 1) * kBlockM, s.seqlen_q) - 1;
    for (int row = m * kBlockM; row <= last_row; ++row) {
      const KeyRange keys = seen(row);
      if (keys.first < keys.end) {  // every visible key in a visited block
        ASSERT_GE(keys.first / kBlockN, begin) << "row " << row;
        ASSERT_LT((keys.end - 1) / kBlockN, end) << "row " << row;
      }
      for (int n = begin; n < end; ++n) {
        const bool hides = keys.first > n * kBlockN || keys.end < (n + 1) * kBlockN;
        if (hides) {
          ASSERT_TRUE(mask.needs_mask(m, n)) << "row " << row << " block " << n;
        }
      }
    }
    // apply(): each thread of the tile's warps, each visited block (masked or
    // not, so the check covers apply's ranges wherever they are used).
    for (int n = begin; n < end; ++n) {
      for (int row0 = m * kBlockM; row0 < (m + 1) * kBlockM; row0 += 16) {
        for (int g = 0; g < 8; ++g) {
          for (int col_pair = 0; col_pair < 4; ++col_pair) {
            constexpr int kRegs = kBlockN / 2;  // kBlockN / 8 groups of 4
            float acc[kRegs];
            for (float& x : acc) {
              x = 1.0f;
            }
            const int r0 = row0 + g, col0 = n * kBlockN + 2 * col_pair;
            mask.apply(acc, r0, col0);
            for (int i = 0; i < kRegs; ++i) {
              const int row = r0 + 8 * flash3::sm90::acc_row(i);
              const int key = col0 + (i / 4) * 8 + (i & 1);
              if (row >= s.seqlen_q) {
                continue;  // never stored
              }
              const KeyRange keys = seen(row);
              const bool visible = key >= keys.first && key < keys.end;
              ASSERT_EQ(!std::isinf(acc[i]), visible) << "row " << row << " key " << key;
            }
          }
        }
      }
    }
  }
}

template <int kBlockM, int kBlockN, bool kMasked>
void expect_backward_mask_matches(const Shape& s, const Window& w) {
  SCOPED_TRACE(describe(s, w) + " blocks " + std::to_string(kBlockM) + "x" +
               std::to_string(kBlockN) + " (backward)");
  const auto mask = mask_of<kBlockM, kBlockN, kMasked>(s, w);
  const Variant variant{w.left, w.right, 0.0, {}, w.chunk};
  const auto seen = [&](int row) { return flash3::ref::visible_key_range(s, w.causal, variant, row); };
  const int m_blocks = mask.num_m_blocks();
  const int n_blocks = (s.seqlen_k + kBlockN - 1) / kBlockN;
  for (int n = 0; n < n_blocks; ++n) {
    const int begin = mask.m_block_begin(n), end = mask.m_block_end(n);
    ASSERT_GE(begin, 0);
    ASSERT_LE(end, m_blocks);
    for (int row = 0; row < s.seqlen_q; ++row) {
      const KeyRange keys = seen(row);
      const bool meets = keys.first < std::min(keys.end, (n + 1) * kBlockN) &&
                         std::max(keys.first, n * kBlockN) < keys.end;
      if (meets) {
        ASSERT_TRUE(row / kBlockM >= begin && row / kBlockM < end) << "row " << row << " block " << n;
      }
    }
    for (int m = 0; m < m_blocks; ++m) {
      const bool backward = m >= begin && m < end;
      const bool forward = n >= mask.n_block_begin(m) && n < mask.n_block_end(m);
      ASSERT_EQ(backward, forward) << "query block " << m << " key block " << n;
    }
    // apply_transposed: rows = keys (key0, key0 + 8), columns = queries.
    for (int m = begin; m < end; ++m) {
      for (int key_row0 = n * kBlockN; key_row0 < (n + 1) * kBlockN; key_row0 += 16) {
        for (int g = 0; g < 8; ++g) {
          for (int col_pair = 0; col_pair < 4; ++col_pair) {
            constexpr int kRegs = kBlockM / 2;
            float acc[kRegs];
            for (float& x : acc) {
              x = 1.0f;
            }
            const int k0 = key_row0 + g, col0 = m * kBlockM + 2 * col_pair;
            mask.apply_transposed(acc, k0, col0);
            for (int i = 0; i < kRegs; ++i) {
              const int key = k0 + 8 * flash3::sm90::acc_row(i);
              const int row = col0 + (i / 4) * 8 + (i & 1);
              if (row >= s.seqlen_q) {
                continue;  // padded query rows: never used
              }
              const KeyRange keys = seen(row);
              const bool visible = key >= keys.first && key < keys.end;
              ASSERT_EQ(!std::isinf(acc[i]), visible) << "row " << row << " key " << key;
            }
          }
        }
      }
    }
  }
}

template <int kBlockM, int kBlockN>
void sweep_backward(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, 500), side(-1, 300), coin(0, 1), chunk(1, 400);
  for (int trial = 0; trial < 40; ++trial) {
    Shape s;
    s.seqlen_q = length(rng);
    s.seqlen_k = coin(rng) ? s.seqlen_q : length(rng);
    expect_backward_mask_matches<kBlockM, kBlockN, false>(s, {false, -1, -1});
    expect_backward_mask_matches<kBlockM, kBlockN, true>(s, {true, -1, -1});
    Window w{coin(rng) == 1, side(rng), side(rng)};
    if (w.left < 0 && w.right < 0) {
      w.right = 0;
    }
    expect_backward_mask_matches<kBlockM, kBlockN, true>(s, w);
    expect_backward_mask_matches<kBlockM, kBlockN, true>(s, {false, 0, 0});
    expect_backward_mask_matches<kBlockM, kBlockN, true>(s, {coin(rng) == 1, -1, -1, chunk(rng)});
    expect_backward_mask_matches<kBlockM, kBlockN, true>(
        s, {coin(rng) == 1, side(rng), side(rng), chunk(rng)});
    if (::testing::Test::HasFatalFailure()) {
      return;
    }
  }
}

// The backward's tiles (src/sm90/bwd/traits.cuh: 128 x 128, 64 x 128, 64 x 64).
TEST(Mask, BackwardMatchesTheReferenceVisibleKeys) {
  sweep_backward<64, 128>(11);
  sweep_backward<128, 128>(12);
  sweep_backward<64, 64>(13);
}

template <int kBlockM, int kBlockN>
void sweep(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, 700), side(-1, 300), coin(0, 1), chunk(1, 400);
  for (int trial = 0; trial < 60; ++trial) {
    Shape s;
    s.seqlen_q = length(rng);
    s.seqlen_k = coin(rng) ? s.seqlen_q : length(rng);
    expect_mask_matches<kBlockM, kBlockN, false>(s, {false, -1, -1});
    expect_mask_matches<kBlockM, kBlockN, true>(s, {true, -1, -1});
    Window w{coin(rng) == 1, side(rng), side(rng)};
    if (w.left < 0 && w.right < 0) {
      w.left = 0;  // a window (-1, -1) is no window
    }
    expect_mask_matches<kBlockM, kBlockN, true>(s, w);
    expect_mask_matches<kBlockM, kBlockN, true>(s, {coin(rng) == 1, 0, 0});  // the diagonal only
    // attention chunks, alone or within a window (FlashAttention-3's attention_chunk)
    expect_mask_matches<kBlockM, kBlockN, true>(s, {coin(rng) == 1, -1, -1, chunk(rng)});
    expect_mask_matches<kBlockM, kBlockN, true>(s, {coin(rng) == 1, side(rng), side(rng), chunk(rng)});
    if (::testing::Test::HasFatalFailure()) {
      return;
    }
  }
}

TEST(Mask, MatchesTheReferenceVisibleKeys) {
  sweep<128, 128>(1);
  sweep<192, 128>(2);
  sweep<128, 176>(3);
  sweep<64, 64>(4);
  sweep<128, 80>(5);
}

}  // namespace
