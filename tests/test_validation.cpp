// Every argument check of flash3::forward, through the C++ API and the C ABI:
// each invalid call is refused with the right code, a message naming the bad
// argument, and its buffers left as they were.
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <utility>

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
    {"HeadDim80", [](HostProblem& p) { set_headdim_all(p, 80); }, Code::kUnsupported,
     "headdim = 80 is not supported; supported: 64, 96, 128, 192, 256"},
    {"HeadDim32", [](HostProblem& p) { set_headdim_all(p, 32); }, Code::kUnsupported,
     "headdim = 32 is not supported"},
    {"HeadDimMismatch", [](HostProblem& p) { set_headdim(p.k, 128); }, Code::kInvalidArgument,
     "k.shape[3] (headdim) = 128 differs"},
    // v (and out) of a head dim of their own: 128 beside 192, 256 beside 64.
    {"ValueHeadDim128Beside64",
     [](HostProblem& p) {
       set_headdim(p.v, 128);
       set_headdim(p.out, 128);
     },
     Code::kUnsupported,
     "v.shape[3] (headdim) = 128 differs from q's 64; v's head dim beside q's 64 must be one of "
     "64, 256"},
    {"ValueHeadDimBeside128",
     [](HostProblem& p) {
       set_headdim_all(p, 128);
       set_headdim(p.v, 64);
       set_headdim(p.out, 64);
     },
     Code::kUnsupported, "v's head dim beside q's 128 must be one of 128"},
    {"ValueHeadDim64Beside192",
     [](HostProblem& p) {
       set_headdim(p.q, 192);
       set_headdim(p.k, 192);
     },
     Code::kUnsupported, "v's head dim beside q's 192 must be one of 192, 128"},
    {"OutHeadDimNotVs",
     [](HostProblem& p) {
       set_headdim_all(p, 192);
       set_headdim(p.v, 128);
     },
     Code::kInvalidArgument, "out.shape[3] (headdim) = 192 differs from v's 128"},
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
    {"MisalignedSinks",
     [](HostProblem& p) { p.options.sinks = static_cast<const float*>(offset_bytes(p.k.data, 2)); },
     Code::kInvalidArgument, "options.sinks is not 4-byte aligned"},
    {"WindowBelowMinusOne", [](HostProblem& p) { p.options.window_left = -2; },
     Code::kInvalidArgument, "options.window_left, window_right = (-2, -1)"},
    {"NegativeChunk", [](HostProblem& p) { p.options.attention_chunk = -1; },
     Code::kInvalidArgument, "options.attention_chunk = -1"},
    {"NegativeSoftcap", [](HostProblem& p) { p.options.softcap = -1.0f; },
     Code::kInvalidArgument, "options.softcap = -1 must be finite"},
    {"SinksOverlapOut",
     [](HostProblem& p) { p.options.sinks = static_cast<const float*>(p.out.data); },
     Code::kInvalidArgument, "options.sinks overlaps out"},
    {"SinksOverlapLse", [](HostProblem& p) { p.options.sinks = p.lse; }, Code::kInvalidArgument,
     "options.sinks overlaps softmax_lse"},
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

