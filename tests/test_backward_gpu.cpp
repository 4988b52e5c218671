// The backward kernels against the float64 reference gradients (the
// tolerance rule of ../shared/ARCHITECTURE.md), on fresh random inputs with
// dq, dk and dv poisoned first; determinism; a small subset for
// compute-sanitizer (SanitizeBackward*).
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backward_case.hpp"
#include "hopper_test.hpp"

namespace flash3::test {
namespace {

// (batch, seqlen_q, seqlen_k, heads_q, heads_k)
using Dims = std::tuple<int, int, int, int, int>;

BackwardCase make_case(DType dtype, int headdim, const Dims& d, bool causal,
                       Layout layout = Layout::kContiguous) {
  BackwardCase c;
  c.forward.dtype = dtype;
  c.forward.shape = {std::get<0>(d), std::get<1>(d), std::get<2>(d),
                     std::get<3>(d), std::get<4>(d), headdim};
  c.forward.causal = causal;
  c.forward.layout = layout;
  return c;
}

class BackwardSweep : public HopperTest,
                      public ::testing::WithParamInterface<std::tuple<DType, int>> {
 protected:
  void expect_all(const std::vector<Dims>& dims, Layout layout = Layout::kContiguous) {
    const auto [dtype, headdim] = GetParam();
    for (const Dims& d : dims) {
      for (bool causal : {false, true}) {
        SCOPED_TRACE(make_case(dtype, headdim, d, causal, layout).name());
        expect_gradients_match_reference(make_case(dtype, headdim, d, causal, layout));
        if (HasFatalFailure() || IsSkipped()) {
          return;
        }
      }
    }
  }
};

// Odd and unequal lengths, one key, queries past the keys (causal rows that
// see no key), several key blocks and query blocks.
const std::vector<Dims> kSeqlenDims = {
    {1, 1, 1, 1, 1},     {2, 17, 17, 2, 2},    {1, 113, 113, 2, 2},   {1, 64, 1000, 1, 1},
    {1, 1000, 64, 1, 1}, {2, 300, 129, 2, 2},  {1, 1000, 1000, 1, 1}, {1, 3001, 3001, 1, 1},
    {1, 127, 257, 3, 3}, {3, 256, 256, 1, 1}};
// GQA / MQA: dK and dV summed over each group.
const std::vector<Dims> kGqaDims = {{1, 200, 200, 4, 2}, {2, 129, 300, 8, 1}, {1, 513, 513, 8, 1}};

TEST_P(BackwardSweep, Seqlens) { expect_all(kSeqlenDims); }

// Rows that see a few keys, where D from the 16-bit out would miss the bound
// (workspace.hpp: kExactDKeys): one query over 2 or 3 keys, many of them;
// windows of 1-3 keys a row, with softcap and MQA; and 33 keys, one past
// the exact rows' limit.
TEST_P(BackwardSweep, FewKeys) {
  expect_all({{8, 1, 3, 4, 4}, {4, 5, 2, 8, 2}, {2, 33, 33, 2, 2}});
  if (HasFatalFailure() || IsSkipped()) {
    return;
  }
  const auto [dtype, headdim] = GetParam();
  const std::pair<int, int> windows[] = {{1, 1}, {2, 0}, {0, 2}};
  for (const auto& [left, right] : windows) {
    for (float softcap : {0.0f, 15.0f}) {
      BackwardCase c = make_case(dtype, headdim, {2, 150, 150, 4, 1}, false);
      c.forward.window_left = left;
      c.forward.window_right = right;
      c.forward.softcap = softcap;
      SCOPED_TRACE(c.name());
      expect_gradients_match_reference(c);
      if (HasFatalFailure() || IsSkipped()) {
        return;
      }
    }
  }
}
TEST_P(BackwardSweep, GqaRatios) { expect_all(kGqaDims); }
TEST_P(BackwardSweep, StridedLayouts) {
  for (Layout layout : {Layout::kHeadMajor, Layout::kPadded, Layout::kPackedQkv}) {
    expect_all({{2, 177, 177, 4, 2}}, layout);
  }
}

// Sliding windows (BackwardOptions::window_left/right, the forward's): each
// kind of window, causal or not, queries and keys of unequal counts (rows
// that see no key), GQA; then deterministic, whose dQ order takes each query
// block's key blocks in the window (Mainloop::dq_turn).
TEST_P(BackwardSweep, SlidingWindows) {
  const auto [dtype, headdim] = GetParam();
  struct WindowCase {
    Dims dims;
    std::pair<int, int> window;
    bool causal;
    bool deterministic;
    int chunk = 0;  // attention_chunk
    float softcap = 0.0f;
  };
  const WindowCase cases[] = {
      {{2, 300, 300, 2, 2}, {100, 50}, false, false}, {{2, 300, 300, 2, 2}, {100, 50}, true, false},
      {{2, 300, 300, 2, 2}, {0, 0}, false, false},    {{2, 300, 300, 2, 2}, {0, 0}, true, false},
      {{1, 700, 1000, 4, 2}, {-1, 30}, false, false}, {{1, 700, 1000, 4, 2}, {257, 0}, true, false},
      {{1, 1000, 500, 2, 1}, {300, -1}, false, false}, {{1, 1000, 500, 2, 1}, {300, -1}, true, false},
      {{1, 700, 1000, 4, 2}, {200, 50}, false, true}, {{1, 1000, 500, 2, 1}, {130, 0}, true, true},
      {{2, 300, 300, 2, 2}, {-1, -1}, false, false, 100},
      {{1, 700, 1000, 4, 2}, {-1, -1}, true, true, 256},
      {{1, 1000, 500, 2, 1}, {300, -1}, false, false, 77},
      // softcap: alone (non-causal: the masked kernels), causal, in a window
      {{2, 300, 300, 2, 2}, {-1, -1}, false, false, 0, 1.5f},
      {{1, 700, 1000, 4, 2}, {-1, -1}, true, true, 0, 5.0f},
      {{1, 1000, 500, 2, 1}, {130, 0}, true, false, 0, 30.0f}};
  for (const WindowCase& w : cases) {
    BackwardCase c = make_case(dtype, headdim, w.dims, w.causal);
    c.forward.window_left = w.window.first;
    c.forward.window_right = w.window.second;
    c.forward.attention_chunk = w.chunk;
    c.forward.softcap = w.softcap;
    c.deterministic = w.deterministic;
    SCOPED_TRACE(c.name());
    expect_gradients_match_reference(c);
    if (HasFatalFailure() || IsSkipped()) {
      return;
    }
  }
}

// v, out, dout and dv of a head dim of their own (FlashAttention-3's dv !=
// d): 128 beside q and k of 192 (DeepSeek's (192, 128)), 256 beside 64.
// Unequal lengths, GQA and MQA, causal or not, both dtypes; then
// deterministic. GQA's dV rows (batch x heads_k x keys) a multiple of 4 and
// not: 1 x 6 / 1 x 3, 3 x 6 / 2 x 203.
class BackwardValueHeadDim : public HopperTest,
                             public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(BackwardValueHeadDim, MatchesTheReference) {
  const auto [headdim, headdim_v] = GetParam();
  const std::vector<Dims> dims = {{2, 300, 411, 4, 2}, {1, 1000, 1000, 2, 2}, {3, 129, 64, 8, 1},
                                  {1, 1, 3, 2, 2},     {1, 1, 3, 6, 1},       {3, 113, 203, 6, 2}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const Dims& d : dims) {
      for (bool causal : {false, true}) {
        BackwardCase c = make_case(dtype, headdim, d, causal);
        c.forward.shape.headdim_v = headdim_v;
        SCOPED_TRACE(c.name());
        expect_gradients_match_reference(c);
        if (HasFatalFailure() || IsSkipped()) {
          return;
        }
      }
    }
  }
  BackwardCase c = make_case(DType::kBFloat16, headdim, {2, 777, 777, 8, 2}, true);
  c.forward.shape.headdim_v = headdim_v;
  c.deterministic = true;
  expect_gradients_match_reference(c);
}

INSTANTIATE_TEST_SUITE_P(Pairs, BackwardValueHeadDim,
                         ::testing::Values(std::pair{192, 128}, std::pair{64, 256}),
                         [](const auto& info) {
                           return "D" + std::to_string(info.param.first) + "V" +
                                  std::to_string(info.param.second);
                         });

INSTANTIATE_TEST_SUITE_P(Kernels, BackwardSweep,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::Values(64, 96, 128, 192, 256)),
                         [](const auto& info) {
                           return kernel_label(std::get<0>(info.param), std::get<1>(info.param));
                         });

