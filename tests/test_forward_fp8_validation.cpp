// Every argument check of flash3::forward_fp8 and flash3::fp8_v_layout,
// through the C++ API and the C ABI: each invalid call is refused with the
// right code, a message naming the bad argument, and its buffers left as
// they were.
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
using P = HostFp8Problem;
using L = HostFp8VLayoutProblem;

constexpr int64_t kOver2To31 = int64_t{1} << 31;
constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
constexpr int64_t kScalesLimitSide = int64_t{1} << 16;  // its square exceeds 2^31-1
// v.heads that puts the layout's batch stride (heads * 128 * 208 bytes) past 2^40.
constexpr int64_t kHeadsPastTmaStride = int64_t{1} << 26;
constexpr int kUnknownDtype = 9;

void set_headdim_all(P& p, int64_t headdim) {
  set_dims(p.q, P::kBatch, P::kSeqlenQ, P::kHeadsQ, headdim);
  set_dims(p.k, P::kBatch, P::kSeqlenK, P::kHeadsK, headdim);
  set_dims(p.out, P::kBatch, P::kSeqlenQ, P::kHeadsQ, headdim);
  p.v.headdim = headdim;
}

void set_headdim_both(L& p, int64_t headdim) {
  set_dims(p.v, L::kBatch, L::kSeqlen, L::kHeads, headdim);
  p.v_out.headdim = headdim;
}

float* scales_at(void* base, size_t bytes) {
  return static_cast<float*>(offset_bytes(base, bytes));
}

// ---------------------------------------------------------------- forward_fp8

using InvalidFp8Case = InvalidCase<P>;

