// The forward kernels against the float64 reference, on a Hopper GPU. Every
// test skips, saying why, where there is none, and per (dtype, headdim) where
// that kernel is not in the build (FLASH3_KERNELS).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "hopper_test.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr int kHeadDims[] = {64, 96, 128, 192, 256};

// Head dims of q and k, and of v and out (head_dims.hpp: ForwardValueDims).
struct HeadDimPair {
  int d, dv;
};
constexpr HeadDimPair kHeadDimPairs[] = {{64, 64},   {64, 256},  {96, 96},   {128, 128},
                                         {192, 192}, {192, 128}, {256, 256}};

class ForwardTest : public HopperTest {
 protected:
  // Each case in turn (on inputs(case)), until one finds its kernel missing
  // from the build.
  void expect_all_match_reference(
      const std::vector<ForwardCase>& cases,
      const std::function<Inputs(const ForwardCase&)>& inputs = random_inputs) {
    for (const ForwardCase& c : cases) {
      SCOPED_TRACE(c.name());
      expect_matches_reference(c, inputs(c));
      if (IsSkipped()) {
        return;
      }
    }
  }
};

// (batch, seqlen_q, seqlen_k, heads_q, heads_k)
struct Dims {
  int batch, seqlen_q, seqlen_k, heads_q, heads_k;
};

// Single rows, ragged tails and exact tiles; long ones with few heads keep
// the reference quick.
constexpr Dims kSeqlenDims[] = {
    // seqlen_q == seqlen_k
    {2, 1, 1, 2, 2},
    {2, 17, 17, 2, 2},
    {2, 113, 113, 2, 1},
    {2, 1013, 1013, 2, 2},
    {1, 1024, 1024, 4, 2},
    {1, 4097, 4097, 2, 1},
    // more keys than queries
    {2, 1, 1024, 2, 2},
    {2, 17, 113, 2, 2},
    {2, 113, 1013, 2, 2},
    {1, 1013, 4097, 2, 2},
    // more queries than keys: with causal, the first rows see no key
    {2, 1013, 113, 2, 2},
    {2, 1024, 17, 2, 2},
    {1, 4097, 1013, 1, 1}};

// GQA ratios 1, 2 and 8, and MQA.
constexpr Dims kGqaDims[] = {{2, 257, 257, 2, 2},
                             {2, 257, 257, 4, 2},
                             {2, 257, 257, 16, 2},
                             {1, 200, 333, 8, 1},
                             {2, 333, 200, 6, 3}};

// Non-causal kernels share K and V between the two CTAs of a cluster when a
// head's query blocks pair up (128 rows a block; 192 at head dim 64), else
// run single CTAs: pairs with GQA and keys ending inside the first, second
// and a later half of a key block, MQA, and an odd block count.
constexpr Dims kClusterDims[] = {{1, 1024, 113, 4, 2},
                                 {2, 768, 40, 2, 1},
                                 {1, 256, 1000, 2, 2},
                                 {2, 384, 300, 2, 2}};

// Launches whose steps have 16 key blocks or more cut the last wave's tiles
// into pieces of key blocks (src/sm90/fwd/tail_split.hpp; at head dim 128):
// fewer tiles than the H200's 132 SMs, so every tile is cut, in pieces of a
// few blocks, each tile finished by the CTA holding its last block. First
// non-causal (176-key blocks past seqlen_q 2048: 32, then 18 of them, in
// clusters), then causal (pairs of 33 blocks).
constexpr Dims kTailSplitDims[] = {
    {1, 2304, 5632, 1, 1}, {1, 2304, 3000, 1, 1}, {1, 4096, 4096, 1, 1}};