// deterministic: ten runs give the same bits (dQ summed across key blocks,
// and with GQA dK/dV across query heads, in a fixed order).
class BackwardDeterminism : public HopperTest,
                            public ::testing::WithParamInterface<std::tuple<int, bool>> {};

TEST_P(BackwardDeterminism, TenRunsBitwise) {
  const auto [headdim, causal] = GetParam();
  BackwardCase c = make_case(DType::kBFloat16, headdim, {2, 777, 777, 8, 2}, causal);
  c.deterministic = true;
  BackwardProblem problem(c, random_inputs(c.forward), random_dout(c));
  Status s = problem.forward().forward(nullptr);
  if (not_built(s)) {
    GTEST_SKIP() << s.message;
  }
  ASSERT_TRUE(s.ok()) << s.message;
  std::vector<Gradients> runs;
  for (int i = 0; i < 10; ++i) {
    s = problem.run(nullptr);
    if (not_built(s)) {
      GTEST_SKIP() << s.message;
    }
    ASSERT_TRUE(s.ok()) << s.message;
    check_cuda(cudaDeviceSynchronize(), "backward");
    runs.push_back(problem.download());
  }
  for (int i = 1; i < 10; ++i) {
    for (auto member : {&Gradients::dq, &Gradients::dk, &Gradients::dv}) {
      const std::vector<float>& a = runs[0].*member;
      const std::vector<float>& b = runs[i].*member;
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "run " << i << " differs from run 0";
    }
  }
  expect_gradients_match_reference(c);
}

