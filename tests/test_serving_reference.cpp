// The serving references (reference/serving_ref.hpp) against the padded
// reference and against the properties that define them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "reference/serving_ref.hpp"

namespace flash3::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& value : x) {
    value = round_to(HalfType::kBFloat16, normal(rng));
  }
  return x;
}

struct Inputs {
  std::vector<float> q, k, v;
};

// Rows [begin, end) of every batch of a (batch, seqlen, heads, headdim) tensor.
std::vector<float> rows(const std::vector<float>& x, int batch, int seqlen, int row_size, int begin,
                        int end) {
  std::vector<float> out;
  for (int b = 0; b < batch; ++b) {
    const auto first = x.begin() + (static_cast<size_t>(b) * seqlen + begin) * row_size;
    out.insert(out.end(), first, first + static_cast<size_t>(end - begin) * row_size);
  }
  return out;
}

// ------------------------------------------------------------------ varlen

// Ragged sequences, each with inputs of its own, packed; every sequence of
// the varlen result equals attention_forward on that sequence alone.
TEST(ServingVarlen, MatchesThePaddedReferencePerSequence) {
  const std::vector<int> lens_q{17, 0, 1, 113, 5, 1}, lens_k{113, 9, 0, 40, 5, 17};
  const size_t hq = 4, hk = 2, d = 16;
  VarlenShape vs{{0}, {0}, hq, hk, d};
  std::vector<Shape> shapes;
  std::vector<Inputs> seqs;
  Inputs packed;
  for (size_t b = 0; b < lens_q.size(); ++b) {
    vs.cu_seqlens_q.push_back(vs.cu_seqlens_q.back() + lens_q[b]);
    vs.cu_seqlens_k.push_back(vs.cu_seqlens_k.back() + lens_k[b]);
    shapes.push_back(Shape{1, lens_q[b], lens_k[b], hq, hk, d});
    seqs.push_back({random_values(shapes[b].q_size(), 10 * b),
                    random_values(shapes[b].kv_size(), 10 * b + 1),
                    random_values(shapes[b].kv_size(), 10 * b + 2)});
    packed.q.insert(packed.q.end(), seqs[b].q.begin(), seqs[b].q.end());
    packed.k.insert(packed.k.end(), seqs[b].k.begin(), seqs[b].k.end());
    packed.v.insert(packed.v.end(), seqs[b].v.begin(), seqs[b].v.end());
  }
  const size_t total_q = vs.total_q();
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    const Reference r = attention_forward_varlen(vs, packed.q, packed.k, packed.v, 0.25, causal);
    ASSERT_EQ(r.out.size(), packed.q.size());
    ASSERT_EQ(r.lse.size(), hq * total_q);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const Reference want =
          attention_forward(shapes[b], seqs[b].q, seqs[b].k, seqs[b].v, 0.25, causal);
      const size_t q0 = vs.cu_seqlens_q[b], lq = lens_q[b];
      for (size_t x = 0; x < want.out.size(); ++x) {
        ASSERT_EQ(r.out[q0 * hq * d + x], want.out[x]) << "sequence " << b;
      }
      for (size_t h = 0; h < hq; ++h) {
        for (size_t i = 0; i < lq; ++i) {
          ASSERT_EQ(r.lse[h * total_q + q0 + i], want.lse[h * lq + i])
              << "sequence " << b << " head " << h << " row " << i;
        }
      }
    }
    // Sequence 2 has a query and no key: zeros and +inf.
    const size_t row2 = vs.cu_seqlens_q[2];
    EXPECT_EQ(r.lse[row2], kInf);
    EXPECT_EQ(r.out[row2 * hq * d], 0.0);
  }
}

// Equal lengths: the packed tensors are the padded batch's, the lse relaid.
TEST(ServingVarlen, EqualLengthsMatchTheBatchedReference) {
  const Shape s{3, 33, 33, 4, 2, 16};
  const VarlenShape vs{{0, 33, 66, 99}, {0, 33, 66, 99}, 4, 2, 16};
  const auto q = random_values(s.q_size(), 1), k = random_values(s.kv_size(), 2),
             v = random_values(s.kv_size(), 3);
  const Reference want = attention_forward(s, q, k, v, 0.125, true);
  const Reference r = attention_forward_varlen(vs, q, k, v, 0.125, true);
  EXPECT_EQ(r.out, want.out);
  for (size_t b = 0; b < 3; ++b) {
    for (size_t h = 0; h < 4; ++h) {
      for (size_t i = 0; i < 33; ++i) {
        ASSERT_EQ(r.lse[h * 99 + b * 33 + i], want.lse[(b * 4 + h) * 33 + i]);
      }
    }
  }
  const VarlenShape bad{{0, 40, 33}, {0, 33, 66}, 4, 2, 16};
  EXPECT_THROW(attention_forward_varlen(bad, q, k, v, 0.125, true), std::invalid_argument);
}

// ------------------------------------------------------------- paged cache