// Decoding (src/sm90/fwd/decode.hpp): one query with GQA packs the group's
// heads into the rows of one tile (ratios 4, 8 and 3, MQA), and launches of
// one query block with long keys cut their few tiles into pieces over the
// SMs (16 key blocks or more: from 2048 keys at head dim 64, 2816 at 128,
// 1280 at 256); short keys, one key, and several queries (not packed).
constexpr Dims kDecodeDims[] = {{1, 1, 3000, 32, 8}, {3, 1, 8191, 8, 1},  {2, 1, 5000, 6, 2},
                                {5, 1, 2900, 2, 2},  {2, 4, 4097, 8, 8},  {1, 1, 40, 16, 2},
                                {2, 1, 1, 4, 2},     {1, 7, 3333, 4, 1}};

constexpr struct {
  Layout layout;
  Dims dims;
} kLayoutCases[] = {{Layout::kPackedQkv, {2, 300, 300, 4, 2}},
                    {Layout::kPackedQkv, {1, 1013, 1013, 2, 2}},
                    {Layout::kHeadMajor, {2, 300, 211, 4, 2}},
                    {Layout::kPadded, {3, 211, 300, 4, 1}},
                    // decoding's packed GQA view of strided q and out
                    {Layout::kPadded, {2, 1, 3000, 8, 2}},
                    {Layout::kHeadMajor, {2, 1, 3000, 8, 2}}};

constexpr float kCustomScales[] = {0.5f, 0.03f};

using SweepParam = std::tuple<DType, HeadDimPair, bool>;  // dtype, head dims, causal

class ForwardSweep : public ForwardTest, public ::testing::WithParamInterface<SweepParam> {
 protected:
  ForwardCase make(const Dims& d, Layout layout = Layout::kContiguous, float scale = 0.0f) const {
    const auto& [dtype, dims, causal] = GetParam();
    ForwardCase c;
    c.dtype = dtype;
    c.shape = {d.batch, d.seqlen_q, d.seqlen_k, d.heads_q, d.heads_k, dims.d, dims.dv};
    c.causal = causal;
    c.softmax_scale = scale;
    c.layout = layout;
    return c;
  }

  template <class Range>
  std::vector<ForwardCase> make_all(const Range& dims) const {
    std::vector<ForwardCase> cases;
    for (const Dims& d : dims) {
      cases.push_back(make(d));
    }
    return cases;
  }
};

TEST_P(ForwardSweep, Seqlens) { expect_all_match_reference(make_all(kSeqlenDims)); }

TEST_P(ForwardSweep, GqaRatios) { expect_all_match_reference(make_all(kGqaDims)); }

TEST_P(ForwardSweep, ClusterPairs) { expect_all_match_reference(make_all(kClusterDims)); }

TEST_P(ForwardSweep, TailSplit) { expect_all_match_reference(make_all(kTailSplitDims)); }

TEST_P(ForwardSweep, Decode) { expect_all_match_reference(make_all(kDecodeDims)); }

// Sliding windows (ForwardOptions::window_left/right) in the masked kernels:
// either side bounded or not (with causal the right side is 0), the
// diagonal alone, windows wider than the keys; square, more keys than
// queries, more queries than keys (rows that see no key), GQA, decoding (not
// packed: the window needs each query's position), and the shapes whose
// causal launches split their last wave (windowed ones must not).
TEST_P(ForwardSweep, SlidingWindows) {
  constexpr Dims kWindowDims[] = {
      {2, 1013, 1013, 2, 2}, {1, 700, 2000, 4, 2}, {2, 2000, 700, 2, 1}, {3, 1, 5000, 8, 2}};
  constexpr std::pair<int, int> kWindows[] = {{100, 50}, {-1, 30}, {300, -1},
                                              {0, 0},    {5000, 5000}, {257, 0}};
  std::vector<ForwardCase> cases;
  const auto add = [&](const Dims& d, std::pair<int, int> window) {
    ForwardCase c = make(d);
    c.window_left = window.first;
    c.window_right = window.second;
    cases.push_back(c);
  };
  for (const auto& window : kWindows) {  // every window on the square problem
    add(kWindowDims[0], window);
  }
  for (const Dims& d : kWindowDims) {  // two on each
    add(d, kWindows[0]);
    add(d, kWindows[2]);
  }
  add(kWindowDims[1], kWindows[3]);  // the diagonal alone: rows that see no key
  add(kWindowDims[2], kWindows[1]);
  for (const int chunk : {100, 256}) {  // attention chunks, alone and within a window
    add(kWindowDims[1], {-1, -1});
    cases.back().attention_chunk = chunk;
    add(kWindowDims[2], {300, -1});
    cases.back().attention_chunk = chunk;
  }
  for (const float softcap : {5.0f, 30.0f}) {  // softcap, alone (non-causal: the masked kernels) and with a window
    add(kWindowDims[0], {-1, -1});
    cases.back().softcap = softcap;
    add(kWindowDims[1], {300, -1});
    cases.back().softcap = softcap;
  }
  add({1, 4096, 4096, 1, 1}, {257, 0});  // long ones: one window each (the reference's time)
  add({1, 2304, 5632, 1, 1}, {100, 50});
  expect_all_match_reference(cases);
}