INSTANTIATE_TEST_SUITE_P(Kernels, BackwardDeterminism,
                         ::testing::Combine(::testing::Values(64, 96, 128, 192, 256), ::testing::Bool()));

class SanitizeBackward : public HopperTest {};

TEST_F(SanitizeBackward, Bf16D192V128GqaCausal) {
  BackwardCase c = make_case(DType::kBFloat16, 192, {2, 200, 333, 4, 2}, true);
  c.forward.shape.headdim_v = 128;
  expect_gradients_match_reference(c);
}

// (64, 256): warpgroup 0 holds all of dK, warpgroup 1 all of dQ; GQA.
TEST_F(SanitizeBackward, Fp16D64V256Gqa) {
  BackwardCase c = make_case(DType::kFloat16, 64, {2, 200, 333, 4, 2}, false);
  c.forward.shape.headdim_v = 256;
  expect_gradients_match_reference(c);
}

TEST_F(SanitizeBackward, Bf16D128Seqlen113Causal) {
  expect_gradients_match_reference(make_case(DType::kBFloat16, 128, {1, 113, 113, 2, 2}, true));
}
TEST_F(SanitizeBackward, Fp16D64Seqlen300x129Gqa) {
  expect_gradients_match_reference(make_case(DType::kFloat16, 64, {2, 300, 129, 4, 2}, false));
}
TEST_F(SanitizeBackward, Fp16D256Seqlen200Causal) {
  expect_gradients_match_reference(make_case(DType::kFloat16, 256, {1, 200, 333, 2, 2}, true));
}
TEST_F(SanitizeBackward, Bf16D128Deterministic) {
  BackwardCase c = make_case(DType::kBFloat16, 128, {1, 200, 333, 4, 2}, true);
  c.deterministic = true;
  expect_gradients_match_reference(c);
}
// A window and a chunk: key blocks that meet no query block, deterministic.
TEST_F(SanitizeBackward, Fp16D64WindowChunkDeterministic) {
  BackwardCase c = make_case(DType::kFloat16, 64, {1, 300, 500, 2, 1}, false);
  c.forward.window_left = 40;
  c.forward.window_right = 10;
  c.forward.attention_chunk = 100;
  c.deterministic = true;
  expect_gradients_match_reference(c);
}
// Head dim 96: padded tiles, the dK/dV GEMMs in 64 + 32 columns, dQ as two
// partial sums over each warpgroup's keys (Traits::kDqKeySplit); GQA.
TEST_F(SanitizeBackward, Bf16D96Seqlen300x129Gqa) {
  expect_gradients_match_reference(make_case(DType::kBFloat16, 96, {2, 300, 129, 4, 2}, false));
}
TEST_F(SanitizeBackward, Fp16D96CausalDeterministic) {
  BackwardCase c = make_case(DType::kFloat16, 96, {1, 200, 333, 2, 2}, true);
  c.deterministic = true;
  expect_gradients_match_reference(c);
}
// Head dim 192: 256's split over the head dim, in parts of 128 + 64 columns
// (dK/dV) and 64 + 128 (dQ); GQA, causal, deterministic.
TEST_F(SanitizeBackward, Bf16D192Seqlen300x129Gqa) {
  expect_gradients_match_reference(make_case(DType::kBFloat16, 192, {2, 300, 129, 4, 2}, false));
}
TEST_F(SanitizeBackward, Fp16D192CausalDeterministic) {
  BackwardCase c = make_case(DType::kFloat16, 192, {1, 200, 333, 2, 2}, true);
  c.deterministic = true;
  expect_gradients_match_reference(c);
}
// Softcap, causal, and head dim 256's split hand-over of P (1 - t^2).
TEST_F(SanitizeBackward, Bf16D256SoftcapCausal) {
  BackwardCase c = make_case(DType::kBFloat16, 256, {1, 200, 333, 2, 1}, true);
  c.forward.softcap = 2.0f;
  expect_gradients_match_reference(c);
}
// Head dim 256 deterministic: its own kernels (dQ staged for the writer warp,
// one Q / dO stage, not added from registers); GQA, causal.
TEST_F(SanitizeBackward, Bf16D256GqaCausalDeterministic) {
  BackwardCase c = make_case(DType::kBFloat16, 256, {2, 200, 333, 4, 2}, true);
  c.deterministic = true;
  expect_gradients_match_reference(c);
}

}  // namespace
}  // namespace flash3::test
