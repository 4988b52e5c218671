// The fp8_v_layout kernel against ref::fp8_v_layout, on a Hopper GPU: every
// byte of the Fp8V buffer (codes and zero pad slots) must be the reference's,
// nothing past it written, the input unchanged. Each case runs twice over
// outputs poisoned with two different bytes, so that a byte left unwritten
// cannot pass by equalling the poison. Every test skips, saying why, where
// there is no such GPU.
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hopper_test.hpp"
#include "reference/fp8.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr uint8_t kInputPoison = 0xA5;           // v's buffer outside its view
constexpr uint8_t kOutputPoisons[] = {0xFF, 0x5A};
constexpr size_t kGuardBytes = 256;              // poisoned bytes after v_out that must stay so
constexpr int64_t kBatchPadBytes = 16;           // the strided input's padding after each batch
constexpr int kPackedThirds = 3;                 // q, k, v in one buffer
constexpr int kMismatchesShown = 5;
constexpr int kHeadDims[] = {64, 128, 256};

struct LayoutCase {
  int headdim = 128;
  int batch = 1;
  int seqlen = 1;
  int heads = 1;
  // v the last third of a packed (q, k, v) buffer, with 16 bytes of padding
  // after each batch; else contiguous.
  bool strided = false;

  std::string name() const {
    std::ostringstream os;
    os << "d" << headdim << "_b" << batch << "_s" << seqlen << "_h" << heads
       << (strided ? "_strided" : "");
    return os.str();
  }
  ref::TensorDims dims() const { return {batch, seqlen, heads, headdim}; }
  Fp8V fp8_v(void* data) const { return Fp8V{data, batch, seqlen, heads, headdim}; }
};

View input_view(const LayoutCase& c) {
  if (!c.strided) {
    const int64_t row = int64_t{c.heads} * c.headdim;
    return {0, {c.batch, c.seqlen, c.heads, c.headdim}, {c.seqlen * row, row, c.headdim, 1}};
  }
  const int64_t row = int64_t{kPackedThirds} * c.heads * c.headdim;
  return {static_cast<size_t>(kPackedThirds - 1) * c.heads * c.headdim,
          {c.batch, c.seqlen, c.heads, c.headdim},
          {c.seqlen * row + kBatchPadBytes, row, c.headdim, 1}};
}

// Uniform random bytes (every e4m3 code, NaNs included: the layout copies
// bytes), seeded by the case's name; contiguous (batch, seqlen, heads, headdim).
std::vector<uint8_t> random_codes(const LayoutCase& c) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.name()));
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> codes(c.dims().size());
  for (uint8_t& code : codes) {
    code = static_cast<uint8_t>(byte(rng));
  }
  return codes;
}

class LayoutProblem {
 public:
  LayoutProblem(const LayoutCase& c, const std::vector<uint8_t>& codes)
      : case_(c),
        codes_(codes),
        view_(input_view(c)),
        staging_(static_cast<size_t>(view_.offset + view_.shape[0] * view_.stride[0]),
                 kInputPoison),
        out_bytes_(static_cast<size_t>(c.fp8_v(nullptr).bytes())),
        v_(staging_.size()),
        v_out_(out_bytes_ + kGuardBytes) {
    for_each_element(view_, [&](size_t logical, size_t index) { staging_[index] = codes[logical]; });
    check_cuda(cudaMemcpy(v_.get(), staging_.data(), staging_.size(), cudaMemcpyHostToDevice),
               "upload v");
    check_cuda(cudaDeviceSynchronize(), "set up the problem");
  }

  Tensor v() const { return view_tensor(v_.get(), DType::kFloat8E4M3, view_); }
  Fp8V v_out() const { return case_.fp8_v(v_out_.get()); }

  void poison(uint8_t byte) const {
    check_cuda(cudaMemset(v_out_.get(), byte, out_bytes_ + kGuardBytes), "poison v_out");
    // The memset ran on the legacy stream; a call on another stream would not wait.
    check_cuda(cudaDeviceSynchronize(), "poison v_out");
  }

  // After the call has finished: v unchanged, v_out the reference's bytes,
  // the guard bytes after it still `poison`.
  void expect_matches_reference(uint8_t poison) const {
    std::vector<uint8_t> v_after(staging_.size());
    std::vector<uint8_t> got(out_bytes_ + kGuardBytes);
    check_cuda(cudaMemcpy(v_after.data(), v_.get(), v_after.size(), cudaMemcpyDeviceToHost),
               "download v");
    check_cuda(cudaMemcpy(got.data(), v_out_.get(), got.size(), cudaMemcpyDeviceToHost),
               "download v_out");
    EXPECT_TRUE(v_after == staging_) << "the kernel wrote to v's buffer";
    const std::vector<uint8_t> want = ref::fp8_v_layout(case_.dims(), codes_);
    ASSERT_EQ(want.size(), out_bytes_);
    const int64_t padded = case_.fp8_v(nullptr).padded_seqlen();
    size_t mismatches = 0;
    for (size_t i = 0; i < out_bytes_; ++i) {
      if (got[i] != want[i] && mismatches++ < kMismatchesShown) {
        const size_t slot = i % padded, row = i / padded;
        ADD_FAILURE() << "byte " << i << " (b " << row / case_.headdim / case_.heads << ", h "
                      << row / case_.headdim % case_.heads << ", d " << row % case_.headdim
                      << ", slot " << slot << "): got 0x" << std::hex << int{got[i]}
                      << ", want 0x" << int{want[i]} << " (poison 0x" << int{poison} << ")";
      }
    }
    EXPECT_EQ(mismatches, 0u) << "bytes that differ from the reference";
    size_t clobbered = 0;
    for (size_t i = out_bytes_; i < got.size(); ++i) {
      clobbered += got[i] != poison;
    }
    EXPECT_EQ(clobbered, 0u) << "bytes the kernel wrote past v_out";
  }

