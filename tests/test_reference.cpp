// The float64 reference and the plain fp16/bf16 emulation, on their own.
#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "reference/attention_ref.hpp"

namespace flash3::ref {
namespace {

constexpr double kExact = 1e-12;  // float64 against float64: only rounding differs
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> random_values(size_t n, unsigned seed, HalfType type = HalfType::kBFloat16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& value : x) {
    value = round_to(type, normal(rng));
  }
  return x;
}

// Small integers: sums of their products are exact in float and double.
std::vector<float> random_integers(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> x(n);
  for (float& value : x) {
    value = static_cast<float>(small(rng));
  }
  return x;
}

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs random_inputs(const Shape& s, unsigned seed) {
  return {random_values(s.q_size(), seed), random_values(s.kv_size(), seed + 1),
          random_values(s.v_size(), seed + 2)};
}

Reference run(const Shape& s, const Inputs& in, double scale, bool causal) {
  return attention_forward(s, in.q, in.k, in.v, scale, causal);
}

void expect_near_all(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], kExact) << "element " << i;
  }
}

// One query, two keys, headdim 2, worked by hand: scores 1 and 2 (times scale).
TEST(Reference, OneQueryTwoKeysByHand) {
  const Shape s{1, 1, 2, 1, 1, 2};
  const Inputs in{{1, 2}, {1, 0, 0, 1}, {2, -1, 0, 3}};
  for (const double scale : {1.0, 0.5}) {
    SCOPED_TRACE(scale);
    const double e0 = std::exp(scale * 1), e1 = std::exp(scale * 2);
    const double p0 = e0 / (e0 + e1), p1 = e1 / (e0 + e1);
    const Reference r = run(s, in, scale, false);
    expect_near_all(r.out, {2 * p0, -p0 + 3 * p1});
    expect_near_all(r.lse, {std::log(e0 + e1)});
  }
}

// Equal scores: out is the mean of the values, lse = scale * score + log(keys).
TEST(Reference, EqualScoresAverageTheValues) {
  const Shape s{1, 1, 4, 1, 1, 2};
  const Inputs in{{1, 1}, {1, 2, 2, 1, 0, 3, 3, 0}, {1, 2, 3, 4, 5, 6, 7, 8}};
  const Reference r = run(s, in, 0.25, false);
  expect_near_all(r.out, {4, 5});
  expect_near_all(r.lse, {0.25 * 3 + std::log(4.0)});
}

// Adding t * q to every key adds t * |q|^2 to every score of q's row: the
// softmax ignores it, the lse moves by scale * t * |q|^2.
TEST(Reference, ScoreShiftMovesOnlyTheLse) {
  const Shape s{1, 1, 7, 1, 1, 8};
  const Inputs in{random_integers(s.q_size(), 1), random_integers(s.kv_size(), 2),
                  random_values(s.kv_size(), 3)};
  const double scale = 0.125, t = 2;
  Inputs shifted = in;
  double q_norm2 = 0;
  for (int x = 0; x < s.headdim; ++x) {
    q_norm2 += in.q[x] * in.q[x];
  }
  for (size_t i = 0; i < shifted.k.size(); ++i) {
    shifted.k[i] += static_cast<float>(t * in.q[i % s.headdim]);
  }
  const Reference a = run(s, in, scale, false);
  const Reference b = run(s, shifted, scale, false);
  expect_near_all(b.out, a.out);
  expect_near_all(b.lse, {a.lse[0] + scale * t * q_norm2});
}

TEST(Reference, CausalMaskIsAlignedBottomRight) {
  EXPECT_EQ(visible_keys({1, 3, 7, 1, 1, 1}, true, 0), 5);
  EXPECT_EQ(visible_keys({1, 3, 7, 1, 1, 1}, true, 2), 7);
  EXPECT_EQ(visible_keys({1, 5, 5, 1, 1, 1}, true, 0), 1);
  EXPECT_EQ(visible_keys({1, 7, 3, 1, 1, 1}, true, 3), 0);
  EXPECT_EQ(visible_keys({1, 7, 3, 1, 1, 1}, true, 4), 1);
  EXPECT_EQ(visible_keys({1, 7, 3, 1, 1, 1}, false, 0), 3);
}

