// Every argument check of flash3::forward, through the C++ API and the C ABI:
// each invalid call is refused with the right code, a message naming the bad
// argument, and its buffers left as they were.
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "invalid_case.hpp"

namespace flash3::test {
namespace {

using Code = StatusCode;

constexpr int64_t kOver2To31 = int64_t{1} << 31;
// Just past TMA's 2^40-byte stride limit, in bf16 elements.
constexpr int64_t kOver2To40Bytes = (int64_t{1} << 39) + 8;
constexpr int64_t kLseRowsLimitSide = int64_t{1} << 16;  // its square exceeds 2^31-1

void set_headdim(Tensor& t, int64_t headdim) {
  set_dims(t, t.shape[0], t.shape[1], t.shape[2], headdim);
}

void set_headdim_all(HostProblem& p, int64_t headdim) {
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.out}) {
    set_headdim(*t, headdim);
  }
}

using InvalidForwardCase = InvalidCase<HostProblem>;

const InvalidForwardCase kCases[] = {
    {"NullQ", [](HostProblem& p) { p.q.data = nullptr; }, Code::kInvalidArgument, "q.data is null"},
    {"NullK", [](HostProblem& p) { p.k.data = nullptr; }, Code::kInvalidArgument, "k.data is null"},
    {"NullV", [](HostProblem& p) { p.v.data = nullptr; }, Code::kInvalidArgument, "v.data is null"},
    {"NullOut", [](HostProblem& p) { p.out.data = nullptr; }, Code::kInvalidArgument,
     "out.data is null"},
    {"UnknownDtype", [](HostProblem& p) { p.q.dtype = static_cast<DType>(7); },
     Code::kInvalidArgument, "q.dtype has the unknown value 7"},
    {"ZeroDtype", [](HostProblem& p) { p.k.dtype = static_cast<DType>(0); }, Code::kInvalidArgument,
     "k.dtype has the unknown value 0"},
    {"Float32Dtype", [](HostProblem& p) { p.k.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "k.dtype is float32"},
    {"Float8Dtype", [](HostProblem& p) { p.q.dtype = DType::kFloat8E4M3; }, Code::kUnsupported,
     "q.dtype is float8_e4m3"},
    {"MixedDtypes", [](HostProblem& p) { p.v.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "v.dtype (float16) differs from q.dtype (bfloat16)"},
    {"OutDtypeDiffers", [](HostProblem& p) { p.out.dtype = DType::kFloat16; },
     Code::kInvalidArgument, "out.dtype (float16) differs"},
    {"HeadDim96", [](HostProblem& p) { set_headdim_all(p, 96); }, Code::kUnsupported,
     "headdim = 96 is not supported"},
    {"HeadDim32", [](HostProblem& p) { set_headdim_all(p, 32); }, Code::kUnsupported,
     "headdim = 32 is not supported"},
    {"HeadDimMismatch", [](HostProblem& p) { set_headdim(p.k, 128); }, Code::kInvalidArgument,
     "k.shape[3] (headdim) = 128 differs"},
    {"HeadsNotAMultiple",
     [](HostProblem& p) {
       set_dims(p.q, 2, 8, 3, 64);
       set_dims(p.out, 2, 8, 3, 64);
     },
     Code::kInvalidArgument, "q.shape[2] (heads_q) = 3 is not a multiple of k.shape[2]"},
    {"KvSeqlenMismatch", [](HostProblem& p) { set_dims(p.v, 2, 15, 2, 64); },
     Code::kInvalidArgument, "v.shape[1] (seqlen) = 15 differs from k's 16"},
    {"KvHeadsMismatch", [](HostProblem& p) { set_dims(p.v, 2, 16, 1, 64); }, Code::kInvalidArgument,
     "v.shape[2] (heads) = 1 differs from k's 2"},
    {"BatchMismatch", [](HostProblem& p) { set_dims(p.k, 1, 16, 2, 64); }, Code::kInvalidArgument,
     "k.shape[0] (batch) = 1 differs from q's 2"},
    {"OutShapeDiffers", [](HostProblem& p) { set_dims(p.out, 2, 9, 4, 64); },
     Code::kInvalidArgument, "out.shape (2, 9, 4, 64) differs from q.shape (2, 8, 4, 64)"},
    {"ZeroSeqlen", [](HostProblem& p) { p.q.shape[1] = 0; }, Code::kInvalidArgument,
     "q.shape[1] (seqlen) = 0 must be at least 1"},
    {"NegativeHeads", [](HostProblem& p) { p.k.shape[2] = -2; }, Code::kInvalidArgument,
     "k.shape[2] (heads) = -2 must be at least 1"},
    {"ZeroBatch", [](HostProblem& p) { p.out.shape[0] = 0; }, Code::kInvalidArgument,
     "out.shape[0] (batch) = 0 must be at least 1"},
    {"SizeOver2To31", [](HostProblem& p) { p.v.shape[1] = kOver2To31; }, Code::kInvalidArgument,
     "v.shape[1] (seqlen) = 2147483648 exceeds 2^31-1"},
    {"LastDimStrided", [](HostProblem& p) { p.q.stride[3] = 2; }, Code::kInvalidArgument,
     "q.stride[3] (headdim) = 2 must be 1"},
    {"StrideNotA16ByteMultiple", [](HostProblem& p) { p.k.stride[1] = 129; },
     Code::kInvalidArgument, "k.stride[1] (seqlen) = 129 elements (258 bytes)"},
    {"MisalignedData", [](HostProblem& p) { p.v.data = offset_bytes(p.v.data, 2); },
     Code::kInvalidArgument, "v.data is not 16-byte aligned"},
    {"NegativeStride", [](HostProblem& p) { p.q.stride[2] = -64; }, Code::kInvalidArgument,
     "q.stride[2] (heads) = -64 must be positive"},
    {"ZeroStride", [](HostProblem& p) { p.out.stride[0] = 0; }, Code::kInvalidArgument,
     "out.stride[0] (batch) = 0 must be positive"},
    {"StrideOver2To40Bytes", [](HostProblem& p) { p.k.stride[0] = kOver2To40Bytes; },
     Code::kInvalidArgument, "k.stride[0] (batch) = 549755813896 elements exceeds the 2^40"},
    {"SpanPastAddressSpace",
     [](HostProblem& p) { p.q.data = reinterpret_cast<void*>(~uintptr_t{0xFFF}); },
     Code::kInvalidArgument, "q: shape and strides address past the end"},
    {"OutOverlapsItself", [](HostProblem& p) { p.out.stride[1] = 2 * HostProblem::kHeadDim; },
     Code::kInvalidArgument, "out's strides make elements overlap"},
    {"OutAliasesQ", [](HostProblem& p) { p.out.data = p.q.data; }, Code::kInvalidArgument,
     "out overlaps q"},
    {"OutOverlapsV", [](HostProblem& p) { p.out.data = offset_bytes(p.v.data, 4096); },
     Code::kInvalidArgument, "out overlaps v"},
    {"MisalignedLse", [](HostProblem& p) { p.lse = static_cast<float*>(offset_bytes(p.lse, 1)); },
     Code::kInvalidArgument, "softmax_lse is not 4-byte aligned"},
    {"NegativeScale", [](HostProblem& p) { p.options.softmax_scale = -1.0f; },
     Code::kInvalidArgument, "options.softmax_scale = -1"},
    {"NanScale",
     [](HostProblem& p) { p.options.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
     Code::kInvalidArgument, "options.softmax_scale = nan"},
    {"InfiniteScale",
     [](HostProblem& p) { p.options.softmax_scale = std::numeric_limits<float>::infinity(); },
     Code::kInvalidArgument, "options.softmax_scale = inf"},
    {"TooManyLseRows",
     [](HostProblem& p) {
       int slot = 1;
       for (Tensor* t : {&p.q, &p.k, &p.v, &p.out}) {
         t->data = far_address(slot++);
       }
       set_dims(p.q, kLseRowsLimitSide, 1, kLseRowsLimitSide, 64);
       set_dims(p.out, kLseRowsLimitSide, 1, kLseRowsLimitSide, 64);
       set_dims(p.k, kLseRowsLimitSide, 16, 1, 64);
       set_dims(p.v, kLseRowsLimitSide, 16, 1, 64);
     },
     Code::kInvalidArgument, "batch * heads_q = 4294967296 exceeds 2^31-1"},
};

class InvalidForward : public ::testing::TestWithParam<InvalidForwardCase> {};

TEST_P(InvalidForward, IsRefusedBeforeTouchingMemory) { expect_refused(GetParam()); }

TEST_P(InvalidForward, IsRefusedThroughTheCAbi) { expect_refused_through_c_abi(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, InvalidForward, ::testing::ValuesIn(kCases), CaseName{});

// Strides of size-1 dimensions are never used: any value passes validation.
TEST(ValidForward, IgnoresStridesOfSizeOneDimensions) {
  HostProblem p;
  for (Tensor* t : {&p.q, &p.out}) {
    t->shape[1] = 1;
    t->stride[1] = -3;
  }
  const Status s = p.call();
  EXPECT_FALSE(s.ok());  // no device here, or host pointers on a GPU machine
  EXPECT_EQ(s.message.find("stride"), std::string::npos) << s.message;
  EXPECT_TRUE(p.untouched());
}

// options.workspace, through the C++ API and the C ABI (its workspace fields).
void expect_refused_both_ways(const HostProblem& p, const std::string& message) {
  const Status s = p.call();
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, message, s.message);
  EXPECT_EQ(p.c_call(), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, message, flash3_last_error());
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardWorkspace, MisalignedIsRefused) {
  HostProblem p;
  PoisonedBuffer workspace(4096);
  p.options.workspace = offset_bytes(workspace.data(), 16);
  p.options.workspace_bytes = 1024;
  expect_refused_both_ways(p, "options.workspace is not 256-byte aligned");
  EXPECT_TRUE(workspace.untouched());
}

TEST(ForwardWorkspace, OverlappingATensorIsRefused) {
  for (const char* name : {"q", "out", "softmax_lse"}) {
    HostProblem p;
    void* base = std::string(name) == "q"     ? p.q.data
                 : std::string(name) == "out" ? p.out.data
                                               : static_cast<void*>(p.lse);
    // 256-byte aligned, covering the tensor's first byte.
    p.options.workspace = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(base) / 256 * 256);
    p.options.workspace_bytes = 512;
    expect_refused_both_ways(p, std::string("options.workspace overlaps ") + name);
  }
}

TEST(ForwardWorkspaceSize, NeedsNoDeviceAndGrowsWithTheHeadDim) {
  size_t previous = 0;
  for (const int64_t headdim : {64, 128, 256}) {
    const Tensor q = Tensor::contiguous(far_address(1), DType::kBFloat16, 2, 1000, 8, headdim);
    size_t bytes = 0;
    const Status s = flash3::forward_workspace_size(q, &bytes);
    ASSERT_TRUE(s.ok()) << s.message;
    // Each of up to 144 CTAs: at least a 128-row fp32 tile of O.
    EXPECT_GE(bytes, size_t{144} * 128 * headdim * sizeof(float)) << headdim;
    EXPECT_EQ(bytes % 256, 0u) << headdim;
    EXPECT_GT(bytes, previous) << headdim;
    previous = bytes;
  }
}

TEST(ForwardWorkspaceSize, RefusesWhatTheForwardRefuses) {
  size_t bytes = 7;
  Tensor q = Tensor::contiguous(far_address(1), DType::kBFloat16, 2, 1000, 8, 96);
  Status s = flash3::forward_workspace_size(q, &bytes);
  EXPECT_EQ(s.code, Code::kUnsupported) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::forward_workspace_size: headdim = 96",
                      s.message);
  q = Tensor::contiguous(far_address(1), DType::kFloat32, 2, 1000, 8, 128);
  s = flash3::forward_workspace_size(q, &bytes);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "q.dtype is float32", s.message);
  q.dtype = DType::kFloat8E4M3;
  EXPECT_TRUE(flash3::forward_workspace_size(q, &bytes).ok());
  s = flash3::forward_workspace_size(q, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "bytes is null", s.message);
}

TEST(ForwardWorkspaceSize, TheCAbiGivesTheSameSize) {
  const Tensor q = Tensor::contiguous(far_address(1), DType::kFloat16, 2, 1000, 8, 128);
  size_t cpp = 0, c = 0;
  ASSERT_TRUE(flash3::forward_workspace_size(q, &cpp).ok());
  const flash3_tensor q_c = to_c(q);
  ASSERT_EQ(flash3_forward_workspace_size(&q_c, &c), FLASH3_OK) << flash3_last_error();
  EXPECT_EQ(c, cpp);
  EXPECT_EQ(flash3_forward_workspace_size(nullptr, &c), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_forward_workspace_size: q is null",
                      flash3_last_error());
}

}  // namespace
}  // namespace flash3::test