// Scores that climb by ~23 (log2 units) from one key block to the one
// before it, which the kernels visit next: the running max jumps past the
// max slack (Traits::kMaxSlackLog2) in every block, so each block takes
// the rescale that the slack skips elsewhere. q[..., 0] = 4 and k[..., 0]
// = (seqlen_k - 1 - key) / 8 add (seqlen_k - 1 - key) / 8 to every score at
// softmax scale 0.25, on top of the random rest.
TEST_P(ForwardSweep, ScoresRiseAcrossKeyBlocks) {
  const auto rising = [](const ForwardCase& c) {
    Inputs in = random_inputs(c);
    const ref::Shape& s = c.shape;
    for (size_t row = 0; row < in.q.size() / s.headdim; ++row) {
      in.q[row * s.headdim] = 4.0f;
    }
    for (size_t row = 0; row < in.k.size() / s.headdim; ++row) {  // (batch, key, head) rows
      const int key = static_cast<int>(row / s.heads_k % s.seqlen_k);
      in.k[row * s.headdim] =
          ref::round_to(half_type(c.dtype), static_cast<float>(s.seqlen_k - 1 - key) / 8.0f);
    }
    return in;
  };
  expect_all_match_reference({make({1, 300, 700, 2, 2}, Layout::kContiguous, 0.25f),
                              make({2, 640, 640, 2, 1}, Layout::kContiguous, 0.25f)},
                             rising);
}

TEST_P(ForwardSweep, StridedLayouts) {
  std::vector<ForwardCase> cases;
  for (const auto& [layout, dims] : kLayoutCases) {
    const HeadDimPair head_dims = std::get<1>(GetParam());
    if (layout != Layout::kPackedQkv || head_dims.dv == head_dims.d) {  // packed: one head dim
      cases.push_back(make(dims, layout));
    }
  }
  expect_all_match_reference(cases);
}

TEST_P(ForwardSweep, SoftmaxScale) {
  std::vector<ForwardCase> cases;
  for (const float scale : kCustomScales) {
    cases.push_back(make({2, 113, 257, 4, 2}, Layout::kContiguous, scale));
  }
  expect_all_match_reference(cases);
}

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  const auto& [dtype, dims, causal] = info.param;
  return kernel_label(dtype, dims.d) + (dims.dv != dims.d ? "_v" + std::to_string(dims.dv) : "") +
         (causal ? "_causal" : "_noncausal");
}

INSTANTIATE_TEST_SUITE_P(Kernels, ForwardSweep,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::ValuesIn(kHeadDimPairs), ::testing::Bool()),
                         sweep_name);

// Small cases for compute-sanitizer: --gtest_filter='SanitizeForward*'.
class SanitizeForward : public HopperTest {};