// Causal row i equals non-causal attention of that one query over the keys it sees.
TEST(Reference, CausalRowsSeeOnlyTheirPrefix) {
  const Shape shapes[] = {{1, 5, 5, 2, 1, 4}, {1, 3, 7, 2, 1, 4}, {1, 6, 4, 2, 1, 4}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << s.seqlen_q << "x" << s.seqlen_k);
    const Inputs in = random_inputs(s, 11);
    const Reference full = run(s, in, 0.5, true);
    for (int i = 0; i < s.seqlen_q; ++i) {
      const int keys = visible_keys(s, true, i);
      if (keys == 0) {
        continue;  // FullyMaskedRowsGiveZeroAndInfiniteLse
      }
      const Shape row_shape{1, 1, keys, s.heads_q, s.heads_k, s.headdim};
      const size_t q_row = row_shape.q_size(), kv_rows = row_shape.kv_size();
      const Inputs row{{in.q.begin() + i * q_row, in.q.begin() + (i + 1) * q_row},
                       {in.k.begin(), in.k.begin() + kv_rows},
                       {in.v.begin(), in.v.begin() + kv_rows}};
      const Reference r = run(row_shape, row, 0.5, false);
      expect_near_all(r.out, {full.out.begin() + i * q_row, full.out.begin() + (i + 1) * q_row});
      for (int h = 0; h < s.heads_q; ++h) {
        EXPECT_NEAR(r.lse[h], full.lse[h * s.seqlen_q + i], kExact);
      }
    }
  }
}

TEST(Reference, FullyMaskedRowsGiveZeroAndInfiniteLse) {
  const Shape s{2, 7, 3, 2, 2, 4};
  const Inputs in = random_inputs(s, 21);
  const Reference r = run(s, in, 0.5, true);
  const std::vector<float> plain =
      attention_forward_plain(HalfType::kBFloat16, s, in.q, in.k, in.v, 0.5f, true);
  const int row_size = s.heads_q * s.headdim;
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.seqlen_q; ++i) {
      const bool masked = visible_keys(s, true, i) == 0;
      for (int h = 0; h < s.heads_q; ++h) {
        const double lse = r.lse[(b * s.heads_q + h) * s.seqlen_q + i];
        EXPECT_EQ(lse == kInf, masked) << lse;
      }
      if (!masked) {
        continue;
      }
      const size_t row = (static_cast<size_t>(b) * s.seqlen_q + i) * row_size;
      for (int x = 0; x < row_size; ++x) {
        EXPECT_EQ(r.out[row + x], 0.0);
        EXPECT_EQ(plain[row + x], 0.0f);
      }
    }
  }
}

// Query head h reads kv head h / (heads_q / heads_k): the same as repeating kv heads.
TEST(Reference, GqaEqualsRepeatedKvHeads) {
  const Shape gqa{2, 5, 6, 8, 2, 4};
  const Shape mha{2, 5, 6, 8, 8, 4};
  const Inputs in = random_inputs(gqa, 31);
  Inputs repeated{in.q, std::vector<float>(mha.kv_size()), std::vector<float>(mha.kv_size())};
  const int group = gqa.heads_q / gqa.heads_k;
  for (size_t row = 0; row < static_cast<size_t>(mha.batch) * mha.seqlen_k; ++row) {
    for (int h = 0; h < mha.heads_k; ++h) {
      for (int x = 0; x < mha.headdim; ++x) {
        const size_t from = (row * gqa.heads_k + h / group) * gqa.headdim + x;
        const size_t to = (row * mha.heads_k + h) * mha.headdim + x;
        repeated.k[to] = in.k[from];
        repeated.v[to] = in.v[from];
      }
    }
  }
  const Reference a = run(gqa, in, 0.5, true);
  const Reference b = run(mha, repeated, 0.5, true);
  expect_near_all(a.out, b.out);
  expect_near_all(a.lse, b.lse);
}