// A contiguous cache written into shuffled pages (the rest of the pool and
// the unused table entries garbage) comes back exactly, zero past each length.
void check_gather(int page_size, const std::vector<int>& lens, int max_pages, int max_seqlen) {
  const int hk = 2, d = 8;
  const size_t row = hk * d, batch = lens.size(), ps = page_size, mp = max_pages, ms = max_seqlen;
  std::vector<float> want = random_values(batch * ms * row, 7);
  int used = 0;
  for (size_t b = 0; b < batch; ++b) {
    std::fill(want.begin() + (b * ms + lens[b]) * row, want.begin() + (b + 1) * ms * row, 0.0f);
    used += (lens[b] + page_size - 1) / page_size;
  }
  const int num_pages = used + 3;
  std::vector<int> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(11));
  std::vector<float> pool = random_values(num_pages * ps * row, 8);
  std::vector<int> table(batch * mp, -1);
  for (size_t b = 0, next = 0; b < batch; ++b) {
    for (size_t j = 0; j < static_cast<size_t>(lens[b]); ++j) {
      int& page = table[b * mp + j / ps];
      if (j % ps == 0) {
        page = ids[next++];
      }
      std::copy_n(want.begin() + (b * ms + j) * row, row,
                  pool.begin() + (page * ps + j % ps) * row);
    }
  }
  EXPECT_EQ(gather_pages(pool, page_size, hk, d, table, max_pages, lens, max_seqlen), want);

  std::vector<int> bad = table;
  bad[0] = num_pages;  // sequence 0 is never empty here
  EXPECT_THROW(gather_pages(pool, page_size, hk, d, bad, max_pages, lens, max_seqlen),
               std::invalid_argument);
  bad[0] = -1;
  EXPECT_THROW(gather_pages(pool, page_size, hk, d, bad, max_pages, lens, max_seqlen),
               std::invalid_argument);
  std::vector<int> long_lens = lens;
  long_lens[0] = max_pages * page_size + 1;
  EXPECT_THROW(
      gather_pages(pool, page_size, hk, d, table, max_pages, long_lens, max_pages * page_size + 1),
      std::invalid_argument);
  long_lens[0] = max_seqlen + 1;
  EXPECT_THROW(gather_pages(pool, page_size, hk, d, table, max_pages, long_lens, max_seqlen),
               std::invalid_argument);
}

TEST(ServingPaged, GatherPageSize16) { check_gather(16, {17, 0, 1, 16, 50, 64}, 4, 64); }

TEST(ServingPaged, GatherPageSize256) { check_gather(256, {257, 255, 256, 600, 3}, 3, 700); }

// ----------------------------------------------------------------- rotary

const RotaryShape kRotary{2, 5, 3, 24, 16};  // 8 dimensions past rotary_dim

std::vector<double> rotate(const std::vector<float>& x, const RotaryShape& s,
                           std::vector<int> offsets, bool interleaved) {
  const RotaryTables t = rotary_tables(128, s.rotary_dim);
  return apply_rotary(s, x, t.cos, t.sin, offsets, interleaved);
}

// Position 1 of the table turns pair 0 by 90 degrees ((x1, x2) -> (-x2, x1)),
// pair 1 not at all; position 0 is the identity. The float tables' overload.
TEST(ServingRotary, QuarterTurnByHand) {
  const RotaryShape s{1, 2, 1, 6, 4};
  const std::vector<float> cos{1, 1, 0, 1}, sin{0, 0, 1, 0};
  const std::vector<float> x{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(apply_rotary(s, x, cos, sin, {0}, false),
            (std::vector<double>{1, 2, 3, 4, 5, 6, -3, 2, 1, 4, 5, 6}));
  EXPECT_EQ(apply_rotary(s, x, cos, sin, {0}, true),
            (std::vector<double>{1, 2, 3, 4, 5, 6, -2, 1, 3, 4, 5, 6}));
  EXPECT_THROW(apply_rotary(s, x, cos, sin, {1}, false), std::invalid_argument);  // past table
  EXPECT_THROW(apply_rotary(RotaryShape{1, 2, 1, 6, 3}, x, cos, sin, {0}, false),
               std::invalid_argument);  // odd rotary_dim
}

TEST(ServingRotary, PositionZeroIsTheIdentity) {
  const RotaryShape s{2, 1, 3, 24, 16};
  const std::vector<float> x = random_values(2 * 3 * 24, 20);
  for (const bool interleaved : {false, true}) {
    EXPECT_EQ(rotate(x, s, {0, 0}, interleaved), std::vector<double>(x.begin(), x.end()));
  }
}

// Every pair keeps its norm, something turns, and the tail is copied.
TEST(ServingRotary, PreservesPairNormsAndTheTail) {
  const std::vector<float> x = random_values(2 * 5 * 3 * 24, 21);
  for (const bool interleaved : {false, true}) {
    const std::vector<double> y = rotate(x, kRotary, {3, 60}, interleaved);
    EXPECT_NE(y, std::vector<double>(x.begin(), x.end()));
    for (size_t r = 0; r < x.size() / 24; ++r) {
      for (int i = 0; i < 8; ++i) {
        const size_t a = r * 24 + (interleaved ? 2 * i : i);
        const size_t b = r * 24 + (interleaved ? 2 * i + 1 : i + 8);
        const double before = std::hypot(double{x[a]}, double{x[b]}),
                     after = std::hypot(y[a], y[b]);
        ASSERT_NEAR(after, before, 1e-12 * before);
      }
      for (int t = 16; t < 24; ++t) {
        ASSERT_EQ(y[r * 24 + t], x[r * 24 + t]);
      }
    }
  }
}

// q at position m, k at n: q . k depends on m - n only.
TEST(ServingRotary, DotProductDependsOnRelativePosition) {
  const RotaryShape s{1, 1, 1, 24, 16};
  const std::vector<float> q = random_values(24, 22), k = random_values(24, 23);
  for (const bool interleaved : {false, true}) {
    const auto score = [&](int m, int n) {
      const std::vector<double> a = rotate(q, s, {m}, interleaved),
                                b = rotate(k, s, {n}, interleaved);
      return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
    };
    EXPECT_NEAR(score(7, 3), score(100, 96), 1e-9);
    EXPECT_NEAR(score(0, 50), score(70, 120), 1e-9);
    EXPECT_GT(std::fabs(score(7, 3) - score(7, 5)), 1e-3);
  }
}

// Interleaved on x with dims permuted (2i <- i, 2i + 1 <- i + 8) is the
// permuted non-interleaved result.
TEST(ServingRotary, InterleavedIsAPermutationOfNonInterleaved) {
  const std::vector<float> x = random_values(2 * 5 * 3 * 24, 24);
  std::vector<int> perm(24);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = 0; i < 8; ++i) {
    perm[2 * i] = i;
    perm[2 * i + 1] = i + 8;
  }
  const auto permute = [&perm](const auto& from) {
    auto to = from;
    for (size_t r = 0; r < from.size() / 24; ++r) {
      for (int t = 0; t < 24; ++t) {
        to[r * 24 + t] = from[r * 24 + perm[t]];
      }
    }
    return to;
  };
  EXPECT_EQ(rotate(permute(x), kRotary, {3, 60}, true),
            permute(rotate(x, kRotary, {3, 60}, false)));
}