TEST_F(SanitizeForward, Bf16D128Seqlen113Causal) {
  expect_matches_reference({DType::kBFloat16, {2, 113, 113, 2, 2, 128}, true});
}

// A window and a chunk in the masked kernels, on tiles whose rows see no key.
TEST_F(SanitizeForward, Bf16D128WindowChunk) {
  ForwardCase c{DType::kBFloat16, {2, 300, 200, 2, 1, 128}, false};
  c.window_left = 30;
  c.window_right = 0;
  c.attention_chunk = 64;
  expect_matches_reference(c);
}
TEST_F(SanitizeForward, Fp16D64Softcap) {
  ForwardCase c{DType::kFloat16, {2, 150, 333, 2, 2, 64}, false};
  c.softcap = 2.0f;
  expect_matches_reference(c);
}

TEST_F(SanitizeForward, Fp16D64Seqlen17) {
  expect_matches_reference({DType::kFloat16, {2, 17, 17, 2, 2, 64}, false});
}

TEST_F(SanitizeForward, Fp16D64Seqlen1013Causal) {
  expect_matches_reference({DType::kFloat16, {1, 1013, 1013, 2, 1, 64}, true});
}

TEST_F(SanitizeForward, Bf16D256Seqlen257Gqa) {
  expect_matches_reference({DType::kBFloat16, {1, 257, 257, 8, 2, 256}, false});
}

// d256 causal stages O in the V ring (OStore::kInVStages): several steps
// per CTA, of one key block, of many (the 80-key kernel past 1k), and GQA
// (the 64-key short variant).
TEST_F(SanitizeForward, Bf16D256CausalOneKeyBlockSteps) {
  expect_matches_reference({DType::kBFloat16, {40, 60, 60, 8, 8, 256}, true});
}

TEST_F(SanitizeForward, Bf16D256CausalSteps) {
  expect_matches_reference({DType::kBFloat16, {8, 1100, 1100, 2, 2, 256}, true});
}

// Head dim 192: 112-key blocks (three swizzle blocks a row), O in the V ring
// when causal, in Q otherwise.
TEST_F(SanitizeForward, Bf16D192CausalSteps) {
  expect_matches_reference({DType::kBFloat16, {8, 1100, 1100, 2, 2, 192}, true});
}

TEST_F(SanitizeForward, Fp16D192Seqlen300Gqa) {
  expect_matches_reference({DType::kFloat16, {2, 300, 333, 8, 2, 192}, false});
}

// Head dim 96: tiles of 128 columns, the last 32 TMA's zeros; the PV GEMM
// in 64 + 32 columns.
TEST_F(SanitizeForward, Bf16D96CausalSteps) {
  expect_matches_reference({DType::kBFloat16, {8, 1100, 1100, 2, 2, 96}, true});
}

TEST_F(SanitizeForward, Fp16D96Seqlen300Gqa) {
  expect_matches_reference({DType::kFloat16, {2, 300, 333, 8, 2, 96}, false});
}

// v and out of head dim 128 beside q and k of 192 (DeepSeek's (192, 128)):
// 128-key blocks, O in the V ring when causal, in Q otherwise.
TEST_F(SanitizeForward, Bf16D192V128CausalSteps) {
  expect_matches_reference({DType::kBFloat16, {8, 1100, 1100, 2, 2, 192, 128}, true});
}

TEST_F(SanitizeForward, Fp16D192V128Seqlen300Gqa) {
  expect_matches_reference({DType::kFloat16, {2, 300, 333, 8, 2, 192, 128}, false});
}

// v and out of head dim 256 beside q and k of 64 (FlashAttention-3's dv !=
// d): 80-key blocks, O in a tile of its own.
TEST_F(SanitizeForward, Bf16D64V256CausalSteps) {
  expect_matches_reference({DType::kBFloat16, {8, 1100, 1100, 2, 2, 64, 256}, true});
}