TEST(Reference, BatchesAreIndependent) {
  const Shape two{2, 9, 5, 2, 1, 4};
  const Shape one{1, 9, 5, 2, 1, 4};
  const Inputs in = random_inputs(two, 41);
  const Reference both = run(two, in, 0.5, false);
  for (int b = 0; b < two.batch; ++b) {
    const auto slice = [b](const std::vector<float>& x, size_t n) {
      return std::vector<float>(x.begin() + b * n, x.begin() + (b + 1) * n);
    };
    const Inputs part{slice(in.q, one.q_size()), slice(in.k, one.kv_size()),
                      slice(in.v, one.kv_size())};
    const Reference r = run(one, part, 0.5, false);
    expect_near_all(
        r.out, {both.out.begin() + b * one.q_size(), both.out.begin() + (b + 1) * one.q_size()});
    expect_near_all(r.lse, {both.lse.begin() + b * one.lse_size(),
                            both.lse.begin() + (b + 1) * one.lse_size()});
  }
}

// v of its own head dim (dv != d): each output column is that of the same
// problem whose v holds only that column (the weights depend on q and k
// alone), and the lse is the same; the plain emulation sizes out the same
// way, and the backward refuses it.
TEST(Reference, ValueHeadDimOfItsOwn) {
  Shape s{2, 7, 9, 4, 2, 6};
  s.headdim_v = 3;
  const Inputs in{random_values(s.q_size(), 51), random_values(s.kv_size(), 52),
                  random_values(s.v_size(), 53)};
  ASSERT_EQ(s.out_size(), s.q_size() / 2);
  for (const bool causal : {false, true}) {
    const Reference all = attention_forward(s, in.q, in.k, in.v, 0.5, causal);
    Shape one = s;
    one.headdim_v = 1;
    for (int x = 0; x < s.dv(); ++x) {
      std::vector<float> column(one.v_size());
      for (size_t row = 0; row < column.size(); ++row) {
        column[row] = in.v[row * s.dv() + x];
      }
      const Reference r = attention_forward(one, in.q, in.k, column, 0.5, causal);
      for (size_t row = 0; row < r.out.size(); ++row) {
        ASSERT_NEAR(r.out[row], all.out[row * s.dv() + x], kExact) << "column " << x;
      }
      expect_near_all(r.lse, all.lse);
    }
    EXPECT_EQ(attention_forward_plain(HalfType::kBFloat16, s, in.q, in.k, in.v, 0.5f, causal).size(),
              s.out_size());
  }
  // The backward's dout is shaped like out; one of q's shape is refused.
  const std::vector<float> dout_like_q(s.q_size());
  EXPECT_THROW(attention_backward(s, in.q, in.k, in.v, dout_like_q, 0.5, false),
               std::invalid_argument);
  const Gradients g =
      attention_backward(s, in.q, in.k, in.v, std::vector<float>(s.out_size()), 0.5, false);
  EXPECT_EQ(g.dq.size(), s.q_size());
  EXPECT_EQ(g.dk.size(), s.kv_size());
  EXPECT_EQ(g.dv.size(), s.v_size());
}

// The plain emulation's error: nonzero, small, larger for bf16 than for fp16,
// and its outputs are values of its dtype.
TEST(PlainEmulation, ErrorIsThatOfItsDtype) {
  const Shape s{1, 64, 200, 2, 1, 64};
  const Inputs in = random_inputs(s, 51);
  const double scale = 0.125;
  const Reference r = run(s, in, scale, false);
  double max_error[2] = {};
  const HalfType types[2] = {HalfType::kFloat16, HalfType::kBFloat16};
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> plain =
        attention_forward_plain(types[t], s, in.q, in.k, in.v, static_cast<float>(scale), false);
    for (const float x : plain) {
      ASSERT_EQ(round_to(types[t], x), x);
    }
    max_error[t] = error_stats(plain, r.out).max_abs;
  }
  EXPECT_GT(max_error[0], 0.0);
  EXPECT_LT(max_error[0], max_error[1]);
  EXPECT_LT(max_error[1], 2e-2);
}

// sum(out * dout): the loss whose gradients attention_backward gives.
double loss(const Shape& s, const Inputs& in, const std::vector<float>& dout, double scale,
            bool causal, const Variant& variant = Variant{}) {
  const Reference r = attention_forward(s, in.q, in.k, in.v, scale, causal, variant);
  double sum = 0;
  for (size_t i = 0; i < dout.size(); ++i) {
    sum += r.out[i] * dout[i];
  }
  return sum;
}

// An input of the loss and its gradient.
struct GradientOf {
  const char* name;
  std::vector<float>& x;
  const std::vector<double>& grad;
};