// ---------------------------------------------------------------- combine

// Keys split into chunks (one empty), each chunk's reference a partial: the
// combine is the unsplit reference, and shifting every partial lse by 1000
// shifts the result's by 1000 only (no overflow).
TEST(ServingCombine, SplitKeysMatchTheUnsplitReference) {
  const Shape s{2, 9, 70, 4, 2, 16};
  const std::vector<int> bounds{0, 20, 20, 45, 70};
  const auto q = random_values(s.q_size(), 30), k = random_values(s.kv_size(), 31),
             v = random_values(s.kv_size(), 32);
  const Reference want = attention_forward(s, q, k, v, 0.25, false);
  std::vector<double> out_partial, lse_partial;
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    Shape chunk = s;
    chunk.seqlen_k = bounds[c + 1] - bounds[c];
    const int row = s.heads_k * s.headdim;
    const Reference part =
        attention_forward(chunk, q, rows(k, s.batch, s.seqlen_k, row, bounds[c], bounds[c + 1]),
                          rows(v, s.batch, s.seqlen_k, row, bounds[c], bounds[c + 1]), 0.25, false);
    out_partial.insert(out_partial.end(), part.out.begin(), part.out.end());
    lse_partial.insert(lse_partial.end(), part.lse.begin(), part.lse.end());
  }
  const CombineShape cs{4, s.batch, s.seqlen_q, s.heads_q, s.headdim};
  for (const double shift : {0.0, 1000.0}) {
    std::vector<double> lse_shifted = lse_partial;
    for (double& l : lse_shifted) {
      l += shift;
    }
    const Reference r = attention_combine(cs, out_partial, lse_shifted);
    ASSERT_EQ(r.out.size(), want.out.size());
    ASSERT_EQ(r.lse.size(), want.lse.size());
    for (size_t x = 0; x < want.out.size(); ++x) {
      ASSERT_NEAR(r.out[x], want.out[x], 1e-12 * std::max(1.0, std::fabs(want.out[x])));
    }
    for (size_t x = 0; x < want.lse.size(); ++x) {
      const double lse = want.lse[x] + shift;
      ASSERT_NEAR(r.lse[x], lse, 1e-12 * std::max(1.0, std::fabs(lse)));
    }
  }
}

// Row 0: no split saw a key (lse +inf or -inf): zeros and +inf. Row 1: one
// split did: its out and lse exactly. The float overload.
TEST(ServingCombine, RowsWithoutKeys) {
  const CombineShape cs{3, 1, 2, 1, 2};
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> out_partial{5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 9};
  const std::vector<float> lse_partial{inf, inf, -inf, 1.5f, inf, -inf};
  const Reference r = attention_combine(cs, out_partial, lse_partial);
  EXPECT_EQ(r.out, (std::vector<double>{0, 0, 3, 4}));
  EXPECT_EQ(r.lse, (std::vector<double>{kInf, 1.5}));
}

}  // namespace
}  // namespace flash3::ref