// Sinks read from an input's memory pass (inputs may alias each other).
TEST(ValidForward, SinksApartFromTheOutputsPass) {
  HostProblem p;
  p.options.sinks = static_cast<const float*>(p.k.data);
  const Status s = p.call();
  EXPECT_TRUE(s.code == Code::kNoDevice || s.message.find("is not device memory") != std::string::npos)
      << s.message;
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
  for (const int64_t headdim : {64, 128, 192, 256}) {
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
  Tensor q = Tensor::contiguous(far_address(1), DType::kBFloat16, 2, 1000, 8, 80);
  Status s = flash3::forward_workspace_size(q, &bytes);
  EXPECT_EQ(s.code, Code::kUnsupported) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::forward_workspace_size: headdim = 80",
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

namespace flash3::test {
namespace {

// forward_varlen: the forward's checks on packed (batch 1) tensors, then the
// varlen description's own.
struct VarlenProblem : HostProblem {
  int cu_q[3] = {0, 3, 8};
  int cu_k[3] = {0, 10, 16};
  Varlen varlen{cu_q, cu_k, 2, 5};
  VarlenProblem() {
    set_dims(q, 1, 8, kHeadsQ, kHeadDim);
    set_dims(out, 1, 8, kHeadsQ, kHeadDim);
    set_dims(k, 1, 16, kHeadsK, kHeadDim);
    set_dims(v, 1, 16, kHeadsK, kHeadDim);
  }
  Status call_varlen() const { return flash3::forward_varlen(q, k, v, out, lse, varlen, options); }
};

void expect_varlen_refused(const VarlenProblem& p, Code code, const std::string& message) {
  const Status s = p.call_varlen();
  EXPECT_EQ(s.code, code) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::forward_varlen: " + message, s.message);
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardVarlen, ValidArgumentsReachTheDevice) {
  VarlenProblem p;
  // max_seqlen_q is an upper bound: past total_q it is taken as total_q.
  p.varlen.max_seqlen_q = 100;
  int used[2] = {2, 9};
  p.varlen.seqused_q = used;
  p.varlen.seqused_k = used;
  const Status s = p.call_varlen();
  // Past validation: no device here, or host pointers on a GPU machine.
  EXPECT_TRUE(s.code == Code::kNoDevice ||
              s.message.find("is not device memory") != std::string::npos)
      << s.message;
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardVarlen, TheCAbiRefusesAsTheCppApi) {
  VarlenProblem p;
  p.varlen.max_seqlen_q = 0;
  flash3_forward_varlen_args args{};
  args.forward = p.c_args();
  args.cu_seqlens_q = p.varlen.cu_seqlens_q;
  args.cu_seqlens_k = p.varlen.cu_seqlens_k;
  args.batch = p.varlen.batch;
  args.max_seqlen_q = p.varlen.max_seqlen_q;
  EXPECT_EQ(flash3_forward_varlen(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "flash3::forward_varlen: varlen.max_seqlen_q = 0 must be at least 1",
                      flash3_last_error());
  EXPECT_EQ(flash3_forward_varlen(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardVarlen, RefusesBadDescriptions) {
  {
    VarlenProblem p;
    set_dims(p.q, 2, 4, VarlenProblem::kHeadsQ, VarlenProblem::kHeadDim);
    expect_varlen_refused(p, Code::kInvalidArgument, "q.shape[0] = 2: a varlen batch is packed");
  }
  {
    VarlenProblem p;
    p.varlen.batch = 0;
    expect_varlen_refused(p, Code::kInvalidArgument, "varlen.batch = 0 must be at least 1");
  }
  {
    VarlenProblem p;
    p.varlen.cu_seqlens_k = nullptr;
    expect_varlen_refused(p, Code::kInvalidArgument, "varlen.cu_seqlens_k is null");
  }
  {
    VarlenProblem p;
    p.varlen.cu_seqlens_q = reinterpret_cast<const int*>(reinterpret_cast<const char*>(p.cu_q) + 2);
    expect_varlen_refused(p, Code::kInvalidArgument, "varlen.cu_seqlens_q is not 4-byte aligned");
  }
  {
    VarlenProblem p;
    p.varlen.max_seqlen_q = 0;
    expect_varlen_refused(p, Code::kInvalidArgument, "varlen.max_seqlen_q = 0 must be at least 1");
  }
  {
    VarlenProblem p;
    p.varlen.seqused_k = reinterpret_cast<const int*>(reinterpret_cast<const char*>(p.cu_k) + 1);
    expect_varlen_refused(p, Code::kInvalidArgument, "varlen.seqused_k is not 4-byte aligned");
  }
  {
    // Offsets the kernels read while they write out: a store there could hang them.
    VarlenProblem p;
    p.varlen.cu_seqlens_k = reinterpret_cast<const int*>(p.out.data) + 3;
    expect_varlen_refused(p, Code::kInvalidArgument,
                          "varlen.cu_seqlens_k overlaps out; the call writes there");
  }
  {
    VarlenProblem p;
    p.varlen.seqused_q = reinterpret_cast<const int*>(p.lse) + 1;
    expect_varlen_refused(p, Code::kInvalidArgument, "varlen.seqused_q overlaps softmax_lse");
  }
  {
    VarlenProblem p;
    set_dims(p.q, 1, 8, VarlenProblem::kHeadsQ, 80);
    expect_varlen_refused(p, Code::kUnsupported, "headdim = 80 is not supported");
  }
}

}  // namespace
}  // namespace flash3::test

namespace flash3::test {
namespace {

// forward_kvcache: the forward's checks (k and v with a batch of their own
// when cache_batch_idx is given), then the cache's description.
struct KvCacheProblem : HostProblem {
  int seqlens[kBatch] = {3, 16};
  int batch_idx[kBatch] = {2, 0};
  int page_table[kBatch] = {1, 0};  // one page of kSeqlenK rows per batch
  int leftpad[kBatch] = {1, 4};
  KvCache cache{seqlens, nullptr};
  void use_pages() {
    cache.page_table = page_table;
    cache.pages_per_batch = 1;
  }
  Status call_kvcache() const {
    return flash3::forward_kvcache(q, k, v, out, lse, cache, options);
  }
};

void expect_kvcache_refused(const KvCacheProblem& p, Code code, const std::string& message) {
  const Status s = p.call_kvcache();
  EXPECT_EQ(s.code, code) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::forward_kvcache: " + message, s.message);
  EXPECT_TRUE(p.untouched());
}

void expect_reaches_the_device(const Status& s) {
  // Past validation: no device here, or host pointers on a GPU machine.
  EXPECT_TRUE(s.code == Code::kNoDevice ||
              s.message.find("is not device memory") != std::string::npos)
      << s.message;
}

// v and out of a head dim of their own beside q's and k's (DeepSeek's (192,
// 128), FlashAttention-3's (64, 256)), dense and from a KV cache.
TEST(ValidForward, ValueHeadDimsOfTheirOwnReachTheDevice) {
  for (const auto& [d, dv] : {std::pair{192, 128}, std::pair{64, 256}}) {
    SCOPED_TRACE(std::to_string(d) + ", " + std::to_string(dv));
    KvCacheProblem p;
    set_headdim(p.q, d);
    set_headdim(p.k, d);
    set_headdim(p.v, dv);
    set_headdim(p.out, dv);
    expect_reaches_the_device(p.call());
    expect_reaches_the_device(p.call_kvcache());
    EXPECT_TRUE(p.untouched());
  }
}

TEST(ForwardKvCache, ValidArgumentsReachTheDevice) {
  KvCacheProblem p;
  expect_reaches_the_device(p.call_kvcache());
  // With cache_batch_idx, a cache of more batches than q's.
  p.cache.cache_batch_idx = p.batch_idx;
  set_dims(p.k, 3, KvCacheProblem::kSeqlenK, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
  set_dims(p.v, 3, KvCacheProblem::kSeqlenK, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
  expect_reaches_the_device(p.call_kvcache());
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardKvCache, ValidPagedArgumentsReachTheDevice) {
  KvCacheProblem p;
  p.use_pages();
  expect_reaches_the_device(p.call_kvcache());
  // cache_batch_idx picks page table rows: here a table of one row.
  p.cache.cache_batch_idx = p.batch_idx;
  p.cache.page_table_rows = 1;
  expect_reaches_the_device(p.call_kvcache());
  p.cache.cache_batch_idx = nullptr;
  p.cache.page_table_rows = 0;
  // A pool of more pages than q's batches, two pages a batch.
  set_dims(p.k, 1, KvCacheProblem::kSeqlenK * 2, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
  set_dims(p.v, 1, KvCacheProblem::kSeqlenK * 2, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
  p.cache.pages_per_batch = 1;
  expect_reaches_the_device(p.call_kvcache());
  EXPECT_TRUE(p.untouched());
}

// cache_leftpad: contiguous caches only, an aligned array apart from what
// the call writes.
TEST(ForwardKvCache, LeftPaddingIsCheckedLikeTheOtherArrays) {
  KvCacheProblem p;
  p.cache.cache_leftpad = p.leftpad;
  expect_reaches_the_device(p.call_kvcache());
  p.use_pages();
  expect_kvcache_refused(p, Code::kUnsupported, "cache.cache_leftpad with a paged cache");
  KvCacheProblem q;
  q.cache.cache_leftpad = reinterpret_cast<const int*>(reinterpret_cast<const char*>(q.leftpad) + 1);
  expect_kvcache_refused(q, Code::kInvalidArgument, "cache.cache_leftpad is not 4-byte aligned");
  KvCacheProblem r;
  r.cache.cache_leftpad = static_cast<const int*>(r.out.data);
  expect_kvcache_refused(r, Code::kInvalidArgument, "cache.cache_leftpad overlaps out");
}

TEST(ForwardKvCache, RefusesBadPages) {
  {
    KvCacheProblem p;  // pages of 8 rows: 4 of them in the same buffer
    p.use_pages();
    set_dims(p.k, 4, 8, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
    set_dims(p.v, 4, 8, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
    expect_kvcache_refused(p, Code::kUnsupported,
                           "k_cache.shape[1] (page size) = 8: paged caches take page sizes "
                           "that are multiples of 16");
  }
  {
    KvCacheProblem p;  // without cache_batch_idx, one page table row per batch
    p.use_pages();
    p.cache.page_table_rows = 1;
    expect_kvcache_refused(p, Code::kInvalidArgument,
                           "cache.page_table_rows = 1: the page table has one row per batch (2) "
                           "unless cache.cache_batch_idx picks the rows");
  }
  {
    KvCacheProblem p;
    p.use_pages();
    p.cache.pages_per_batch = 0;
    expect_kvcache_refused(p, Code::kInvalidArgument,
                           "cache.pages_per_batch = 0 must be at least 1 with a page_table");
  }
  {
    KvCacheProblem p;
    p.cache.pages_per_batch = 3;
    expect_kvcache_refused(p, Code::kInvalidArgument,
                           "cache.pages_per_batch = 3 and cache.page_table_rows = 0 without a "
                           "cache.page_table (both must be 0)");
  }
  {
    KvCacheProblem p;
    p.use_pages();
    p.cache.pages_per_batch = 1 << 30;
    expect_kvcache_refused(p, Code::kInvalidArgument, "cache.pages_per_batch = 1073741824: the capacity");
  }
  {
    KvCacheProblem p;
    p.use_pages();
    p.cache.page_table = reinterpret_cast<const int*>(p.lse);
    expect_kvcache_refused(p, Code::kInvalidArgument, "cache.page_table overlaps softmax_lse");
  }
}

// kvcache_append: new rows k_new / v_new (batch 2, 3 rows) into the cache
// (k, v), q rotated into q_rotated with tables of 16 rows (the capacity) of
// rotary_dim / 2 = 16 entries.
struct KvAppendProblem : KvCacheProblem {
  PoisonedBuffer new_buffer{kBufferBytes}, rotated_buffer{kBufferBytes}, table_buffer{kBufferBytes};
  int seqlens_out[kBatch] = {};
  KvCacheAppend append = make_append();
  KvCacheAppend make_append() {
    KvCacheAppend a;
    a.k_new = Tensor::contiguous(new_buffer.data(), DType::kBFloat16, kBatch, 3, kHeadsK, kHeadDim);
    a.v_new = Tensor::contiguous(offset_bytes(new_buffer.data(), 4096), DType::kBFloat16, kBatch, 3,
                                 kHeadsK, kHeadDim);
    a.q_rotated = Tensor::contiguous(rotated_buffer.data(), DType::kBFloat16, kBatch, kSeqlenQ,
                                     kHeadsQ, kHeadDim);
    a.rotary_cos = table_buffer.data();
    a.rotary_sin = offset_bytes(table_buffer.data(), 1024);
    a.rotary_rows = static_cast<int>(kSeqlenK);
    a.rotary_dim = 32;
    a.seqlens_out = seqlens_out;
    return a;
  }
  Status call_append() const { return flash3::kvcache_append(q, k, v, cache, append); }
};

void expect_append_refused(const KvAppendProblem& p, Code code, const std::string& message) {
  const Status s = p.call_append();
  EXPECT_EQ(s.code, code) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::kvcache_append: " + message, s.message);
  EXPECT_TRUE(p.untouched() && p.new_buffer.untouched() && p.rotated_buffer.untouched());
}

TEST(KvCacheAppend, ValidArgumentsReachTheDevice) {
  KvAppendProblem p;
  expect_reaches_the_device(p.call_append());
  p.append.rotary_cos = p.append.rotary_sin = nullptr;  // no rotary: q_rotated unused
  p.append.rotary_dim = 0;
  p.append.q_rotated = Tensor{};
  expect_reaches_the_device(p.call_append());
  p.use_pages();
  expect_reaches_the_device(p.call_append());
}

// The append's v_new and v_cache of head dim 128 beside q's 192: v_new's
// head dim is v_cache's.
TEST(KvCacheAppend, ValueHeadDimOfItsOwn) {
  KvAppendProblem p;
  for (Tensor* t : {&p.q, &p.k, &p.append.k_new, &p.append.q_rotated}) {
    set_headdim(*t, 192);
  }
  p.append.v_new.data = offset_bytes(p.new_buffer.data(), 8192);
  for (Tensor* t : {&p.v, &p.append.v_new}) {
    set_headdim(*t, 128);
  }
  expect_reaches_the_device(p.call_append());
  set_headdim(p.append.v_new, 192);
  expect_append_refused(p, Code::kInvalidArgument,
                        "append.v_new.shape[3] (headdim) = 192 differs from v_cache's 128");
  set_headdim(p.append.v_new, 128);
  set_headdim(p.v, 64);
  expect_append_refused(p, Code::kUnsupported,
                        "v_cache.shape[3] (headdim) = 64 differs from q's 192");
}

TEST(KvCacheAppend, RefusesBadArguments) {
  {
    KvAppendProblem p;  // every tensor FP8: refused as unsupported, naming the first
    for (Tensor* t : {&p.q, &p.k, &p.v, &p.append.k_new, &p.append.v_new}) {
      t->dtype = DType::kFloat8E4M3;
    }
    expect_append_refused(p, Code::kUnsupported, "q.dtype is float8_e4m3");
  }
  {
    KvAppendProblem p;
    p.append.k_new.dtype = DType::kFloat16;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.k_new.dtype (float16) differs from q.dtype (bfloat16)");
  }
  {
    KvAppendProblem p;
    set_dims(p.append.k_new, 1, 3, KvAppendProblem::kHeadsK, KvAppendProblem::kHeadDim);
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.k_new.shape[0] (batch) = 1 differs from q's 2");
  }
  {
    KvAppendProblem p;
    set_dims(p.append.v_new, 2, 2, KvAppendProblem::kHeadsK, KvAppendProblem::kHeadDim);
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.v_new.shape[1] = 2 differs from append.k_new's 3");
  }
  {
    KvAppendProblem p;
    p.append.rotary_sin = nullptr;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.rotary_sin is null while the other rotary table is given");
  }
  {
    KvAppendProblem p;
    p.append.rotary_dim = 31;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.rotary_dim = 31 must be even and in [2, headdim = 64]");
  }
  {
    KvAppendProblem p;
    p.append.rotary_rows = 15;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.rotary_rows = 15 must cover every position of the cache");
  }
  {
    KvAppendProblem p;
    p.append.q_rotated = Tensor{};
    expect_append_refused(p, Code::kInvalidArgument, "append.q_rotated");
  }
  {
    KvAppendProblem p;
    p.append.seqlens_out = nullptr;
    expect_append_refused(p, Code::kInvalidArgument, "append.seqlens_out is null");
  }
  {
    KvAppendProblem p;
    p.append.rotary_seqlens = p.seqlens_out;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.seqlens_out overlaps append.rotary_seqlens");
    p.append.rotary_cos = p.append.rotary_sin = nullptr;
    p.append.rotary_dim = 0;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.rotary_seqlens is given without rotary tables");
  }
  {
    KvAppendProblem p;
    p.append.seqlens_out = p.seqlens;
    expect_append_refused(p, Code::kInvalidArgument,
                          "append.seqlens_out overlaps cache.cache_seqlens");
  }
  {
    KvAppendProblem p;
    p.append.k_new.data = p.k.data;
    expect_append_refused(p, Code::kInvalidArgument, "k_cache overlaps append.k_new");
  }
  {
    KvAppendProblem p;
    p.append.q_rotated.data = p.q.data;
    expect_append_refused(p, Code::kInvalidArgument, "append.q_rotated overlaps q");
  }
  {
    KvAppendProblem p;
    p.use_pages();
    set_dims(p.k, 4, 8, KvAppendProblem::kHeadsK, KvAppendProblem::kHeadDim);
    set_dims(p.v, 4, 8, KvAppendProblem::kHeadsK, KvAppendProblem::kHeadDim);
    expect_append_refused(p, Code::kUnsupported, "k_cache.shape[1] (page size) = 8");
  }
}

TEST(KvCacheAppend, TheCAbiRefusesAsTheCppApi) {
  KvAppendProblem p;
  flash3_kvcache_append_args args{};
  EXPECT_EQ(flash3_kvcache_append(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::kvcache_append: ", flash3_last_error());
  EXPECT_EQ(flash3_kvcache_append(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_kvcache_append: args is null",
                      flash3_last_error());
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardKvCache, TheCAbiRefusesAsTheCppApi) {
  KvCacheProblem p;
  flash3_forward_kvcache_args args{};
  args.forward = p.c_args();
  args.cache_seqlens = nullptr;
  EXPECT_EQ(flash3_forward_kvcache(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "flash3::forward_kvcache: cache.cache_seqlens is null", flash3_last_error());
  EXPECT_EQ(flash3_forward_kvcache(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(p.untouched());
}

TEST(ForwardKvCache, RefusesBadDescriptions) {
  {
    KvCacheProblem p;
    p.cache.cache_seqlens = nullptr;
    expect_kvcache_refused(p, Code::kInvalidArgument, "cache.cache_seqlens is null");
  }
  {
    KvCacheProblem p;
    p.cache.cache_batch_idx =
        reinterpret_cast<const int*>(reinterpret_cast<const char*>(p.batch_idx) + 2);
    expect_kvcache_refused(p, Code::kInvalidArgument,
                           "cache.cache_batch_idx is not 4-byte aligned");
  }
  {
    // Without cache_batch_idx the cache has q's batches.
    KvCacheProblem p;
    set_dims(p.k, 3, KvCacheProblem::kSeqlenK, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
    set_dims(p.v, 3, KvCacheProblem::kSeqlenK, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
    expect_kvcache_refused(p, Code::kInvalidArgument, "k.shape[0] (batch) = 3 differs from q's 2");
  }
  {
    KvCacheProblem p;
    p.cache.cache_batch_idx = p.batch_idx;
    set_dims(p.k, 3, KvCacheProblem::kSeqlenK, KvCacheProblem::kHeadsK, KvCacheProblem::kHeadDim);
    expect_kvcache_refused(p, Code::kInvalidArgument, "v.shape[0] (batch) = 2 differs from k's 3");
  }
  {
    KvCacheProblem p;
    p.cache.cache_seqlens = reinterpret_cast<const int*>(p.lse) + 5;
    expect_kvcache_refused(p, Code::kInvalidArgument, "cache.cache_seqlens overlaps softmax_lse");
  }
}

}  // namespace
}  // namespace flash3::test