// Every gradient element against central differences of loss_now() (which
// reads the inputs as they are). The step 2^-12 is exact in float on these
// bf16 inputs (|x| < 2^11), and the difference's error (step^2 / 6 times a
// third derivative) is ~1e-8.
void expect_finite_differences(std::initializer_list<GradientOf> tensors,
                               const std::function<double()>& loss_now) {
  constexpr float kStep = 1.0f / 4096;
  constexpr double kRelTol = 1e-6;
  for (const GradientOf& t : tensors) {
    ASSERT_EQ(t.grad.size(), t.x.size()) << t.name;
    for (size_t i = 0; i < t.x.size(); ++i) {
      const float x = t.x[i];
      t.x[i] = x + kStep;
      const double up = loss_now();
      t.x[i] = x - kStep;
      const double down = loss_now();
      t.x[i] = x;
      const double slope = (up - down) / (2 * kStep);
      ASSERT_NEAR(t.grad[i], slope, kRelTol * std::max(1.0, std::fabs(slope)))
          << t.name << " element " << i;
    }
  }
}

// One gradient case on fresh inputs from `seed` (moved on to the next
// case's): the float64 backward's dq, dk, dv (and dsinks with sinks) against
// finite differences of the loss.
void expect_gradients_match_finite_differences(const Shape& s, double scale, bool causal,
                                               Variant variant, unsigned& seed) {
  Inputs in = random_inputs(s, seed);
  const std::vector<float> dout = random_values(s.out_size(), seed + 3);
  seed += 10;
  const Gradients g = attention_backward(s, in.q, in.k, in.v, dout, scale, causal, variant);
  ASSERT_EQ(g.dsinks.size(), variant.sinks.size());
  expect_finite_differences({{"dq", in.q, g.dq},
                             {"dk", in.k, g.dk},
                             {"dv", in.v, g.dv},
                             {"dsinks", variant.sinks, g.dsinks}},
                            [&] { return loss(s, in, dout, scale, causal, variant); });
}

TEST(ReferenceBackward, MatchesFiniteDifferences) {
  struct Case {
    const char* name;
    Shape shape;
    bool causal;
    double scale;
  };
  const Case cases[] = {
      {"plain", {1, 4, 5, 2, 2, 4}, false, 0.5},
      {"causal, fewer queries", {1, 3, 6, 2, 2, 4}, true, 0.5},
      {"causal, fewer keys", {1, 6, 3, 2, 2, 4}, true, 0.5},
      {"gqa", {1, 4, 5, 4, 2, 4}, true, 0.5},
      {"mqa", {1, 4, 5, 3, 1, 4}, false, 0.5},
      {"batch 2", {2, 3, 4, 2, 1, 4}, true, 0.5},
      {"scale 1.3", {1, 4, 5, 2, 1, 4}, false, 1.3},
      {"v wider than q", {1, 4, 5, 2, 2, 4, 6}, false, 0.5},
      {"v narrower than q, gqa, causal", {2, 4, 5, 4, 2, 6, 2}, true, 0.5},
  };
  unsigned seed = 61;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_NO_FATAL_FAILURE(
        expect_gradients_match_finite_differences(c.shape, c.scale, c.causal, Variant{}, seed));
  }
}

// (A row that sees one key has P = 1 and dS = 0, so zero dq as well; finite
// differences check the rest.)
TEST(ReferenceBackward, RowsThatSeeNoKeyGetZeroDq) {
  const Shape s{2, 7, 3, 2, 1, 4};
  const Inputs in = random_inputs(s, 71);
  const std::vector<float> dout = random_values(s.q_size(), 74);
  const Gradients g = attention_backward(s, in.q, in.k, in.v, dout, 0.5, true);
  const PlainGradients plain =
      attention_backward_plain(HalfType::kBFloat16, s, in.q, in.k, in.v, dout, 0.5f, true);
  const int row_size = s.heads_q * s.headdim;
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.seqlen_q; ++i) {
      if (visible_keys(s, true, i) != 0) {
        continue;
      }
      const size_t row = (static_cast<size_t>(b) * s.seqlen_q + i) * row_size;
      for (int x = 0; x < row_size; ++x) {
        EXPECT_EQ(g.dq[row + x], 0.0);
        EXPECT_EQ(plain.dq[row + x], 0.0f);
      }
    }
  }
}

// ---------------------------------------------------------------- variants (issue 25)