 private:
  LayoutCase case_;
  std::vector<uint8_t> codes_;
  View view_;
  std::vector<uint8_t> staging_;
  size_t out_bytes_ = 0;
  DeviceBuffer v_, v_out_;
};

void expect_layout_matches_reference(const LayoutCase& c) {
  SCOPED_TRACE(c.name());
  const LayoutProblem problem(c, random_codes(c));
  for (const uint8_t poison : kOutputPoisons) {
    problem.poison(poison);
    const Status s = flash3::fp8_v_layout(problem.v(), problem.v_out());
    ASSERT_TRUE(s.ok()) << s.message;
    check_cuda(cudaDeviceSynchronize(), "the fp8_v_layout kernel");
    problem.expect_matches_reference(poison);
  }
}

struct Shape {
  int batch, seqlen, heads;
  bool strided;
};

// One key, a partial group, exactly one 128-key tile, a tile and a key,
// many tiles with a tail of 104 keys (1000 = 7 x 128 + 104), strided views.
constexpr Shape kShapes[] = {
    {2, 1, 3, false},   {1, 17, 2, false},  {2, 128, 2, true}, {3, 129, 1, false},
    {1, 1000, 3, false}, {2, 1000, 2, true}, {1, 4097, 4, true},
};

class Fp8VLayoutSweep : public HopperTest, public ::testing::WithParamInterface<int> {};

TEST_P(Fp8VLayoutSweep, MatchesTheReferenceBitwise) {
  for (const Shape& s : kShapes) {
    expect_layout_matches_reference({GetParam(), s.batch, s.seqlen, s.heads, s.strided});
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, Fp8VLayoutSweep, ::testing::ValuesIn(kHeadDims),
                         [](const auto& info) { return "d" + std::to_string(info.param); });

// More tiles than the kernel launches CTAs (2^16): its grid-stride loop.
class Fp8VLayoutManyTiles : public HopperTest {};

TEST_F(Fp8VLayoutManyTiles, MatchesTheReferenceBitwise) {
  expect_layout_matches_reference({64, 1, 1, 70001, false});
  expect_layout_matches_reference({64, 2, 17, 35000, false});
}

// Small cases for compute-sanitizer: --gtest_filter='*Sanitize*'.
class SanitizeFp8VLayout : public HopperTest {};

TEST_F(SanitizeFp8VLayout, D128StridedTail) { expect_layout_matches_reference({128, 2, 21, 2, true}); }

TEST_F(SanitizeFp8VLayout, D64TwoTiles) { expect_layout_matches_reference({64, 1, 130, 1, false}); }

TEST_F(SanitizeFp8VLayout, D256OneKey) { expect_layout_matches_reference({256, 2, 1, 2, false}); }

const LayoutCase kProbe{128, 2, 300, 2, false};

class Fp8VLayoutDeviceChecks : public HopperTest {};

TEST_F(Fp8VLayoutDeviceChecks, RefusesHostPointers) {
  const LayoutProblem problem(kProbe, random_codes(kProbe));
  PoisonedBuffer host(static_cast<size_t>(kProbe.fp8_v(nullptr).bytes()));
  const Status s = flash3::fp8_v_layout(problem.v(), kProbe.fp8_v(host.data()));
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "v_out.data is not device memory", s.message);
  EXPECT_TRUE(host.untouched());
}

class Fp8VLayoutCAbi : public HopperTest {};

TEST_F(Fp8VLayoutCAbi, SuccessClearsTheLastError) {
  const LayoutProblem problem(kProbe, random_codes(kProbe));
  problem.poison(kOutputPoisons[0]);
  ASSERT_EQ(flash3_fp8_v_layout(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  const flash3_fp8_v_layout_args args = to_c_args(problem.v(), problem.v_out());
  ASSERT_EQ(flash3_fp8_v_layout(&args, nullptr), FLASH3_OK) << flash3_last_error();
  EXPECT_STREQ(flash3_last_error(), "");
  check_cuda(cudaDeviceSynchronize(), "the fp8_v_layout kernel");
  problem.expect_matches_reference(kOutputPoisons[0]);
}

// On a non-blocking stream of its own: the kernel runs on the stream it is given.
TEST_F(Fp8VLayoutCAbi, RunsOnTheGivenStream) {
  const LayoutProblem problem(kProbe, random_codes(kProbe));
  problem.poison(kOutputPoisons[1]);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const flash3_fp8_v_layout_args args = to_c_args(problem.v(), problem.v_out());
  const flash3_status status = flash3_fp8_v_layout(&args, stream);
  check_cuda(cudaStreamSynchronize(stream), "the fp8_v_layout kernel");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  ASSERT_EQ(status, FLASH3_OK) << flash3_last_error();
  problem.expect_matches_reference(kOutputPoisons[1]);
}

}  // namespace
}  // namespace flash3::test
