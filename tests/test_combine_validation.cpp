// Every argument check of flash3::combine, through the C++ API and the C
// ABI: each invalid call is refused with the right code, a message naming
// the bad argument, and its buffers left as they were; valid calls (odd
// head dims, unaligned rows, broadcast inputs, no lse) and empty problems
// get past validation.
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "invalid_case.hpp"

namespace flash3::test {
namespace {

using Code = StatusCode;

// A valid combine: 3 splits of batch 2, seqlen 5, heads 4, headdim 64;
// out_partial contiguous, lse_partial seqlen-contiguous and lse (batch,
// heads, seqlen) transposed, as FlashAttention-3 lays them out; out bf16.
struct HostCombineProblem {
  static constexpr int64_t kSplits = 3;
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kSeqlen = 5;
  static constexpr int64_t kHeads = 4;
  static constexpr int64_t kHeadDim = 64;
  // Room for every case's reshaped arrays (head dim 1024 included), so their
  // spans stay inside.
  static constexpr size_t kBufferBytes = kSplits * kBatch * kSeqlen * kHeads * 1024 * 4;

  HostCombineProblem() { set_headdim(kHeadDim); }
  HostCombineProblem(const HostCombineProblem&) = delete;
  HostCombineProblem& operator=(const HostCombineProblem&) = delete;

  PoisonedBuffer out_partial_buffer{kBufferBytes}, lse_partial_buffer{kBufferBytes},
      out_buffer{kBufferBytes}, lse_buffer{kBufferBytes};
  CombineArgs args;

  // Every array dense at this head dim (out_partial, out) and in the layout above.
  void set_headdim(int64_t d) {
    constexpr int64_t s = kSeqlen, h = kHeads;
    args.out_partial = reinterpret_cast<const float*>(out_partial_buffer.data());
    args.out_partial_shape = {kSplits, kBatch, s, h, d};
    args.out_partial_stride = {kBatch * s * h * d, s * h * d, h * d, d, 1};
    args.lse_partial = reinterpret_cast<const float*>(lse_partial_buffer.data());
    args.lse_partial_stride = {kBatch * s * h, s * h, 1, s};
    args.out = Tensor::contiguous(out_buffer.data(), DType::kBFloat16, kBatch, s, h, d);
    args.lse = reinterpret_cast<float*>(lse_buffer.data());
    args.lse_stride = {h * s, 1, s};
  }

  // batch, seqlen, heads of every array (out's shape too), strides kept.
  void set_rows(int64_t batch, int64_t seqlen, int64_t heads) {
    args.out_partial_shape[1] = args.out.shape[0] = batch;
    args.out_partial_shape[2] = args.out.shape[1] = seqlen;
    args.out_partial_shape[3] = args.out.shape[2] = heads;
  }

  Status call() const { return flash3::combine(args, nullptr); }

  flash3_combine_args c_args() const {
    flash3_combine_args c{};
    c.out_partial = args.out_partial;
    c.lse_partial = args.lse_partial;
    c.out = to_c(args.out);
    c.lse = args.lse;
    for (int i = 0; i < 5; ++i) {
      c.out_partial_shape[i] = args.out_partial_shape[i];
      c.out_partial_stride[i] = args.out_partial_stride[i];
    }
    for (int i = 0; i < 4; ++i) {
      c.lse_partial_stride[i] = args.lse_partial_stride[i];
    }
    for (int i = 0; i < 3; ++i) {
      c.lse_stride[i] = args.lse_stride[i];
    }
    return c;
  }
  flash3_status c_call() const {
    const flash3_combine_args c = c_args();
    return flash3_combine(&c, nullptr);
  }