TEST_F(SanitizeForward, Fp16D64V256Seqlen300Gqa) {
  expect_matches_reference({DType::kFloat16, {2, 300, 333, 8, 2, 64, 256}, false});
}

TEST_F(SanitizeForward, Fp16D256CausalStepsGqa) {
  expect_matches_reference({DType::kFloat16, {8, 300, 300, 8, 2, 256}, true});
}

// Tiles cut in pieces of key blocks, folded by their finishing CTA
// (src/sm90/fwd/tail_split.hpp; kTailSplitDims above), non-causal in
// two-CTA clusters, and causal.
TEST_F(SanitizeForward, Bf16D128TailSplit) {
  expect_matches_reference({DType::kBFloat16, {1, 2304, 5632, 1, 1, 128}, false});
}

TEST_F(SanitizeForward, Bf16D128CausalTailSplit) {
  expect_matches_reference({DType::kBFloat16, {1, 4096, 4096, 1, 1, 128}, true});
}

// Decoding: the packed GQA view split over the SMs (decode.hpp), at the
// head dims whose split-KV variant exists for it alone.
TEST_F(SanitizeForward, Bf16D64DecodeGqa) {
  expect_matches_reference({DType::kBFloat16, {2, 1, 5000, 8, 2, 64}, false});
}

TEST_F(SanitizeForward, Fp16D256DecodeGqa) {
  expect_matches_reference({DType::kFloat16, {1, 1, 3000, 16, 2, 256}, true});
}

// A case every default build has (FLASH3_KERNELS=bf16_128 or all).
const ForwardCase kProbe{DType::kBFloat16, {2, 1013, 1013, 4, 2, 128}, true};

using KernelParam = std::tuple<DType, int>;  // dtype, headdim

class ForwardDeterminism : public HopperTest, public ::testing::WithParamInterface<KernelParam> {};

// Two runs of one case on the same inputs, into separate buffers; the second
// writes softmax_lse only when asked.
struct TwoRuns {
  Status status;  // of the first call that failed, else ok
  Output first, second;
};