const InvalidFp8Case kFp8Cases[] = {
    {"NullQ", [](P& p) { p.q.data = nullptr; }, Code::kInvalidArgument,
     "flash3::forward_fp8: q.data is null"},
    {"NullK", [](P& p) { p.k.data = nullptr; }, Code::kInvalidArgument, "k.data is null"},
    {"NullV", [](P& p) { p.v.data = nullptr; }, Code::kInvalidArgument, "v.data is null"},
    {"NullOut", [](P& p) { p.out.data = nullptr; }, Code::kInvalidArgument, "out.data is null"},
    {"NullQDescale", [](P& p) { p.descales.q.data = nullptr; }, Code::kInvalidArgument,
     "descales.q.data is null: the FP8 forward needs the descale factors of q"},
    {"NullKDescale", [](P& p) { p.descales.k.data = nullptr; }, Code::kInvalidArgument,
     "descales.k.data is null: the FP8 forward needs the descale factors of k"},
    {"NullVDescale", [](P& p) { p.descales.v.data = nullptr; }, Code::kInvalidArgument,
     "descales.v.data is null: the FP8 forward needs the descale factors of v"},
    {"NoDescales", [](P& p) { p.descales = Fp8Descales{}; }, Code::kInvalidArgument,
     "descales.q.data is null"},
    {"UnknownDtype", [](P& p) { p.k.dtype = static_cast<DType>(kUnknownDtype); },
     Code::kInvalidArgument, "k.dtype has the unknown value 9"},
    {"QBfloat16", [](P& p) { p.q.dtype = DType::kBFloat16; }, Code::kInvalidArgument,
     "q.dtype is bfloat16; q must be float8_e4m3"},
    {"KFloat16", [](P& p) { p.k.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "k.dtype is float16; k must be float8_e4m3"},
    {"OutFloat8", [](P& p) { p.out.dtype = DType::kFloat8E4M3; }, Code::kInvalidArgument,
     "out.dtype is float8_e4m3; out must be float16 or bfloat16"},
    {"OutFloat32", [](P& p) { p.out.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "out.dtype is float32; out must be float16 or bfloat16"},
    {"HeadDim192", [](P& p) { set_headdim_all(p, 192); }, Code::kUnsupported,
     "headdim = 192 is not supported by the FP8 forward; supported: 64, 128, 256"},
    {"HeadDim96", [](P& p) { set_headdim_all(p, 96); }, Code::kUnsupported,
     "headdim = 96 is not supported by the FP8 forward"},
    {"KHeadDimMismatch",
     [](P& p) { set_dims(p.k, P::kBatch, P::kSeqlenK, P::kHeadsK, 256); },
     Code::kInvalidArgument, "k.shape[3] (headdim) = 256 differs from q's 128"},
    {"OutBatchMismatch",
     [](P& p) { set_dims(p.out, 1, P::kSeqlenQ, P::kHeadsQ, P::kHeadDim); },
     Code::kInvalidArgument, "out.shape[0] (batch) = 1 differs from q's 2"},
    {"VSeqlenMismatch", [](P& p) { p.v.seqlen = 199; }, Code::kInvalidArgument,
     "v.seqlen = 199 differs from k.shape[1] (seqlen) = 200"},
    {"VHeadsMismatch", [](P& p) { p.v.heads = 4; }, Code::kInvalidArgument,
     "v.heads = 4 differs from k.shape[2] (heads) = 2"},
    {"VHeadDimMismatch", [](P& p) { p.v.headdim = 256; }, Code::kInvalidArgument,
     "v.headdim = 256 differs from k.shape[3] (headdim) = 128"},
    {"VBatchMismatch", [](P& p) { p.v.batch = 3; }, Code::kInvalidArgument,
     "v.batch = 3 differs from k.shape[0] (batch) = 2"},
    {"VZeroSeqlen", [](P& p) { p.v.seqlen = 0; }, Code::kInvalidArgument,
     "v.seqlen = 0 must be at least 1"},
    {"VNegativeHeads", [](P& p) { p.v.heads = -2; }, Code::kInvalidArgument,
     "v.heads = -2 must be at least 1"},
    {"VBatchOver2To31", [](P& p) { p.v.batch = kOver2To31; }, Code::kInvalidArgument,
     "v.batch = 2147483648 exceeds 2^31-1"},
    {"VPaddedSeqlenOver2To31", [](P& p) { p.v.seqlen = kMax32; }, Code::kInvalidArgument,
     "v.seqlen = 2147483647 padded to a multiple of 16 (2147483648) exceeds 2^31-1"},
    {"MisalignedV", [](P& p) { p.v.data = offset_bytes(p.v.data, 8); }, Code::kInvalidArgument,
     "v.data is not 16-byte aligned"},
    {"VBatchStrideOver2To40", [](P& p) { p.v.heads = kHeadsPastTmaStride; },
     Code::kInvalidArgument,
     "v: heads * headdim * padded_seqlen = 1786706395136 bytes, the layout's batch stride, "
     "exceeds the 2^40-byte stride limit of TMA"},
    {"VPastAddressSpace", [](P& p) { p.v.data = reinterpret_cast<void*>(~uintptr_t{0xFFF}); },
     Code::kInvalidArgument, "v: its batch * heads * headdim * padded_seqlen bytes address past"},
    {"QStrideNotA16ByteMultiple", [](P& p) { p.q.stride[1] = 520; }, Code::kInvalidArgument,
     "q.stride[1] (seqlen) = 520 elements (520 bytes) is not a multiple of 16 bytes"},
    {"KLastDimStrided", [](P& p) { p.k.stride[3] = 2; }, Code::kInvalidArgument,
     "k.stride[3] (headdim) = 2 must be 1"},
    {"MisalignedK", [](P& p) { p.k.data = offset_bytes(p.k.data, 8); }, Code::kInvalidArgument,
     "k.data is not 16-byte aligned"},
    {"MisalignedOut", [](P& p) { p.out.data = offset_bytes(p.out.data, 2); },
     Code::kInvalidArgument, "out.data is not 16-byte aligned"},
    {"OutShapeDiffers", [](P& p) { set_dims(p.out, 2, 129, 4, 128); }, Code::kInvalidArgument,
     "out.shape (2, 129, 4, 128) differs from q.shape (2, 130, 4, 128)"},
    {"HeadsNotAMultiple",
     [](P& p) {
       set_dims(p.q, P::kBatch, P::kSeqlenQ, 3, P::kHeadDim);
       set_dims(p.out, P::kBatch, P::kSeqlenQ, 3, P::kHeadDim);
     },
     Code::kInvalidArgument, "q.shape[2] (heads_q) = 3 is not a multiple of k.shape[2]"},
    {"MisalignedQDescale",
     [](P& p) { p.descales.q.data = scales_at(p.q_scale_buffer.data(), 2); },
     Code::kInvalidArgument, "descales.q.data is not 4-byte aligned"},
    {"ZeroKBlockRows", [](P& p) { p.descales.k.block_rows = 0; }, Code::kInvalidArgument,
     "descales.k.block_rows = 0 must be positive"},
    {"NegativeVBlockRows", [](P& p) { p.descales.v.block_rows = -128; }, Code::kInvalidArgument,
     "descales.v.block_rows = -128 must be positive"},
    {"QBlockRowsNotATile", [](P& p) { p.descales.q.block_rows = 100; }, Code::kInvalidArgument,
     "descales.q.block_rows = 100 must be a multiple of 64 (the kernel's tile of query rows) or "
     "at least seqlen_q = 130"},
    {"KBlockRows64", [](P& p) { p.descales.k.block_rows = 64; }, Code::kInvalidArgument,
     "descales.k.block_rows = 64 must be a multiple of 128 (the kernel's tile of keys) or at "
     "least seqlen_k = 200"},
    {"VBlockRows199", [](P& p) { p.descales.v.block_rows = 199; }, Code::kInvalidArgument,
     "descales.v.block_rows = 199 must be a multiple of 128"},
    {"QDescalePastAddressSpace",
     [](P& p) { p.descales.q.data = reinterpret_cast<float*>(~uintptr_t{0xF}); },
     Code::kInvalidArgument,
     "descales.q: its 24 floats address past the end of the address space"},
    {"TooManyQScales",
     [](P& p) {
       p.q.data = far_address(1);
       p.k.data = far_address(2);
       p.v.data = far_address(3);
       p.out.data = far_address(4);
       set_dims(p.q, kScalesLimitSide, 64, kScalesLimitSide, 128);
       set_dims(p.out, kScalesLimitSide, 64, kScalesLimitSide, 128);
       set_dims(p.k, kScalesLimitSide, 128, 1, 128);
       p.v = Fp8V{p.v.data, kScalesLimitSide, 128, 1, 128};
     },
     Code::kInvalidArgument,
     "descales.q: batch * heads * ceil(seqlen_q / block_rows) = 4294967296 scales exceeds "
     "2^31-1"},
    {"OutOverlapsItself", [](P& p) { p.out.stride[1] = 2 * P::kHeadDim; },
     Code::kInvalidArgument, "out's strides make elements overlap"},
    {"OutAliasesQ", [](P& p) { p.out.data = p.q.data; }, Code::kInvalidArgument,
     "out overlaps q in memory"},
    {"OutOverlapsK", [](P& p) { p.out.data = offset_bytes(p.k.data, 4096); },
     Code::kInvalidArgument, "out overlaps k in memory"},
    {"OutOverlapsV", [](P& p) { p.out.data = offset_bytes(p.v.data, 4096); },
     Code::kInvalidArgument, "out overlaps v in memory"},
    {"OutOverlapsKDescale",
     [](P& p) { p.descales.k.data = scales_at(p.out.data, 1000); },
     Code::kInvalidArgument, "out overlaps descales.k in memory"},
    {"MisalignedLse", [](P& p) { p.lse = scales_at(p.lse, 1); }, Code::kInvalidArgument,
     "softmax_lse is not 4-byte aligned"},
    {"NegativeScale", [](P& p) { p.options.softmax_scale = -1.0f; }, Code::kInvalidArgument,
     "options.softmax_scale = -1"},
    {"NanScale",
     [](P& p) { p.options.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
     Code::kInvalidArgument, "options.softmax_scale = nan"},
};

class InvalidForwardFp8 : public ::testing::TestWithParam<InvalidFp8Case> {};

TEST_P(InvalidForwardFp8, IsRefusedBeforeTouchingMemory) { expect_refused(GetParam()); }

TEST_P(InvalidForwardFp8, IsRefusedThroughTheCAbi) { expect_refused_through_c_abi(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, InvalidForwardFp8, ::testing::ValuesIn(kFp8Cases), CaseName{});

// (The C ABI's FP8 args have no window to give.)
TEST(ForwardFp8Window, IsRefusedAsUnsupported) {
  expect_refused(InvalidFp8Case{"Window", [](P& p) { p.options.window_left = 128; },
                                Code::kUnsupported, "the FP8 forward has no sliding window yet"});
}

TEST(ForwardFp8CAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_forward_fp8(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_forward_fp8: args is null",
                      flash3_last_error());
}

TEST(ForwardFp8CAbi, ZeroInitializedArgsNameQ) {
  const flash3_forward_fp8_args args{};
  EXPECT_EQ(flash3_forward_fp8(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::forward_fp8: q.data is null",
                      flash3_last_error());
}

// The C struct's descales reach the right C++ fields: each one missing alone
// is named.
TEST(ForwardFp8CAbi, EachDescaleIsPassedThrough) {
  const struct {
    flash3_fp8_descale flash3_forward_fp8_args::*field;
    const char* message;
  } fields[] = {{&flash3_forward_fp8_args::q_descale, "descales.q.data is null"},
                {&flash3_forward_fp8_args::k_descale, "descales.k.data is null"},
                {&flash3_forward_fp8_args::v_descale, "descales.v.data is null"}};
  for (const auto& [field, message] : fields) {
    P p;
    flash3_forward_fp8_args args = p.c_args();
    (args.*field).data = nullptr;
    EXPECT_EQ(flash3_forward_fp8(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, message, flash3_last_error());
    EXPECT_TRUE(p.untouched());
  }
}

// Valid calls get past validation: without a GPU they stop at the device
// check; with one, at the pointer check (these are host buffers).
void expect_passes_validation(const Status& s, const char* first_pointer) {
  const bool gpu = cuda_device_count() > 0;
  EXPECT_EQ(s.code, gpu ? Code::kInvalidArgument : Code::kNoDevice) << s.message;
  const std::string expected =
      gpu ? std::string(first_pointer) + " is not device memory" : "no usable CUDA device";
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected, s.message);
}

class ValidForwardFp8 : public ::testing::TestWithParam<void (*)(P&)> {};

TEST_P(ValidForwardFp8, PassesValidation) {
  P p;
  GetParam()(p);
  expect_passes_validation(p.call(), "q.data");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::forward_fp8", p.call().message);
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidForwardFp8,
    ::testing::Values([](P&) {},                                       // bf16 out, causal
                      [](P& p) { p.out.dtype = DType::kFloat16; },     // fp16 out
                      [](P& p) { set_headdim_all(p, 256); },           // head dim 256
                      [](P& p) { p.lse = nullptr; },                   // no LSE
                      [](P& p) { p.options = ForwardOptions{}; },      // the defaults
                      [](P& p) {                                       // one scale per head
                        p.descales.q.block_rows = P::kSeqlenQ;
                        p.descales.k.block_rows = P::kSeqlenK;
                        p.descales.v.block_rows = std::numeric_limits<int>::max();
                      },
                      [](P& p) {  // tiles' multiples
                        p.descales.q.block_rows = 128;
                        p.descales.k.block_rows = 256;
                        p.descales.v.block_rows = 128;
                      },
                      [](P& p) {  // seqlen 1 everywhere: any block_rows covers it
                        set_dims(p.q, P::kBatch, 1, P::kHeadsQ, P::kHeadDim);
                        set_dims(p.out, P::kBatch, 1, P::kHeadsQ, P::kHeadDim);
                        set_dims(p.k, P::kBatch, 1, P::kHeadsK, P::kHeadDim);
                        p.v.seqlen = 1;
                        p.descales.q.block_rows = 1;
                        p.descales.k.block_rows = 1;
                        p.descales.v.block_rows = 1;
                      },
                      [](P& p) {  // q every other row, k padded by 16 bytes a row
                        const int64_t q_row = 2 * P::kHeadsQ * P::kHeadDim;
                        p.q.stride = {P::kSeqlenQ * q_row, q_row, P::kHeadDim, 1};
                        const int64_t k_row = P::kHeadsK * P::kHeadDim + 16;
                        p.k.stride = {P::kSeqlenK * k_row, k_row, P::kHeadDim, 1};
                      }));

// ---------------------------------------------------------------- fp8_v_layout

using InvalidLayoutCase = InvalidCase<L>;

const InvalidLayoutCase kLayoutCases[] = {
    {"NullV", [](L& p) { p.v.data = nullptr; }, Code::kInvalidArgument,
     "flash3::fp8_v_layout: v.data is null"},
    {"NullVOut", [](L& p) { p.v_out.data = nullptr; }, Code::kInvalidArgument,
     "v_out.data is null"},
    {"VBfloat16", [](L& p) { p.v.dtype = DType::kBFloat16; }, Code::kInvalidArgument,
     "v.dtype is bfloat16; v must be float8_e4m3"},
    {"UnknownDtype", [](L& p) { p.v.dtype = static_cast<DType>(kUnknownDtype); },
     Code::kInvalidArgument, "v.dtype has the unknown value 9"},
    {"VZeroSeqlen", [](L& p) { p.v.shape[1] = 0; }, Code::kInvalidArgument,
     "v.shape[1] (seqlen) = 0 must be at least 1"},
    {"VOutZeroHeads", [](L& p) { p.v_out.heads = 0; }, Code::kInvalidArgument,
     "v_out.heads = 0 must be at least 1"},
    {"VOutSeqlenOver2To31", [](L& p) { p.v_out.seqlen = kOver2To31; }, Code::kInvalidArgument,
     "v_out.seqlen = 2147483648 exceeds 2^31-1"},
    {"VOutSeqlenMismatch", [](L& p) { p.v_out.seqlen = 20; }, Code::kInvalidArgument,
     "v_out.seqlen = 20 differs from v.shape[1] (seqlen) = 21"},
    {"VOutBatchMismatch", [](L& p) { p.v_out.batch = 1; }, Code::kInvalidArgument,
     "v_out.batch = 1 differs from v.shape[0] (batch) = 2"},
    {"VOutHeadsMismatch", [](L& p) { p.v_out.heads = 2; }, Code::kInvalidArgument,
     "v_out.heads = 2 differs from v.shape[2] (heads) = 3"},
    {"VOutHeadDimMismatch", [](L& p) { p.v_out.headdim = 128; }, Code::kInvalidArgument,
     "v_out.headdim = 128 differs from v.shape[3] (headdim) = 64"},
    {"HeadDim96", [](L& p) { set_headdim_both(p, 96); }, Code::kUnsupported,
     "headdim = 96 is not supported; supported: 64, 128, 256"},
    {"HeadDim32", [](L& p) { set_headdim_both(p, 32); }, Code::kUnsupported,
     "headdim = 32 is not supported"},
    {"MisalignedV", [](L& p) { p.v.data = offset_bytes(p.v.data, 4); }, Code::kInvalidArgument,
     "v.data is not 16-byte aligned"},
    {"MisalignedVOut", [](L& p) { p.v_out.data = offset_bytes(p.v_out.data, 8); },
     Code::kInvalidArgument, "v_out.data is not 16-byte aligned"},
    {"VStrideNotA16ByteMultiple", [](L& p) { p.v.stride[1] = 200; }, Code::kInvalidArgument,
     "v.stride[1] (seqlen) = 200 elements (200 bytes) is not a multiple of 16 bytes"},
    {"VLastDimStrided", [](L& p) { p.v.stride[3] = 2; }, Code::kInvalidArgument,
     "v.stride[3] (headdim) = 2 must be 1"},
    {"VOutPastAddressSpace",
     [](L& p) { p.v_out.data = reinterpret_cast<void*>(~uintptr_t{0xFF}); },
     Code::kInvalidArgument, "v_out: its batch * heads * headdim * padded_seqlen bytes address"},
    {"VOutAliasesV", [](L& p) { p.v_out.data = p.v.data; }, Code::kInvalidArgument,
     "v_out overlaps v in memory"},
    {"VOutInsideV", [](L& p) { p.v_out.data = offset_bytes(p.v.data, 1024); },
     Code::kInvalidArgument, "v_out overlaps v in memory"},
};

class InvalidFp8VLayout : public ::testing::TestWithParam<InvalidLayoutCase> {};

TEST_P(InvalidFp8VLayout, IsRefusedBeforeTouchingMemory) { expect_refused(GetParam()); }

TEST_P(InvalidFp8VLayout, IsRefusedThroughTheCAbi) { expect_refused_through_c_abi(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, InvalidFp8VLayout, ::testing::ValuesIn(kLayoutCases), CaseName{});

TEST(Fp8VLayoutCAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_fp8_v_layout(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_fp8_v_layout: args is null",
                      flash3_last_error());
}

TEST(Fp8VLayoutCAbi, ZeroInitializedArgsNameV) {
  const flash3_fp8_v_layout_args args{};
  EXPECT_EQ(flash3_fp8_v_layout(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::fp8_v_layout: v.data is null",
                      flash3_last_error());
}

TEST(Fp8VLayoutCAbi, KeyGroupMatchesTheCppHeader) {
  EXPECT_EQ(FLASH3_FP8_V_KEY_GROUP, kFp8VKeyGroup);
}

class ValidFp8VLayout : public ::testing::TestWithParam<void (*)(L&)> {};

TEST_P(ValidFp8VLayout, PassesValidation) {
  L p;
  GetParam()(p);
  const Status s = p.call();
  expect_passes_validation(s, "v.data");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::fp8_v_layout", s.message);
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidFp8VLayout,
    ::testing::Values([](L&) {},                                    // head dim 64, a tail
                      [](L& p) { set_headdim_both(p, 128); },       // 128
                      [](L& p) { set_headdim_both(p, 256); },       // 256
                      [](L& p) {                                    // one key
                        p.v.shape[1] = p.v_out.seqlen = 1;
                        p.v.stride[1] = -3;  // a size-1 dimension may carry any stride
                      },
                      [](L& p) {  // v the last third of a packed qkv buffer
                        const int64_t row = 3 * L::kHeads * L::kHeadDim;
                        p.v.data = offset_bytes(p.v.data, 2 * L::kHeads * L::kHeadDim);
                        p.v.stride = {L::kSeqlen * row, row, L::kHeadDim, 1};
                      }));

}  // namespace
}  // namespace flash3::test