TEST(ReferenceVariants, WindowRangesAreBottomRightAligned) {
  // 3 queries, 7 keys: row i's diagonal key is i + 4.
  const Shape s{1, 3, 7, 1, 1, 1};
  Variant w;
  w.window_left = 2;
  w.window_right = 1;
  const auto range = [&](bool causal, int row) {
    const KeyRange r = visible_key_range(s, causal, w, row);
    return std::pair<int, int>{r.first, r.end};
  };
  EXPECT_EQ(range(false, 0), std::make_pair(2, 6));
  EXPECT_EQ(range(false, 2), std::make_pair(4, 7));
  EXPECT_EQ(range(true, 0), std::make_pair(2, 5));  // causal: the right limit is the diagonal
  w.window_right = -1;
  EXPECT_EQ(range(false, 1), std::make_pair(3, 7));
  w.window_left = 0;
  w.window_right = 0;
  EXPECT_EQ(range(false, 1), std::make_pair(5, 6));  // the diagonal key alone
  // More queries than keys: early rows see nothing.
  const Shape tall{1, 7, 3, 1, 1, 1};
  EXPECT_EQ(visible_key_range(tall, true, Variant{}, 2).end, 0);
  EXPECT_EQ(visible_key_range(tall, true, Variant{}, 5).end, 2);
}

TEST(ReferenceVariants, WindowsThatHideNothingOrAllAboveTheDiagonalAreTheOldMasks) {
  const Shape s{2, 9, 13, 4, 2, 8};
  const Inputs in = random_inputs(s, 101);
  Variant everything;
  everything.window_left = s.seqlen_k;
  everything.window_right = s.seqlen_k;
  Variant causal_window;
  causal_window.window_right = 0;
  const Reference full = run(s, in, 0.4, false), causal = run(s, in, 0.4, true);
  expect_near_all(attention_forward(s, in.q, in.k, in.v, 0.4, false, everything).out, full.out);
  expect_near_all(attention_forward(s, in.q, in.k, in.v, 0.4, false, causal_window).out,
                  causal.out);
  expect_near_all(attention_forward(s, in.q, in.k, in.v, 0.4, false, causal_window).lse,
                  causal.lse);
}

TEST(ReferenceVariants, AHugeSoftcapChangesNothing) {
  const Shape s{1, 5, 6, 2, 1, 8};
  const Inputs in = random_inputs(s, 111);
  Variant cap;
  cap.softcap = 1e7;
  const Reference plain = run(s, in, 0.5, true);
  const Reference capped = attention_forward(s, in.q, in.k, in.v, 0.5, true, cap);
  for (size_t i = 0; i < plain.out.size(); ++i) {
    ASSERT_NEAR(capped.out[i], plain.out[i], 1e-9);
  }
  cap.softcap = 0.5;  // a small one bounds every score: |s| <= 0.5
  const Reference tight = attention_forward(s, in.q, in.k, in.v, 1.0, false, cap);
  for (const double lse : tight.lse) {
    EXPECT_LE(lse, 0.5 + std::log(6.0) + 1e-12);
    EXPECT_GE(lse, -0.5 + std::log(6.0) - 1e-12);
  }
}

// A sink adds exp(sink) to each row's denominator: lse' = log(exp(lse) +
// exp(sink)) and out' = out * exp(lse - lse'); a row that sees no key keeps
// a zero out row and gets lse' = sink.
TEST(ReferenceVariants, SinksTakeProbabilityButAddNoValue) {
  const Shape s{2, 6, 4, 3, 1, 8};
  const Inputs in = random_inputs(s, 121);
  Variant sinks;
  sinks.sinks = {0.5f, -2.0f, 3.0f};
  const Reference plain = run(s, in, 0.5, true);
  const Reference with = attention_forward(s, in.q, in.k, in.v, 0.5, true, sinks);
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        const size_t row = (static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i;
        const double sink = sinks.sinks[h];
        const double want = plain.lse[row] == kInf
                                ? sink
                                : std::log(std::exp(plain.lse[row]) + std::exp(sink));
        ASSERT_NEAR(with.lse[row], want, kExact);
        const double factor = plain.lse[row] == kInf ? 0 : std::exp(plain.lse[row] - want);
        for (int x = 0; x < s.headdim; ++x) {
          const size_t at = ((static_cast<size_t>(b) * s.seqlen_q + i) * s.heads_q + h) * s.headdim + x;
          ASSERT_NEAR(with.out[at], plain.out[at] * factor, kExact);
        }
      }
    }
  }
}