TwoRuns run_twice(const ForwardCase& c, bool second_writes_lse) {
  const Inputs in = random_inputs(c);
  const DeviceProblem first(c, in), second(c, in);
  TwoRuns runs;
  runs.status = first.forward(nullptr);
  if (runs.status.ok()) {
    runs.status =
        flash3::forward(second.q(), second.k(), second.v(), second.out(),
                        second_writes_lse ? second.lse() : nullptr, second.options(), nullptr);
  }
  if (runs.status.ok()) {
    check_cuda(cudaDeviceSynchronize(), "the forward kernels");
    runs.first = first.download();
    runs.second = second.download();
  }
  return runs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Bitwise the same out and lse twice: a difference means a race.
TEST_P(ForwardDeterminism, RepeatsBitwise) {
  ForwardCase c = kProbe;
  c.dtype = std::get<0>(GetParam());
  c.shape.headdim = std::get<1>(GetParam());
  const TwoRuns runs = run_twice(c, true);
  if (not_built(runs.status)) {
    GTEST_SKIP() << runs.status.message;
  }
  ASSERT_TRUE(runs.status.ok()) << runs.status.message;
  EXPECT_EQ(runs.first.unwritten, 0u);
  EXPECT_TRUE(same_bits(runs.first.out, runs.second.out));
  EXPECT_TRUE(same_bits(runs.first.lse, runs.second.lse));
}

std::string kernel_name(const ::testing::TestParamInfo<KernelParam>& info) {
  return kernel_label(std::get<0>(info.param), std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Kernels, ForwardDeterminism,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::ValuesIn(kHeadDims)),
                         kernel_name);

class ForwardOptionalLse : public HopperTest {};

// Without softmax_lse the kernel writes the same out and leaves lse alone.
TEST_F(ForwardOptionalLse, NullLseLeavesOutTheSame) {
  const TwoRuns runs = run_twice(kProbe, false);
  if (not_built(runs.status)) {
    GTEST_SKIP() << runs.status.message;
  }
  ASSERT_TRUE(runs.status.ok()) << runs.status.message;
  EXPECT_EQ(runs.second.unwritten, kProbe.shape.lse_size()) << "only lse should stay unwritten";
  EXPECT_TRUE(same_bits(runs.first.out, runs.second.out));
}

class Stream {
 public:
  Stream() { check_cuda(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Holds a stream at a host callback until open() (or kTimeout, so that a call
// that wrongly waits for its stream fails instead of hanging).
class StreamGate {
 public:
  static constexpr std::chrono::seconds kTimeout{20};

  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    check_cuda(cudaLaunchHostFunc(stream, &StreamGate::wait, this), "cudaLaunchHostFunc");
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(stream_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  static void CUDART_CB wait(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(gate->mutex_);
    gate->opened_.wait_for(lock, kTimeout, [gate] { return gate->open_; });
  }

  cudaStream_t stream_;
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

class ForwardStream : public HopperTest {};

// The work waits for what is ahead of it on the given stream, and the call
// returns without waiting for it.
TEST_F(ForwardStream, RunsOnTheGivenStreamWithoutBlocking) {
  const Inputs in = random_inputs(kProbe);
  const DeviceProblem problem(kProbe, in);
  const Stream stream;
  {
    StreamGate gate(stream.get());
    const Status s = problem.forward(stream.get());
    if (not_built(s)) {
      GTEST_SKIP() << s.message;
    }
    ASSERT_TRUE(s.ok()) << s.message;
    // cudaMemcpy runs on the legacy stream: after anything flash3 put there.
    const Output held = problem.download();
    EXPECT_EQ(held.unwritten, kProbe.shape.q_size() + kProbe.shape.lse_size())
        << "out or lse was written before the stream reached the call";
  }
  check_cuda(cudaStreamSynchronize(stream.get()), "the forward kernel");
  EXPECT_EQ(problem.download().unwritten, 0u);
}

// Two streams at once, each running a case whose last wave is split in
// pieces (src/sm90/fwd/tail_split.hpp: d128 causal, 33 key blocks a step)
// and so using its stream's workspace: every run gives the bits of a run
// alone, which matches the reference (a shared workspace would race).
TEST_F(ForwardStream, TailSplitsOnTwoStreamsAtOnce) {
  const ForwardCase c{DType::kBFloat16, {1, 4096, 4096, 2, 1, 128}, true};
  expect_matches_reference(c);
  if (IsSkipped() || HasFailure()) {
    return;
  }
  const Inputs in = random_inputs(c);
  const DeviceProblem alone(c, in), a(c, in), b(c, in);
  ASSERT_TRUE(alone.forward(nullptr).ok());
  check_cuda(cudaDeviceSynchronize(), "the forward kernel alone");
  const Output expected = alone.download();
  const Stream sa, sb;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a.forward(sa.get()).ok());
    ASSERT_TRUE(b.forward(sb.get()).ok());
  }
  check_cuda(cudaDeviceSynchronize(), "the forward kernels on two streams");
  for (const DeviceProblem* p : {&a, &b}) {
    const Output got = p->download();
    EXPECT_EQ(got.unwritten, 0u);
    EXPECT_TRUE(same_bits(got.out, expected.out));
    EXPECT_TRUE(same_bits(got.lse, expected.lse));
  }
}

// A caller's workspace (ForwardOptions::workspace), zeroed once and shared
// by split forwards of every head dim in turn on one stream: each run gives
// the bits of the same case on flash3's own per-stream buffer. Too small a
// one is refused before anything runs.
TEST_F(ForwardStream, CallerWorkspaceServesEveryHeadDim) {
  std::vector<ForwardCase> cases;
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const bool causal : {false, true}) {
      cases.push_back({DType::kBFloat16, {1, 4096, 4096, 2, 1, headdim}, causal});
    }
  }
  size_t bytes = 0;
  for (const ForwardCase& c : cases) {
    expect_matches_reference(c);
    size_t need = 0;
    // Only the head dim counts; the size query reads no memory.
    const Tensor probe = Tensor::contiguous(reinterpret_cast<void*>(uintptr_t{1} << 40), c.dtype,
                                            1, 1, 1, c.shape.headdim);
    ASSERT_TRUE(flash3::forward_workspace_size(probe, &need).ok());
    bytes = std::max(bytes, need);
  }
  if (IsSkipped() || HasFailure()) {
    return;
  }
  const DeviceBuffer workspace(bytes);
  check_cuda(cudaMemset(workspace.get(), 0, bytes), "zeroing the workspace");
  const Stream stream;
  for (int round = 0; round < 2; ++round) {
    for (const ForwardCase& c : cases) {
      const Inputs in = random_inputs(c);
      const DeviceProblem alone(c, in), given(c, in);
      ASSERT_TRUE(alone.forward(stream.get()).ok());
      ForwardOptions options = given.options();
      options.workspace = workspace.get();
      options.workspace_bytes = bytes;
      const Status s = flash3::forward(given.q(), given.k(), given.v(), given.out(), given.lse(),
                                       options, stream.get());
      ASSERT_TRUE(s.ok()) << s.message;
      check_cuda(cudaStreamSynchronize(stream.get()), "the forwards");
      const Output expected = alone.download(), got = given.download();
      EXPECT_EQ(got.unwritten, 0u) << c.name();
      EXPECT_TRUE(same_bits(got.out, expected.out)) << c.name();
      EXPECT_TRUE(same_bits(got.lse, expected.lse)) << c.name();
    }
  }
  const ForwardCase& c = cases.front();
  const DeviceProblem small(c, random_inputs(c));
  ForwardOptions options = small.options();
  options.workspace = workspace.get();
  options.workspace_bytes = 4096;
  const Status s = flash3::forward(small.q(), small.k(), small.v(), small.out(), small.lse(),
                                   options, stream.get());
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "options.workspace_bytes = 4096 is less than",
                      s.message);
  EXPECT_EQ(small.download().unwritten, c.shape.q_size() + c.shape.lse_size());
}

class ForwardDeviceChecks : public HopperTest {};

TEST_F(ForwardDeviceChecks, RefusesHostPointers) {
  const Inputs in = random_inputs(kProbe);
  const DeviceProblem problem(kProbe, in);
  PoisonedBuffer host(kProbe.shape.q_size() * sizeof(uint16_t));
  Tensor host_q = problem.q();
  host_q.data = host.data();
  Status s = flash3::forward(host_q, problem.k(), problem.v(), problem.out(), problem.lse(),
                             problem.options(), nullptr);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "q.data is not device memory", s.message);
  s = flash3::forward(problem.q(), problem.k(), problem.v(), problem.out(),
                      reinterpret_cast<float*>(host.data()), problem.options(), nullptr);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "softmax_lse is not device memory", s.message);
  EXPECT_TRUE(host.untouched());
}

class ForwardCAbi : public HopperTest {};

TEST_F(ForwardCAbi, SuccessClearsTheLastError) {
  const Inputs in = random_inputs(kProbe);
  const DeviceProblem problem(kProbe, in);
  ASSERT_EQ(flash3_forward(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  const flash3_forward_args args = problem.c_args();
  const flash3_status status = flash3_forward(&args, nullptr);
  if (status == FLASH3_ERROR_UNSUPPORTED) {
    GTEST_SKIP() << flash3_last_error();
  }
  ASSERT_EQ(status, FLASH3_OK) << flash3_last_error();
  EXPECT_STREQ(flash3_last_error(), "");
  check_cuda(cudaDeviceSynchronize(), "the forward kernel");
  EXPECT_EQ(problem.download().unwritten, 0u);
}

}  // namespace
}  // namespace flash3::test