  bool untouched() const {
    return out_partial_buffer.untouched() && lse_partial_buffer.untouched() &&
           out_buffer.untouched() && lse_buffer.untouched();
  }
};

using P = HostCombineProblem;

constexpr int64_t kOver2To31 = int64_t{1} << 31;
constexpr int kUnknownDtype = 9;

const float* floats_at(const void* base, size_t bytes) {
  return reinterpret_cast<const float*>(static_cast<const unsigned char*>(base) + bytes);
}

float* floats_at(void* base, size_t bytes) {
  return reinterpret_cast<float*>(offset_bytes(base, bytes));
}

using InvalidCombineCase = InvalidCase<P>;

const InvalidCombineCase kCases[] = {
    {"NullOutPartial", [](P& p) { p.args.out_partial = nullptr; }, Code::kInvalidArgument,
     "flash3::combine: out_partial is null"},
    {"NullLsePartial", [](P& p) { p.args.lse_partial = nullptr; }, Code::kInvalidArgument,
     "lse_partial is null"},
    {"NullOut", [](P& p) { p.args.out.data = nullptr; }, Code::kInvalidArgument,
     "out.data is null"},
    {"ZeroSplits", [](P& p) { p.args.out_partial_shape[0] = 0; }, Code::kInvalidArgument,
     "out_partial_shape[0] (num_splits) = 0 must be at least 1"},
    {"NegativeSplits", [](P& p) { p.args.out_partial_shape[0] = -1; }, Code::kInvalidArgument,
     "out_partial_shape[0] (num_splits) = -1 must not be negative"},
    {"NegativeSeqlen", [](P& p) { p.set_rows(P::kBatch, -5, P::kHeads); },
     Code::kInvalidArgument, "out_partial_shape[2] (seqlen) = -5 must not be negative"},
    {"SplitsOver2To31", [](P& p) { p.args.out_partial_shape[0] = kOver2To31; },
     Code::kInvalidArgument, "out_partial_shape[0] (num_splits) = 2147483648 exceeds 2^31-1"},
    {"ZeroHeadDim", [](P& p) { p.set_headdim(0); }, Code::kInvalidArgument,
     "out_partial_shape[4] (headdim) = 0 must be at least 1"},
    {"HeadDim1025", [](P& p) { p.set_headdim(1025); }, Code::kUnsupported,
     "out_partial_shape[4] (headdim) = 1025 is not supported; combine takes head dims up to "
     "1024"},
    {"RowsOver2To31", [](P& p) { p.set_rows(1 << 11, 1 << 10, 1 << 10); },
     Code::kInvalidArgument, "batch * seqlen * heads = 2147483648 rows exceeds 2^31-1"},
    {"UnknownOutDtype", [](P& p) { p.args.out.dtype = static_cast<DType>(kUnknownDtype); },
     Code::kInvalidArgument, "out.dtype has the unknown value 9"},
    {"OutFloat8", [](P& p) { p.args.out.dtype = DType::kFloat8E4M3; }, Code::kInvalidArgument,
     "out.dtype is float8_e4m3; out must be float32, float16 or bfloat16"},
    {"OutShapeDiffers", [](P& p) { p.args.out.shape[1] = 4; }, Code::kInvalidArgument,
     "out.shape (2, 4, 4, 64) differs from out_partial_shape[1:] (2, 5, 4, 64)"},
    {"OutHeadDimDiffers", [](P& p) { p.args.out.shape[3] = 32; }, Code::kInvalidArgument,
     "out.shape (2, 5, 4, 32) differs from out_partial_shape[1:] (2, 5, 4, 64)"},
    {"MisalignedOutPartial",
     [](P& p) { p.args.out_partial = floats_at(p.args.out_partial, 2); },
     Code::kInvalidArgument, "out_partial is not 4-byte aligned"},
    {"MisalignedLsePartial",
     [](P& p) { p.args.lse_partial = floats_at(p.args.lse_partial, 1); },
     Code::kInvalidArgument, "lse_partial is not 4-byte aligned"},
    {"MisalignedOut", [](P& p) { p.args.out.data = offset_bytes(p.args.out.data, 1); },
     Code::kInvalidArgument, "out.data is not 2-byte aligned"},
    {"MisalignedFloat32Out",
     [](P& p) {
       p.args.out.dtype = DType::kFloat32;
       p.args.out.data = offset_bytes(p.args.out.data, 2);
     },
     Code::kInvalidArgument, "out.data is not 4-byte aligned"},
    {"MisalignedLse", [](P& p) { p.args.lse = floats_at(p.args.lse, 2); },
     Code::kInvalidArgument, "lse is not 4-byte aligned"},
    {"OutPartialHeadDimStrided", [](P& p) { p.args.out_partial_stride[4] = 2; },
     Code::kInvalidArgument,
     "out_partial_stride[4] (headdim) = 2 must be 1: the last dimension must be contiguous"},
    {"OutHeadDimStrided", [](P& p) { p.args.out.stride[3] = 2; }, Code::kInvalidArgument,
     "out.stride[3] (headdim) = 2 must be 1"},
    {"NegativeOutPartialStride", [](P& p) { p.args.out_partial_stride[1] = -64; },
     Code::kInvalidArgument, "out_partial_stride[1] (batch) = -64 must not be negative"},
    {"NegativeLsePartialStride", [](P& p) { p.args.lse_partial_stride[0] = -1; },
     Code::kInvalidArgument, "lse_partial_stride[0] (num_splits) = -1 must not be negative"},
    {"NegativeOutStride", [](P& p) { p.args.out.stride[2] = -64; }, Code::kInvalidArgument,
     "out.stride[2] (heads) = -64 must not be negative"},
    {"NegativeLseStride", [](P& p) { p.args.lse_stride[1] = -1; }, Code::kInvalidArgument,
     "lse_stride[1] (seqlen) = -1 must not be negative"},
    {"OutPartialPastAddressSpace",
     [](P& p) { p.args.out_partial = reinterpret_cast<const float*>(~uintptr_t{0xF}); },
     Code::kInvalidArgument,
     "out_partial: shape and strides address past the end of the address space"},
    {"LsePartialPastAddressSpace",
     [](P& p) { p.args.lse_partial_stride[0] = std::numeric_limits<int64_t>::max() / 2; },
     Code::kInvalidArgument,
     "lse_partial: shape and strides address past the end of the address space"},
    {"OutPastAddressSpace",
     [](P& p) { p.args.out.data = reinterpret_cast<void*>(~uintptr_t{0xF}); },
     Code::kInvalidArgument, "out: shape and strides address past the end of the address space"},
    {"LsePastAddressSpace", [](P& p) { p.args.lse = reinterpret_cast<float*>(~uintptr_t{0xF}); },
     Code::kInvalidArgument, "lse: shape and strides address past the end of the address space"},
    {"OutOverlapsItself", [](P& p) { p.args.out.stride[1] = P::kHeadDim; },
     Code::kInvalidArgument, "out's strides make elements overlap; out must not alias itself"},
    {"OutBroadcastOverBatch", [](P& p) { p.args.out.stride[0] = 0; }, Code::kInvalidArgument,
     "out's strides make elements overlap"},
    {"LseOverlapsItself", [](P& p) { p.args.lse_stride[2] = 0; }, Code::kInvalidArgument,
     "lse's strides make elements overlap; lse must not alias itself"},
    {"OutAliasesOutPartial", [](P& p) { p.args.out.data = const_cast<float*>(p.args.out_partial); },
     Code::kInvalidArgument,
     "out overlaps out_partial in memory; the outputs must not alias the inputs or each other"},
    {"OutOverlapsLsePartial",
     [](P& p) { p.args.out.data = const_cast<float*>(floats_at(p.args.lse_partial, 64)); },
     Code::kInvalidArgument, "out overlaps lse_partial in memory"},
    {"LseInsideOutPartial",
     [](P& p) { p.args.lse = const_cast<float*>(floats_at(p.args.out_partial, 4096)); },
     Code::kInvalidArgument, "lse overlaps out_partial in memory"},
    {"LseAliasesLsePartial", [](P& p) { p.args.lse = const_cast<float*>(p.args.lse_partial); },
     Code::kInvalidArgument, "lse overlaps lse_partial in memory"},
    {"LseInsideOut", [](P& p) { p.args.lse = floats_at(p.args.out.data, 256); },
     Code::kInvalidArgument, "lse overlaps out in memory"},
};

class InvalidCombine : public ::testing::TestWithParam<InvalidCombineCase> {};

TEST_P(InvalidCombine, IsRefusedBeforeTouchingMemory) { expect_refused(GetParam()); }

TEST_P(InvalidCombine, IsRefusedThroughTheCAbi) { expect_refused_through_c_abi(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, InvalidCombine, ::testing::ValuesIn(kCases), CaseName{});

TEST(CombineCAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_combine(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_combine: args is null",
                      flash3_last_error());
}

TEST(CombineCAbi, ZeroInitializedArgsNameTheSplits) {
  const flash3_combine_args args{};
  EXPECT_EQ(flash3_combine(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "flash3::combine: out_partial_shape[0] (num_splits) = 0 must be at least 1",
                      flash3_last_error());
}

// Valid calls get past validation: without a GPU they stop at the device
// check; with one, at the pointer check (these are host buffers).
class ValidCombine : public ::testing::TestWithParam<void (*)(P&)> {};

TEST_P(ValidCombine, PassesValidation) {
  P p;
  GetParam()(p);
  const Status s = p.call();
  const StatusCode expected = cuda_device_count() > 0 ? Code::kInvalidArgument : Code::kNoDevice;
  EXPECT_EQ(s.code, expected) << s.message;
  const char* expected_message =
      cuda_device_count() > 0 ? "out_partial is not device memory" : "no usable CUDA device";
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected_message, s.message);
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidCombine,
    ::testing::Values(
        [](P&) {},                                             // bf16 out, FA3's layouts
        [](P& p) { p.args.out.dtype = DType::kFloat32; },      // float32 out
        [](P& p) { p.args.out.dtype = DType::kFloat16; },      // float16 out
        [](P& p) { p.args.lse = nullptr; },                    // no lse
        [](P& p) { p.args.out_partial_shape[0] = 1; },         // one split
        [](P& p) { p.set_headdim(59); },                       // the scalar path's head dim
        [](P& p) { p.set_headdim(1024); },                     // the widest
        [](P& p) {                                             // rows at odd addresses
          p.args.out.data = offset_bytes(p.args.out.data, 2);
          p.args.out_partial = floats_at(p.args.out_partial, 4);
        },
        [](P& p) {  // a head dim of 1: its stride is never used
          p.set_headdim(1);
          p.args.out_partial_stride[4] = 7;
          p.args.out.stride[3] = -3;
        },
        [](P& p) {  // size-1 dimensions may carry any stride
          p.args.out_partial_shape[0] = 1;
          p.args.out_partial_stride[0] = -5;
          p.args.lse_partial_stride[0] = -5;
          p.set_rows(1, P::kSeqlen, P::kHeads);
          p.args.out.stride[0] = -1;
          p.args.lse_stride[0] = -1;
        },
        [](P& p) {  // inputs broadcast over the splits (stride 0): reads may repeat
          p.args.out_partial_stride[0] = 0;
          p.args.lse_partial_stride = {0, 0, 0, 0};
        },
        [](P& p) {  // out every other row of a larger tensor, lse contiguous
          const int64_t row = 2 * P::kHeads * P::kHeadDim;
          p.args.out.stride = {P::kSeqlen * row, row, P::kHeadDim, 1};
          p.args.lse_stride = {P::kSeqlen * P::kHeads, P::kHeads, 1};
        }));

// Nothing to do: launched nowhere, the pointers may be null, and the call
// succeeds where there is a Hopper GPU (without one it still says so).
class EmptyCombine : public ::testing::TestWithParam<void (*)(P&)> {};

TEST_P(EmptyCombine, SucceedsWithoutTouchingMemory) {
  P p;
  GetParam()(p);
  const Status s = p.call();
  EXPECT_TRUE(s.ok() || s.code == Code::kNoDevice) << s.message;
  if (cuda_device_count() == 0) {
    EXPECT_EQ(s.code, Code::kNoDevice) << s.message;
  }
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EmptyCombine,
    ::testing::Values([](P& p) { p.set_rows(0, P::kSeqlen, P::kHeads); },
                      [](P& p) { p.set_rows(P::kBatch, 0, P::kHeads); },
                      [](P& p) { p.set_rows(P::kBatch, P::kSeqlen, 0); },
                      [](P& p) {  // PyTorch's empty tensors have no data
                        p.set_rows(P::kBatch, 0, P::kHeads);
                        p.args.out_partial = nullptr;
                        p.args.lse_partial = nullptr;
                        p.args.out.data = nullptr;
                        p.args.lse = nullptr;
                      }));

}  // namespace
}  // namespace flash3::test