// The variants' gradients (dq, dk, dv, and dsinks) against central
// differences, as MatchesFiniteDifferences does for the plain masks.
TEST(ReferenceVariants, GradientsMatchFiniteDifferences) {
  struct Case {
    const char* name;
    Shape shape;
    bool causal;
    Variant variant;
  };
  Variant window;
  window.window_left = 2;
  window.window_right = 1;
  Variant cap;
  cap.softcap = 1.5;
  Variant sinks;
  sinks.sinks = {0.25f, -1.0f, 1.5f, 0.0f};
  Variant all = window;
  all.softcap = 2.0;
  all.sinks = {0.5f, -0.5f};
  const Case cases[] = {
      {"window", {1, 5, 6, 2, 1, 4}, false, window},
      {"window, causal", {1, 6, 5, 2, 2, 4}, true, window},
      {"softcap", {1, 4, 5, 2, 1, 4}, true, cap},
      {"sinks, rows without keys", {2, 5, 3, 4, 2, 4}, true, sinks},
      {"window + softcap + sinks", {1, 5, 7, 2, 1, 4}, false, all},
  };
  unsigned seed = 131;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_NO_FATAL_FAILURE(
        expect_gradients_match_finite_differences(c.shape, 0.5, c.causal, c.variant, seed));
  }
}

// The plain emulation of a variant: its dtype's error against the float64
// reference, as without one.
TEST(ReferenceVariants, PlainEmulationFollowsTheVariant) {
  const Shape s{1, 40, 64, 2, 1, 32};
  const Inputs in = random_inputs(s, 141);
  Variant all;
  all.window_left = 9;
  all.softcap = 3.0;
  all.sinks = {1.0f, -1.0f};
  const Reference want = attention_forward(s, in.q, in.k, in.v, 0.3, true, all);
  const std::vector<float> plain =
      attention_forward_plain(HalfType::kBFloat16, s, in.q, in.k, in.v, 0.3f, true, all);
  const ErrorStats e = error_stats(plain, want.out);
  EXPECT_LT(e.max_abs, 3e-2);
  EXPECT_GT(e.max_abs, 0.0);
}

// The plain emulation's gradients: values of its dtype, near the float64
// ones (relative to the largest gradient: bf16 within 1.5e-2, fp16 within
// 2e-3, measured 4e-3 to 9e-3 and 7e-4 to 1e-3) and not equal to them.
TEST(PlainBackward, ErrorIsThatOfItsDtype) {
  const Shape s{2, 48, 80, 4, 2, 64};
  const Inputs in = random_inputs(s, 81);
  const std::vector<float> dout = random_values(s.q_size(), 84);
  const float scale = 0.125f;
  const Gradients g = attention_backward(s, in.q, in.k, in.v, dout, scale, true);
  const HalfType types[2] = {HalfType::kFloat16, HalfType::kBFloat16};
  const double max_error[2] = {2e-3, 1.5e-2};
  double error[2][3] = {};
  for (int t = 0; t < 2; ++t) {
    const PlainGradients plain =
        attention_backward_plain(types[t], s, in.q, in.k, in.v, dout, scale, true);
    const std::vector<float>* got[3] = {&plain.dq, &plain.dk, &plain.dv};
    const std::vector<double>* want[3] = {&g.dq, &g.dk, &g.dv};
    for (int n = 0; n < 3; ++n) {
      SCOPED_TRACE(::testing::Message() << "type " << t << ", tensor " << n);
      double largest = 0;
      for (const double x : *want[n]) {
        largest = std::max(largest, std::fabs(x));
      }
      for (const float x : *got[n]) {
        ASSERT_EQ(round_to(types[t], x), x);
      }
      error[t][n] = error_stats(*got[n], *want[n]).max_abs / largest;
      EXPECT_GT(error[t][n], 0.0);
      EXPECT_LT(error[t][n], max_error[t]);
    }
  }
  for (int n = 0; n < 3; ++n) {
    EXPECT_LT(error[0][n], error[1][n]) << "tensor " << n;
  }
}

