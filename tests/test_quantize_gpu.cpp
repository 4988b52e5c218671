// The FP8 quantization kernel against flash3::ref::quantize_e4m3, on a
// Hopper GPU: every code and every scale must be bitwise the reference's.
// Every test skips, saying why, where there is no such GPU.
#include <cstdint>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "hopper_test.hpp"
#include "quantize_case.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr int kHeadDims[] = {64, 128, 256};

struct Shape {
  int batch, seqlen, heads, block_rows;
  uint64_t seed;
  bool strided;
};

// Single rows, ragged tails, blocks that are not a multiple of the 64 rows a
// CTA pass covers, blocks longer than one CTA's 128-row slice (500, 4096:
// amax across CTAs), more blocks than the persistent grid's CTAs (576).
constexpr Shape kShapes[] = {
    {2, 1, 3, 128, 0, false},      // one row per head
    {2, 17, 2, 64, 1, false},      // one partial block
    {1, 1013, 4, 100, 2, false},   // 11 blocks, a 13-row tail
    {1, 4097, 2, 128, 3, false},   // 33 blocks, a 1-row tail
    {2, 300, 3, 128, 4, true},     // x in packed qkv, x_fp8 padded
    {1, 1000, 2, 500, 5, false},   // rows past the register cache
    {1, 4097, 1, 4096, 6, false},  // 64 passes in one CTA, then a 1-row block
    {3, 65, 2, 1, 7, false},       // a scale per row
    {2, 4096, 9, 128, 8, true},    // 576 blocks: each persistent CTA takes several
};

using SweepParam = std::tuple<DType, int, bool>;  // dtype, headdim, hadamard

class QuantizeSweep : public HopperTest, public ::testing::WithParamInterface<SweepParam> {};

TEST_P(QuantizeSweep, MatchesTheReferenceBitwise) {
  const auto& [dtype, headdim, hadamard] = GetParam();
  for (const Shape& s : kShapes) {
    const QuantizeCase c{dtype,        headdim,  s.batch, s.seqlen, s.heads,
                         s.block_rows, hadamard, s.seed,  s.strided};
    SCOPED_TRACE(c.name());
    expect_quantize_matches_reference(c);
  }
}

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  const auto& [dtype, headdim, hadamard] = info.param;
  return kernel_label(dtype, headdim) + (hadamard ? "_hadamard" : "_plain");
}

INSTANTIATE_TEST_SUITE_P(Kernels, QuantizeSweep,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::ValuesIn(kHeadDims), ::testing::Bool()),
                         sweep_name);

// quantize_fp8_v: the same codes straight into the Fp8V layout (slots
// permuted within groups of 16 keys, zeros past seqlen), blocks of whole
// groups or one per head.
constexpr Shape kVShapes[] = {
    {2, 1, 3, 128, 0, false},      // one row: 15 zero slots
    {2, 17, 2, 64, 1, false},      // a partial group
    {1, 1013, 4, 112, 2, false},   // blocks of 7 groups, a 13-row tail
    {1, 4097, 2, 128, 3, false},   // a 1-row tail group
    {2, 300, 3, 128, 4, true},     // v in packed qkv
    {1, 1000, 2, 1000, 5, false},  // one scale per head: 128-row slices
    {3, 65, 2, 16, 7, false},      // a scale per group
    {2, 4096, 9, 128, 8, true},    // 576 blocks: each persistent CTA takes several
};

using VSweepParam = std::tuple<DType, int>;  // dtype, headdim

class QuantizeVSweep : public HopperTest, public ::testing::WithParamInterface<VSweepParam> {};

TEST_P(QuantizeVSweep, MatchesTheReferenceLayoutBitwise) {
  const auto& [dtype, headdim] = GetParam();
  for (const Shape& s : kVShapes) {
    QuantizeCase c{dtype, headdim, s.batch, s.seqlen, s.heads, s.block_rows, false, s.seed,
                   s.strided};
    c.v_layout = true;
    SCOPED_TRACE(c.name());
    expect_quantize_matches_reference(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, QuantizeVSweep,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::ValuesIn(kHeadDims)),
                         [](const ::testing::TestParamInfo<VSweepParam>& info) {
                           return kernel_label(std::get<0>(info.param), std::get<1>(info.param));
                         });

// Other seeds give other signs, and the kernel follows them.
class QuantizeSeeds : public HopperTest {};

TEST_F(QuantizeSeeds, SignsFollowTheSeed) {
  for (const uint64_t seed : {uint64_t{1}, uint64_t{0x5EED}, ~uint64_t{0}}) {
    const QuantizeCase c{DType::kBFloat16, 128, 2, 129, 2, 128, true, seed, false};
    SCOPED_TRACE(c.name());
    expect_quantize_matches_reference(c);
  }
}

// Small cases for compute-sanitizer: --gtest_filter='SanitizeQuantize*'.
class SanitizeQuantize : public HopperTest {};

TEST_F(SanitizeQuantize, Bf16D128HadamardStrided) {
  expect_quantize_matches_reference({DType::kBFloat16, 128, 2, 113, 2, 64, true, 3, true});
}

TEST_F(SanitizeQuantize, Fp16D256Block100) {
  expect_quantize_matches_reference({DType::kFloat16, 256, 1, 201, 2, 100, false, 0, false});
}

// Blocks longer than one CTA's slice (amax across CTAs), a short last block.
TEST_F(SanitizeQuantize, Bf16D64HadamardBlock300) {
  expect_quantize_matches_reference({DType::kBFloat16, 64, 2, 700, 2, 300, true, 5, false});
}

TEST_F(SanitizeQuantize, Fp16D128VLayoutBlock48) {
  QuantizeCase c{DType::kFloat16, 128, 2, 301, 3, 48, false, 11};
  c.v_layout = true;
  expect_quantize_matches_reference(c);
}

const QuantizeCase kProbe{DType::kBFloat16, 128, 2, 300, 2, 128, true, 1, false};

class QuantizeDeviceChecks : public HopperTest {};

TEST_F(QuantizeDeviceChecks, RefusesHostPointers) {
  const QuantizeProblem problem(kProbe, random_quantize_input(kProbe));
  PoisonedBuffer host(kProbe.num_scales() * sizeof(float));
  const Status s = flash3::quantize_fp8(problem.x(), problem.x_fp8(),
                                        reinterpret_cast<float*>(host.data()), kProbe.options());
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "descale is not device memory", s.message);
  EXPECT_TRUE(host.untouched());
}

class QuantizeCAbi : public HopperTest {};

TEST_F(QuantizeCAbi, SuccessClearsTheLastError) {
  const QuantizeProblem problem(kProbe, random_quantize_input(kProbe));
  ASSERT_EQ(flash3_quantize_fp8(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  const flash3_quantize_args args = problem.c_args();
  ASSERT_EQ(flash3_quantize_fp8(&args, nullptr), FLASH3_OK) << flash3_last_error();
  EXPECT_STREQ(flash3_last_error(), "");
  check_cuda(cudaDeviceSynchronize(), "the quantization kernel");
  problem.expect_matches_reference();
}

}  // namespace
}  // namespace flash3::test
