// Every argument check of flash3::quantize_fp8, through the C++ API and the
// C ABI: each invalid call is refused with the right code, a message naming
// the bad argument, and its buffers left as they were.
#include <cstdint>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "invalid_case.hpp"

namespace flash3::test {
namespace {

using Code = StatusCode;
using P = HostQuantizeProblem;

constexpr int64_t kOver2To31 = int64_t{1} << 31;
constexpr int kMaxBlockRows = 1 << 20;
constexpr int64_t kScalesLimitSide = int64_t{1} << 16;  // its square exceeds 2^31-1
constexpr int kUnknownDtype = 9;

void set_headdim_both(P& p, int64_t headdim) {
  for (Tensor* t : {&p.x, &p.x_fp8}) {
    set_dims(*t, P::kBatch, P::kSeqlen, P::kHeads, headdim);
  }
}

using InvalidQuantizeCase = InvalidCase<P>;

const InvalidQuantizeCase kCases[] = {
    {"NullX", [](P& p) { p.x.data = nullptr; }, Code::kInvalidArgument,
     "flash3::quantize_fp8: x.data is null"},
    {"NullXFp8", [](P& p) { p.x_fp8.data = nullptr; }, Code::kInvalidArgument,
     "x_fp8.data is null"},
    {"NullDescale", [](P& p) { p.descale = nullptr; }, Code::kInvalidArgument, "descale is null"},
    {"UnknownDtype", [](P& p) { p.x.dtype = static_cast<DType>(kUnknownDtype); },
     Code::kInvalidArgument, "x.dtype has the unknown value 9"},
    {"XFloat32", [](P& p) { p.x.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "x.dtype is float32; x must be float16 or bfloat16"},
    {"XFloat8", [](P& p) { p.x.dtype = DType::kFloat8E4M3; }, Code::kInvalidArgument,
     "x.dtype is float8_e4m3; x must be float16 or bfloat16"},
    {"XFp8Bfloat16", [](P& p) { p.x_fp8.dtype = DType::kBFloat16; }, Code::kInvalidArgument,
     "x_fp8.dtype is bfloat16; x_fp8 must be float8_e4m3"},
    {"XFp8Float32", [](P& p) { p.x_fp8.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "x_fp8.dtype is float32; x_fp8 must be float8_e4m3"},
    {"ShapeMismatch", [](P& p) { set_dims(p.x_fp8, 2, 39, 3, 64); }, Code::kInvalidArgument,
     "x_fp8.shape (2, 39, 3, 64) differs from x.shape (2, 40, 3, 64)"},
    {"HeadDim96", [](P& p) { set_headdim_both(p, 96); }, Code::kUnsupported,
     "headdim = 96 is not supported"},
    {"HeadDim32", [](P& p) { set_headdim_both(p, 32); }, Code::kUnsupported,
     "headdim = 32 is not supported"},
    {"ZeroSeqlen", [](P& p) { p.x.shape[1] = 0; }, Code::kInvalidArgument,
     "x.shape[1] (seqlen) = 0 must be at least 1"},
    {"ZeroHeads", [](P& p) { p.x_fp8.shape[2] = 0; }, Code::kInvalidArgument,
     "x_fp8.shape[2] (heads) = 0 must be at least 1"},
    {"SizeOver2To31", [](P& p) { p.x.shape[0] = kOver2To31; }, Code::kInvalidArgument,
     "x.shape[0] (batch) = 2147483648 exceeds 2^31-1"},
    {"ZeroBlockRows", [](P& p) { p.options.block_rows = 0; }, Code::kInvalidArgument,
     "options.block_rows = 0 must be in [1, 1048576]"},
    {"NegativeBlockRows", [](P& p) { p.options.block_rows = -5; }, Code::kInvalidArgument,
     "options.block_rows = -5 must be in [1, 1048576]"},
    {"BlockRowsOver2To20", [](P& p) { p.options.block_rows = kMaxBlockRows + 1; },
     Code::kInvalidArgument, "options.block_rows = 1048577 must be in [1, 1048576]"},
    {"MisalignedDescale", [](P& p) { p.descale = static_cast<float*>(offset_bytes(p.descale, 2)); },
     Code::kInvalidArgument, "descale is not 4-byte aligned"},
    {"XFp8LastDimStrided", [](P& p) { p.x_fp8.stride[3] = 2; }, Code::kInvalidArgument,
     "x_fp8.stride[3] (headdim) = 2 must be 1"},
    {"XFp8StrideNotA16ByteMultiple", [](P& p) { p.x_fp8.stride[1] = 200; }, Code::kInvalidArgument,
     "x_fp8.stride[1] (seqlen) = 200 elements (200 bytes)"},
    {"MisalignedX", [](P& p) { p.x.data = offset_bytes(p.x.data, 2); }, Code::kInvalidArgument,
     "x.data is not 16-byte aligned"},
    {"MisalignedXFp8", [](P& p) { p.x_fp8.data = offset_bytes(p.x_fp8.data, 8); },
     Code::kInvalidArgument, "x_fp8.data is not 16-byte aligned"},
    {"NegativeStride", [](P& p) { p.x.stride[2] = -64; }, Code::kInvalidArgument,
     "x.stride[2] (heads) = -64 must be positive"},
    {"TooManyScales",
     [](P& p) {
       p.x.data = far_address(1);
       p.x_fp8.data = far_address(2);
       p.descale = static_cast<float*>(far_address(3));
       set_dims(p.x, kScalesLimitSide, 1, kScalesLimitSide, 64);
       set_dims(p.x_fp8, kScalesLimitSide, 1, kScalesLimitSide, 64);
     },
     Code::kInvalidArgument,
     "batch * heads * ceil(seqlen / block_rows) = 4294967296 scales exceeds 2^31-1"},
    {"DescalePastAddressSpace", [](P& p) { p.descale = reinterpret_cast<float*>(~uintptr_t{0xF}); },
     Code::kInvalidArgument, "descale: its 18 floats address past the end of the address space"},
    {"XFp8OverlapsItself", [](P& p) { p.x_fp8.stride[1] = P::kHeadDim; }, Code::kInvalidArgument,
     "x_fp8's strides make elements overlap"},
    {"XFp8AliasesX", [](P& p) { p.x_fp8.data = p.x.data; }, Code::kInvalidArgument,
     "x_fp8 overlaps x"},
    {"DescaleInsideXFp8",
     [](P& p) { p.descale = static_cast<float*>(offset_bytes(p.x_fp8.data, 64)); },
     Code::kInvalidArgument, "descale overlaps x_fp8"},
    {"DescaleInsideX", [](P& p) { p.descale = static_cast<float*>(p.x.data); },
     Code::kInvalidArgument, "descale overlaps x"},
};

class InvalidQuantize : public ::testing::TestWithParam<InvalidQuantizeCase> {};

TEST_P(InvalidQuantize, IsRefusedBeforeTouchingMemory) { expect_refused(GetParam()); }

TEST_P(InvalidQuantize, IsRefusedThroughTheCAbi) { expect_refused_through_c_abi(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, InvalidQuantize, ::testing::ValuesIn(kCases), CaseName{});

TEST(QuantizeCAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_quantize_fp8(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_quantize_fp8: args is null",
                      flash3_last_error());
}

TEST(QuantizeCAbi, ZeroInitializedArgsNameX) {
  const flash3_quantize_args args{};
  EXPECT_EQ(flash3_quantize_fp8(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "x.data is null", flash3_last_error());
}

// Valid calls get past validation: without a GPU they stop at the device
// check; with one, at the pointer check (these are host buffers).
class ValidQuantize : public ::testing::TestWithParam<void (*)(P&)> {};

TEST_P(ValidQuantize, PassesValidation) {
  P p;
  GetParam()(p);
  const Status s = p.call();
  const StatusCode expected = cuda_device_count() > 0 ? Code::kInvalidArgument : Code::kNoDevice;
  EXPECT_EQ(s.code, expected) << s.message;
  const char* expected_message =
      cuda_device_count() > 0 ? "x.data is not device memory" : "no usable CUDA device";
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected_message, s.message);
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidQuantize,
    ::testing::Values([](P&) {},                                           // bf16, Hadamard
                      [](P& p) { p.x.dtype = DType::kFloat16; },           // fp16
                      [](P& p) { p.options = QuantizeOptions{}; },         // the defaults
                      [](P& p) { p.options.block_rows = 1; },              // a scale per row
                      [](P& p) { p.options.block_rows = kMaxBlockRows; },  // the largest
                      [](P& p) { set_headdim_both(p, 128); },
                      [](P& p) {  // size-1 dimensions may carry any stride
                        p.x.shape[1] = p.x_fp8.shape[1] = 1;
                        p.x.stride[1] = p.x_fp8.stride[1] = -3;
                      },
                      [](P& p) {  // x every other row, as a view of a larger tensor
                        const int64_t row = 2 * P::kHeads * P::kHeadDim;
                        p.x.stride = {P::kSeqlen * row, row, P::kHeadDim, 1};
                      }));

// quantize_fp8_v: x_fp8 replaced by an Fp8V tensor over the same host
// buffer; its own checks, then a valid call stops at the device check.
struct HostQuantizeVProblem : P {
  Fp8V v_out{x_fp8_buffer.data(), kBatch, kSeqlen, kHeads, kHeadDim};
  HostQuantizeVProblem() { options = QuantizeOptions{kBlockRows, false, 0}; }
  Status call_v() const { return flash3::quantize_fp8_v(x, v_out, descale, options, nullptr); }
};

struct QuantizeVCase {
  const char* name;
  void (*mutate)(HostQuantizeVProblem&);
  const char* message;
};

const QuantizeVCase kVCases[] = {
    {"Hadamard", [](HostQuantizeVProblem& p) { p.options.hadamard = true; },
     "flash3::quantize_fp8_v: options.hadamard: V is quantized without the transform"},
    {"BlockRowsNotAGroupMultiple", [](HostQuantizeVProblem& p) { p.options.block_rows = 24; },
     "options.block_rows = 24 must be a multiple of 16 (the Fp8V layout's key groups) or at "
     "least seqlen (40)"},
    {"NullOut", [](HostQuantizeVProblem& p) { p.v_out.data = nullptr; }, "v_out.data is null"},
    {"OutSeqlenDiffers", [](HostQuantizeVProblem& p) { p.v_out.seqlen = 39; },
     "v_out.seqlen = 39 differs from v.shape[1] (seqlen) = 40"},
    {"MisalignedOut",
     [](HostQuantizeVProblem& p) { p.v_out.data = offset_bytes(p.v_out.data, 8); },
     "v_out.data is not 16-byte aligned"},
    {"OutOverlapsV", [](HostQuantizeVProblem& p) { p.v_out.data = p.x.data; },
     "v_out overlaps v in memory"},
    {"OutOverlapsDescale", [](HostQuantizeVProblem& p) { p.v_out.data = p.descale; },
     "descale overlaps v_out in memory"},
    {"VFloat8", [](HostQuantizeVProblem& p) { p.x.dtype = DType::kFloat8E4M3; },
     "v.dtype is float8_e4m3; v must be float16 or bfloat16"},
};

class InvalidQuantizeV : public ::testing::TestWithParam<QuantizeVCase> {};

TEST_P(InvalidQuantizeV, IsRefusedBeforeTouchingMemory) {
  HostQuantizeVProblem p;
  GetParam().mutate(p);
  const Status s = p.call_v();
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, GetParam().message, s.message);
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(Cases, InvalidQuantizeV, ::testing::ValuesIn(kVCases),
                         [](const ::testing::TestParamInfo<QuantizeVCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(QuantizeVCAbi, NullArgsAndAGroupOfRowsAreChecked) {
  EXPECT_EQ(flash3_quantize_fp8_v(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_quantize_fp8_v: args is null",
                      flash3_last_error());
  HostQuantizeVProblem p;
  flash3_quantize_v_args args{};
  args.v = to_c_args(p.x, p.x_fp8, p.descale, p.options).x;
  args.v_out = {p.v_out.data, p.v_out.batch, p.v_out.seqlen, p.v_out.heads, p.v_out.headdim};
  args.descale = p.descale;
  args.block_rows = 24;
  EXPECT_EQ(flash3_quantize_fp8_v(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "options.block_rows = 24 must be a multiple of 16",
                      flash3_last_error());
  EXPECT_TRUE(p.untouched());
}

TEST(ValidQuantizeV, PassesValidation) {
  for (const int block_rows : {16, 48, 40, 1000}) {  // whole groups, or one block a head
    HostQuantizeVProblem p;
    p.options.block_rows = block_rows;
    const Status s = p.call_v();
    const StatusCode expected = cuda_device_count() > 0 ? Code::kInvalidArgument : Code::kNoDevice;
    EXPECT_EQ(s.code, expected) << block_rows << ": " << s.message;
    EXPECT_TRUE(p.untouched());
  }
}

}  // namespace
}  // namespace flash3::test