TEST(BackwardTolerance, PlainPassesAndAFarElementFailsNamingTheTensor) {
  const Shape s{1, 9, 12, 2, 1, 8};
  const Inputs in = random_inputs(s, 91);
  const std::vector<float> dout = random_values(s.q_size(), 94);
  const Gradients g = attention_backward(s, in.q, in.k, in.v, dout, 0.25, true);
  const PlainGradients plain =
      attention_backward_plain(HalfType::kBFloat16, s, in.q, in.k, in.v, dout, 0.25f, true);
  const struct {
    const char* name;
    const std::vector<float>& plain;
    const std::vector<double>& ref;
  } tensors[] = {{"dq", plain.dq, g.dq}, {"dk", plain.dk, g.dk}, {"dv", plain.dv, g.dv}};
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    const Verdict pass = check_gradient(t.name, t.plain, t.plain, t.ref);
    EXPECT_TRUE(pass.ok) << pass.message;
    const double bound = kErrorFactor * error_stats(t.plain, t.ref).max_abs + kGradAtol;
    std::vector<float> kernel = t.plain;
    const size_t far = kernel.size() / 2;
    kernel[far] = static_cast<float>(t.ref[far] + 10 * bound);
    const Verdict fail = check_gradient(t.name, kernel, t.plain, t.ref);
    EXPECT_FALSE(fail.ok) << fail.message;
    EXPECT_EQ(fail.message.rfind(std::string(t.name) + ": ", 0), 0u) << fail.message;
    EXPECT_NE(fail.message.find("at element " + std::to_string(far)), std::string::npos)
        << fail.message;
    kernel[far] = NAN;
    EXPECT_FALSE(check_gradient(t.name, kernel, t.plain, t.ref).ok);
  }
}

TEST(BackwardTolerance, ExactPlainLeavesOnlyTheGradAtol) {
  const std::vector<double> ref = {0.5};
  EXPECT_TRUE(check_gradient("dv", {0.5f + 5e-5f}, {0.5f}, ref).ok);
  EXPECT_FALSE(check_gradient("dv", {0.5f + 2e-4f}, {0.5f}, ref).ok);
}

TEST(ErrorStats, CountsNonFiniteAndFindsTheWorst) {
  const ErrorStats e = error_stats({1.0f, 2.0f, NAN, 4.0f}, {1.0, 2.5, 0.0, 3.0});
  EXPECT_EQ(e.non_finite, 1u);
  EXPECT_EQ(e.max_abs, kInf);
  EXPECT_EQ(e.worst, 2u);
  EXPECT_DOUBLE_EQ(e.mean_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.rms, std::sqrt(1.25 / 3));
}

TEST(Tolerance, OutputWithinTwicePlainErrorPasses) {
  const std::vector<double> ref = {1.0, -1.0};
  const std::vector<float> plain = {1.01f, -1.0f};
  EXPECT_TRUE(check_output({1.02f, -1.0f}, plain, ref).ok);
  EXPECT_TRUE(check_output({1.0f, -0.98f}, plain, ref).ok);
  EXPECT_FALSE(check_output({1.0f, -0.97f}, plain, ref).ok);
  EXPECT_FALSE(check_output({1.0f, NAN}, plain, ref).ok);
}

TEST(Tolerance, ExactPlainLeavesOnlyTheAtol) {
  const std::vector<double> ref = {0.5};
  EXPECT_TRUE(check_output({0.5f}, {0.5f}, ref).ok);
  EXPECT_FALSE(check_output({0.5f + 1e-4f}, {0.5f}, ref).ok);
}

TEST(Tolerance, LseRowsMustMatchAndMaskedRowsBeInfinite) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<double> ref = {2.0, kInf, -1.0};
  EXPECT_TRUE(check_lse({2.00005f, inf, -1.0f}, ref).ok);
  EXPECT_FALSE(check_lse({2.001f, inf, -1.0f}, ref).ok);
  EXPECT_FALSE(check_lse({2.0f, 1e30f, -1.0f}, ref).ok);
  EXPECT_FALSE(check_lse({2.0f, -inf, -1.0f}, ref).ok);
  EXPECT_FALSE(check_lse({2.0f, inf, NAN}, ref).ok);
  EXPECT_FALSE(check_lse({inf, inf, -1.0f}, ref).ok);
}

}  // namespace
}  // namespace flash3::ref
