// Every argument check of flash3::backward and flash3::backward_workspace_size,
// through the C++ API and the C ABI: each invalid call is refused with the
// right code, a message naming the bad argument, and its buffers left as
// they were; and the workspace size's growth.
#include <cmath>
#include <cstddef>
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
constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
// Just past TMA's 2^40-byte stride limit, in bf16 elements.
constexpr int64_t kOver2To40Bytes = (int64_t{1} << 39) + 8;
constexpr int64_t kLseRowsLimitSide = int64_t{1} << 16;  // its square exceeds 2^31-1
constexpr size_t kWorkspaceAlign = 256;
constexpr int kUnknownDtype = 7;

void* align_up(void* p, size_t alignment) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((a + alignment - 1) / alignment * alignment);
}

flash3_backward_args to_c_args(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const float* softmax_lse,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const BackwardOptions& options) {
  flash3_backward_args args{};
  args.dout = to_c(dout);
  args.q = to_c(q);
  args.k = to_c(k);
  args.v = to_c(v);
  args.out = to_c(out);
  args.softmax_lse = softmax_lse;
  args.dq = to_c(dq);
  args.dk = to_c(dk);
  args.dv = to_c(dv);
  args.workspace = options.workspace;
  args.workspace_bytes = options.workspace_bytes;
  args.softmax_scale = options.softmax_scale;
  args.causal = options.causal ? 1 : 0;
  args.deterministic = options.deterministic ? 1 : 0;
  args.sinks = options.sinks;
  args.dsinks = options.dsinks;
  set_c_mask_args(&args, options);
  return args;
}

// A valid backward call over poisoned host buffers: batch 2, seqlen_q 8,
// seqlen_k 16, heads_q 4, heads_k 2 (GQA), headdim 64, bfloat16, causal and
// deterministic, with a caller's workspace (declared larger than needed).
struct HostBackwardProblem {
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kSeqlenQ = 8;
  static constexpr int64_t kSeqlenK = 16;
  static constexpr int64_t kHeadsQ = 4;
  static constexpr int64_t kHeadsK = 2;
  static constexpr int64_t kHeadDim = 64;
  // Room for every case's reshaped tensors, so their spans stay inside.
  static constexpr size_t kBufferBytes = 64 * 1024;
  // More than any case's workspace (head dim 256: about 0.6 MiB).
  static constexpr size_t kWorkspaceBytes = 2 * 1024 * 1024;

  HostBackwardProblem() = default;
  HostBackwardProblem(const HostBackwardProblem&) = delete;
  HostBackwardProblem& operator=(const HostBackwardProblem&) = delete;

  PoisonedBuffer dout_buffer{kBufferBytes}, q_buffer{kBufferBytes}, k_buffer{kBufferBytes},
      v_buffer{kBufferBytes}, out_buffer{kBufferBytes}, lse_buffer{kBufferBytes},
      dq_buffer{kBufferBytes}, dk_buffer{kBufferBytes}, dv_buffer{kBufferBytes},
      workspace_buffer{kWorkspaceBytes + kWorkspaceAlign};

  Tensor q = make(q_buffer, kSeqlenQ, kHeadsQ);
  Tensor k = make(k_buffer, kSeqlenK, kHeadsK);
  Tensor v = make(v_buffer, kSeqlenK, kHeadsK);
  Tensor out = make(out_buffer, kSeqlenQ, kHeadsQ);
  Tensor dout = make(dout_buffer, kSeqlenQ, kHeadsQ);
  Tensor dq = make(dq_buffer, kSeqlenQ, kHeadsQ);
  Tensor dk = make(dk_buffer, kSeqlenK, kHeadsK);
  Tensor dv = make(dv_buffer, kSeqlenK, kHeadsK);
  float* lse = reinterpret_cast<float*>(lse_buffer.data());
  void* workspace = align_up(workspace_buffer.data(), kWorkspaceAlign);
  BackwardOptions options{true, 0.0f, true, workspace, kWorkspaceBytes};

  static Tensor make(PoisonedBuffer& buffer, int64_t seqlen, int64_t heads) {
    return Tensor::contiguous(buffer.data(), DType::kBFloat16, kBatch, seqlen, heads, kHeadDim);
  }

  Status call() const {
    return flash3::backward(dout, q, k, v, out, lse, dq, dk, dv, options, nullptr);
  }

  flash3_backward_args c_args() const {
    return to_c_args(dout, q, k, v, out, lse, dq, dk, dv, options);
  }
  flash3_status c_call() const {
    const flash3_backward_args args = c_args();
    return flash3_backward(&args, nullptr);
  }

  bool untouched() const {
    for (const PoisonedBuffer* b : {&dout_buffer, &q_buffer, &k_buffer, &v_buffer, &out_buffer,
                                    &lse_buffer, &dq_buffer, &dk_buffer, &dv_buffer,
                                    &workspace_buffer}) {
      if (!b->untouched()) {
        return false;
      }
    }
    return true;
  }
};

using P = HostBackwardProblem;

// The query-side tensors (q, out, dout, dq) and the key-side ones (k, v, dk, dv).
void set_q_side(P& p, int64_t batch, int64_t seqlen, int64_t heads, int64_t headdim) {
  for (Tensor* t : {&p.q, &p.out, &p.dout, &p.dq}) {
    set_dims(*t, batch, seqlen, heads, headdim);
  }
}
void set_k_side(P& p, int64_t batch, int64_t seqlen, int64_t heads, int64_t headdim) {
  for (Tensor* t : {&p.k, &p.v, &p.dk, &p.dv}) {
    set_dims(*t, batch, seqlen, heads, headdim);
  }
}
void set_headdim_all(P& p, int64_t headdim) {
  set_q_side(p, P::kBatch, P::kSeqlenQ, P::kHeadsQ, headdim);
  set_k_side(p, P::kBatch, P::kSeqlenK, P::kHeadsK, headdim);
}

// q, k, dq, dk of head dim headdim; v, out, dout, dv of headdim_v.
void set_headdims(P& p, int64_t headdim, int64_t headdim_v) {
  set_headdim_all(p, headdim);
  for (Tensor* t : {&p.v, &p.dv}) {
    set_dims(*t, P::kBatch, P::kSeqlenK, P::kHeadsK, headdim_v);
  }
  for (Tensor* t : {&p.out, &p.dout}) {
    set_dims(*t, P::kBatch, P::kSeqlenQ, P::kHeadsQ, headdim_v);
  }
}

// DeepSeek's (192, 128).
void set_v128_beside_q192(P& p) { set_headdims(p, 192, 128); }

// FlashAttention-3's (64, 256), with the workspace its v needs.
void set_v256_beside_q64(P& p) {
  set_headdims(p, 64, 256);
  size_t bytes = 0;
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.v, p.options, &bytes).ok());
  p.options.workspace_bytes = bytes;
}

// Every tensor (and softmax_lse) at an address far from the others, so that
// huge shapes stay apart; no workspace.
void spread_far_apart(P& p) {
  int slot = 1;
  for (Tensor* t : {&p.dout, &p.q, &p.k, &p.v, &p.out, &p.dq, &p.dk, &p.dv}) {
    t->data = far_address(slot++);
  }
  p.lse = static_cast<float*>(far_address(slot));
  p.options.workspace = nullptr;
}

float* floats_at(void* base, size_t bytes) { return static_cast<float*>(offset_bytes(base, bytes)); }

using InvalidBackwardCase = InvalidCase<P>;

const InvalidBackwardCase kCases[] = {
    // Sinks and their gradient (free room past softmax_lse in its buffer).
    {"DsinksWithoutSinks",
     [](P& p) { p.options.dsinks = floats_at(p.lse_buffer.data(), 4096); },
     Code::kInvalidArgument, "options.dsinks is given without options.sinks"},
    {"MisalignedSinks",
     [](P& p) {
       p.options.sinks = static_cast<const float*>(offset_bytes(p.lse_buffer.data(), 4098));
       p.options.dsinks = floats_at(p.lse_buffer.data(), 8192);
     },
     Code::kInvalidArgument, "options.sinks is not 4-byte aligned"},
    {"DsinksOverlapDq",
     [](P& p) {
       p.options.sinks = floats_at(p.lse_buffer.data(), 4096);
       p.options.dsinks = static_cast<float*>(p.dq.data);
     },
     Code::kInvalidArgument, "options.dsinks overlaps dq"},
    {"DsinksOverlapSinks",
     [](P& p) {
       p.options.sinks = floats_at(p.lse_buffer.data(), 4096);
       p.options.dsinks = floats_at(p.lse_buffer.data(), 4096);
     },
     Code::kInvalidArgument, "options.dsinks overlaps options.sinks"},
    // The masked kernels' options, as the forward's.
    {"WindowBelowMinusOne", [](P& p) { p.options.window_right = -3; }, Code::kInvalidArgument,
     "options.window_left, window_right = (-1, -3)"},
    {"NegativeChunk", [](P& p) { p.options.attention_chunk = -1; }, Code::kInvalidArgument,
     "options.attention_chunk = -1"},
    {"InfiniteSoftcap", [](P& p) { p.options.softcap = INFINITY; }, Code::kInvalidArgument,
     "options.softcap = inf must be finite"},
    // Each tensor on its own.
    {"NullDout", [](P& p) { p.dout.data = nullptr; }, Code::kInvalidArgument,
     "flash3::backward: dout.data is null"},
    {"NullQ", [](P& p) { p.q.data = nullptr; }, Code::kInvalidArgument, "q.data is null"},
    {"NullK", [](P& p) { p.k.data = nullptr; }, Code::kInvalidArgument, "k.data is null"},
    {"NullV", [](P& p) { p.v.data = nullptr; }, Code::kInvalidArgument, "v.data is null"},
    {"NullOut", [](P& p) { p.out.data = nullptr; }, Code::kInvalidArgument, "out.data is null"},
    {"NullDq", [](P& p) { p.dq.data = nullptr; }, Code::kInvalidArgument, "dq.data is null"},
    {"NullDk", [](P& p) { p.dk.data = nullptr; }, Code::kInvalidArgument, "dk.data is null"},
    {"NullDv", [](P& p) { p.dv.data = nullptr; }, Code::kInvalidArgument, "dv.data is null"},
    {"UnknownDtype", [](P& p) { p.dq.dtype = static_cast<DType>(kUnknownDtype); },
     Code::kInvalidArgument, "dq.dtype has the unknown value 7"},
    {"ZeroDtype", [](P& p) { p.dout.dtype = static_cast<DType>(0); }, Code::kInvalidArgument,
     "dout.dtype has the unknown value 0"},
    {"Float32Dout", [](P& p) { p.dout.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "dout.dtype is float32; the backward's tensors must be float16 or bfloat16"},
    {"Float32Dv", [](P& p) { p.dv.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "dv.dtype is float32"},
    {"Float8Q", [](P& p) { p.q.dtype = DType::kFloat8E4M3; }, Code::kUnsupported,
     "q.dtype is float8_e4m3: the backward has no FP8 path"},
    {"Float8Dk", [](P& p) { p.dk.dtype = DType::kFloat8E4M3; }, Code::kUnsupported,
     "dk.dtype is float8_e4m3: the backward has no FP8 path"},
    {"ZeroSeqlen", [](P& p) { p.dq.shape[1] = 0; }, Code::kInvalidArgument,
     "dq.shape[1] (seqlen) = 0 must be at least 1"},
    {"NegativeHeads", [](P& p) { p.dk.shape[2] = -2; }, Code::kInvalidArgument,
     "dk.shape[2] (heads) = -2 must be at least 1"},
    {"ZeroBatch", [](P& p) { p.dout.shape[0] = 0; }, Code::kInvalidArgument,
     "dout.shape[0] (batch) = 0 must be at least 1"},
    {"SizeOver2To31", [](P& p) { p.dv.shape[1] = kOver2To31; }, Code::kInvalidArgument,
     "dv.shape[1] (seqlen) = 2147483648 exceeds 2^31-1"},
    {"LastDimStrided", [](P& p) { p.dk.stride[3] = 2; }, Code::kInvalidArgument,
     "dk.stride[3] (headdim) = 2 must be 1"},
    {"StrideNotA16ByteMultiple", [](P& p) { p.dv.stride[1] = 129; }, Code::kInvalidArgument,
     "dv.stride[1] (seqlen) = 129 elements (258 bytes) is not a multiple of 16 bytes"},
    {"NegativeStride", [](P& p) { p.dq.stride[2] = -64; }, Code::kInvalidArgument,
     "dq.stride[2] (heads) = -64 must be positive"},
    {"ZeroStride", [](P& p) { p.dout.stride[0] = 0; }, Code::kInvalidArgument,
     "dout.stride[0] (batch) = 0 must be positive"},
    {"StrideOver2To40Bytes", [](P& p) { p.out.stride[0] = kOver2To40Bytes; },
     Code::kInvalidArgument, "out.stride[0] (batch) = 549755813896 elements exceeds the 2^40"},
    {"MisalignedDout", [](P& p) { p.dout.data = offset_bytes(p.dout.data, 2); },
     Code::kInvalidArgument, "dout.data is not 16-byte aligned"},
    {"MisalignedDq", [](P& p) { p.dq.data = offset_bytes(p.dq.data, 8); },
     Code::kInvalidArgument, "dq.data is not 16-byte aligned"},
    {"SpanPastAddressSpace",
     [](P& p) { p.dk.data = reinterpret_cast<void*>(~uintptr_t{0xFFF}); },
     Code::kInvalidArgument, "dk: shape and strides address past the end"},
    // Dtypes and shapes against q's and k's.
    {"DoutDtypeDiffers", [](P& p) { p.dout.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "dout.dtype (float16) differs from q.dtype (bfloat16)"},
    {"VDtypeDiffers", [](P& p) { p.v.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "v.dtype (float16) differs from q.dtype (bfloat16)"},
    {"DqDtypeDiffers", [](P& p) { p.dq.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "dq.dtype (float16) differs from q.dtype (bfloat16)"},
    {"DvDtypeDiffers", [](P& p) { p.dv.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "dv.dtype (float16) differs from q.dtype (bfloat16)"},
    {"HeadDim80", [](P& p) { set_headdim_all(p, 80); }, Code::kUnsupported,
     "headdim = 80 is not supported; supported: 64, 96, 128, 192, 256"},
    {"HeadDim32", [](P& p) { set_headdim_all(p, 32); }, Code::kUnsupported,
     "headdim = 32 is not supported"},
    {"HeadDim160", [](P& p) { set_headdim_all(p, 160); }, Code::kUnsupported,
     "headdim = 160 is not supported; supported: 64, 96, 128, 192, 256"},
    {"KHeadDimMismatch", [](P& p) { set_dims(p.k, 2, 16, 2, 128); }, Code::kInvalidArgument,
     "k.shape[3] (headdim) = 128 differs from q's 64"},
    {"VBatchMismatch", [](P& p) { set_dims(p.v, 1, 16, 2, 64); }, Code::kInvalidArgument,
     "v.shape[0] (batch) = 1 differs from q's 2"},
    {"VHeadDimOfItsOwn", [](P& p) { set_dims(p.v, 2, 16, 2, 128); }, Code::kUnsupported,
     "v.shape[3] (headdim) = 128 differs from q's 64; in the backward, v's head dim beside q's 64 "
     "must be one of 64, 256"},
    // v of head dim 128 beside q's 192 (dv != d): out and dout take v's head dim, dv v's shape.
    {"DoutOfQsHeadDimBesideV128",
     [](P& p) {
       set_v128_beside_q192(p);
       set_dims(p.dout, 2, 8, 4, 192);
     },
     Code::kInvalidArgument,
     "dout.shape (2, 8, 4, 192) differs from (q's rows, v's head dim).shape (2, 8, 4, 128)"},
    {"DvOfKsHeadDimBesideV128",
     [](P& p) {
       set_v128_beside_q192(p);
       set_dims(p.dv, 2, 16, 2, 192);
     },
     Code::kInvalidArgument, "dv.shape (2, 16, 2, 192) differs from v.shape (2, 16, 2, 128)"},
    {"HeadsNotAMultiple", [](P& p) { set_q_side(p, 2, 8, 3, 64); }, Code::kInvalidArgument,
     "q.shape[2] (heads_q) = 3 is not a multiple of k.shape[2] (heads_k) = 2"},
    {"KvSeqlenMismatch", [](P& p) { set_dims(p.v, 2, 15, 2, 64); }, Code::kInvalidArgument,
     "v.shape[1] (seqlen) = 15 differs from k's 16"},
    {"KvHeadsMismatch", [](P& p) { set_dims(p.v, 2, 16, 1, 64); }, Code::kInvalidArgument,
     "v.shape[2] (heads) = 1 differs from k's 2"},
    {"OutShapeDiffers", [](P& p) { set_dims(p.out, 2, 9, 4, 64); }, Code::kInvalidArgument,
     "out.shape (2, 9, 4, 64) differs from q.shape (2, 8, 4, 64)"},
    {"DoutShapeDiffers", [](P& p) { set_dims(p.dout, 2, 8, 2, 64); }, Code::kInvalidArgument,
     "dout.shape (2, 8, 2, 64) differs from q.shape (2, 8, 4, 64)"},
    {"DoutBatchDiffers", [](P& p) { set_dims(p.dout, 1, 8, 4, 64); }, Code::kInvalidArgument,
     "dout.shape (1, 8, 4, 64) differs from q.shape (2, 8, 4, 64)"},
    {"DqHeadDimDiffers", [](P& p) { set_dims(p.dq, 2, 8, 4, 128); }, Code::kInvalidArgument,
     "dq.shape (2, 8, 4, 128) differs from q.shape (2, 8, 4, 64)"},
    {"DkShapeDiffers", [](P& p) { set_dims(p.dk, 2, 15, 2, 64); }, Code::kInvalidArgument,
     "dk.shape (2, 15, 2, 64) differs from k.shape (2, 16, 2, 64)"},
    {"DvShapedLikeQ", [](P& p) { set_dims(p.dv, 2, 8, 4, 64); }, Code::kInvalidArgument,
     "dv.shape (2, 8, 4, 64) differs from k.shape (2, 16, 2, 64)"},
    // softmax_lse and the options.
    {"NullLse", [](P& p) { p.lse = nullptr; }, Code::kInvalidArgument,
     "softmax_lse is null: the backward needs the forward's log-sum-exp"},
    {"MisalignedLse", [](P& p) { p.lse = floats_at(p.lse, 2); }, Code::kInvalidArgument,
     "softmax_lse is not 4-byte aligned"},
    {"LsePastAddressSpace", [](P& p) { p.lse = reinterpret_cast<float*>(~uintptr_t{0xFF}); },
     Code::kInvalidArgument,
     "softmax_lse: its batch * heads_q * seqlen_q = 64 floats address past the end"},
    {"NegativeScale", [](P& p) { p.options.softmax_scale = -1.0f; }, Code::kInvalidArgument,
     "options.softmax_scale = -1 must be positive and finite"},
    {"NanScale",
     [](P& p) { p.options.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
     Code::kInvalidArgument, "options.softmax_scale = nan"},
    {"InfiniteScale",
     [](P& p) { p.options.softmax_scale = std::numeric_limits<float>::infinity(); },
     Code::kInvalidArgument, "options.softmax_scale = inf"},
    {"TooManyLseRows",
     [](P& p) {
       spread_far_apart(p);
       set_q_side(p, kLseRowsLimitSide, 1, kLseRowsLimitSide, 64);
       set_k_side(p, kLseRowsLimitSide, 16, 1, 64);
     },
     Code::kInvalidArgument, "batch * heads_q = 4294967296 exceeds 2^31-1"},
    {"PaddedSeqlenQOver2To31",
     [](P& p) {
       spread_far_apart(p);
       set_q_side(p, 1, kMax32, 1, 64);
       set_k_side(p, 1, 16, 1, 64);
     },
     Code::kInvalidArgument,
     "q.shape[1] (seqlen_q) = 2147483647 rounded up to the backward's tile of"},
    {"PaddedSeqlenKOver2To31",
     [](P& p) {
       spread_far_apart(p);
       set_q_side(p, 1, 16, 1, 64);
       set_k_side(p, 1, kMax32, 1, 64);
     },
     Code::kInvalidArgument,
     "k.shape[1] (seqlen_k) = 2147483647 rounded up to the backward's tile of"},
    {"WorkspaceOver2To62Bytes",
     [](P& p) {
       // 2^30 (batch, head) rows of 2^24 queries; the strides, legal if
       // overlapping, keep every tensor small (the gradients' self-overlap
       // is checked after the workspace's size).
       constexpr int64_t kSide = int64_t{1} << 15;
       spread_far_apart(p);
       set_q_side(p, kSide, int64_t{1} << 24, kSide, 256);
       set_k_side(p, kSide, 16, kSide, 256);
       for (Tensor* t : {&p.dout, &p.q, &p.k, &p.v, &p.out, &p.dq, &p.dk, &p.dv}) {
         t->stride = {64, 64, 64, 1};
       }
     },
     Code::kInvalidArgument, "the backward's workspace for these shapes (about"},
    // The gradients against themselves, each other and the inputs.
    {"DqOverlapsItself", [](P& p) { p.dq.stride[1] = 2 * P::kHeadDim; }, Code::kInvalidArgument,
     "dq's strides make elements overlap; dq must not alias itself"},
    {"DkOverlapsItself", [](P& p) { p.dk.stride[0] = P::kHeadDim; }, Code::kInvalidArgument,
     "dk's strides make elements overlap; dk must not alias itself"},
    {"DvZeroHeadStride", [](P& p) { p.dv.stride[2] = 0; }, Code::kInvalidArgument,
     "dv.stride[2] (heads) = 0 must be positive"},
    {"DvOverlapsItself", [](P& p) { p.dv.stride[2] = 32; }, Code::kInvalidArgument,
     "dv's strides make elements overlap; dv must not alias itself"},
    {"DkAliasesDq", [](P& p) { p.dk.data = p.dq.data; }, Code::kInvalidArgument,
     "dk overlaps dq in memory; the gradients must not alias each other"},
    {"DvOverlapsDk", [](P& p) { p.dv.data = offset_bytes(p.dk.data, 1024); },
     Code::kInvalidArgument, "dv overlaps dk in memory"},
    {"DvOverlapsDq", [](P& p) { p.dv.data = offset_bytes(p.dq.data, 4096); },
     Code::kInvalidArgument, "dv overlaps dq in memory"},
    {"DqOverlapsDout", [](P& p) { p.dq.data = offset_bytes(p.dout.data, 4096); },
     Code::kInvalidArgument, "dq overlaps dout in memory; a gradient must not alias an input"},
    {"DqAliasesQ", [](P& p) { p.dq.data = p.q.data; }, Code::kInvalidArgument,
     "dq overlaps q in memory"},
    {"DkAliasesK", [](P& p) { p.dk.data = p.k.data; }, Code::kInvalidArgument,
     "dk overlaps k in memory"},
    {"DvOverlapsV", [](P& p) { p.dv.data = offset_bytes(p.v.data, 2048); },
     Code::kInvalidArgument, "dv overlaps v in memory"},
    {"DkOverlapsOut", [](P& p) { p.dk.data = offset_bytes(p.out.data, 16); },
     Code::kInvalidArgument, "dk overlaps out in memory"},
    {"DqOverlapsLse", [](P& p) { p.lse = floats_at(p.dq.data, 64); }, Code::kInvalidArgument,
     "dq overlaps softmax_lse in memory"},
    {"DvOverlapsLse", [](P& p) { p.lse = floats_at(p.dv.data, 8188); }, Code::kInvalidArgument,
     "dv overlaps softmax_lse in memory"},
    // The workspace.
    {"MisalignedWorkspace", [](P& p) { p.options.workspace = offset_bytes(p.workspace, 128); },
     Code::kInvalidArgument, "options.workspace is not 256-byte aligned"},
    {"WorkspaceTooSmall", [](P& p) { p.options.workspace_bytes = 4096; },
     Code::kInvalidArgument, "options.workspace_bytes = 4096 is less than the "},
    {"ZeroWorkspaceBytes", [](P& p) { p.options.workspace_bytes = 0; }, Code::kInvalidArgument,
     "options.workspace_bytes = 0 is less than the "},
    {"WorkspacePastAddressSpace",
     [](P& p) { p.options.workspace = reinterpret_cast<void*>(~uintptr_t{0xFFF}); },
     Code::kInvalidArgument, "options.workspace: its "},
    {"WorkspaceOverlapsQ", [](P& p) { p.q.data = offset_bytes(p.workspace, 4096); },
     Code::kInvalidArgument, "options.workspace overlaps q in memory"},
    {"WorkspaceOverlapsDout", [](P& p) { p.dout.data = p.workspace; }, Code::kInvalidArgument,
     "options.workspace overlaps dout in memory"},
    {"WorkspaceOverlapsDv", [](P& p) { p.dv.data = offset_bytes(p.workspace, 8192); },
     Code::kInvalidArgument, "options.workspace overlaps dv in memory"},
    {"WorkspaceOverlapsLse", [](P& p) { p.lse = floats_at(p.workspace, 1024); },
     Code::kInvalidArgument, "options.workspace overlaps softmax_lse in memory"},
};

class InvalidBackward : public ::testing::TestWithParam<InvalidBackwardCase> {};

TEST_P(InvalidBackward, IsRefusedBeforeTouchingMemory) { expect_refused(GetParam()); }

TEST_P(InvalidBackward, IsRefusedThroughTheCAbi) { expect_refused_through_c_abi(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, InvalidBackward, ::testing::ValuesIn(kCases), CaseName{});

// Valid calls get past validation: without a GPU they stop at the device
// check; with one, at the pointer check (these are host buffers).
void expect_passes_validation(const Status& s) {
  const bool gpu = cuda_device_count() > 0;
  EXPECT_EQ(s.code, gpu ? Code::kInvalidArgument : Code::kNoDevice) << s.message;
  const char* expected = gpu ? "flash3::backward: dout.data is not device memory"
                             : "flash3::backward: no usable CUDA device";
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected, s.message);
}

void expect_c_passes_validation(flash3_status status) {
  const bool gpu = cuda_device_count() > 0;
  EXPECT_EQ(status, gpu ? FLASH3_ERROR_INVALID_ARGUMENT : FLASH3_ERROR_NO_DEVICE)
      << flash3_last_error();
  const char* expected = gpu ? "flash3::backward: dout.data is not device memory"
                             : "flash3::backward: no usable CUDA device";
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected, flash3_last_error());
}

class ValidBackward : public ::testing::TestWithParam<void (*)(P&)> {};

TEST_P(ValidBackward, PassesValidation) {
  P p;
  GetParam()(p);
  expect_passes_validation(p.call());
  EXPECT_TRUE(p.untouched());
}

TEST_P(ValidBackward, PassesValidationThroughTheCAbi) {
  P p;
  GetParam()(p);
  expect_c_passes_validation(p.c_call());
  EXPECT_TRUE(p.untouched());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidBackward,
    ::testing::Values(
        [](P&) {},                                                    // bf16, GQA, workspace
        [](P& p) {                                                    // fp16
          for (Tensor* t : {&p.dout, &p.q, &p.k, &p.v, &p.out, &p.dq, &p.dk, &p.dv}) {
            t->dtype = DType::kFloat16;
          }
        },
        [](P& p) { p.options.workspace = nullptr; },                  // flash3's own buffer
        [](P& p) { p.options = BackwardOptions{}; },                  // the defaults
        [](P& p) { p.options.workspace_bytes = ~size_t{0}; },         // declared huge
        [](P& p) { p.options.softmax_scale = 0.125f; },
        [](P& p) { set_headdim_all(p, 128); },
        [](P& p) { set_headdim_all(p, 256); },
        [](P& p) { set_v128_beside_q192(p); },  // dv != d
        [](P& p) { set_v256_beside_q64(p); },
        [](P& p) { set_k_side(p, P::kBatch, P::kSeqlenK, P::kHeadsQ, P::kHeadDim); },  // MHA
        [](P& p) { set_k_side(p, P::kBatch, P::kSeqlenK, 1, P::kHeadDim); },           // MQA
        [](P& p) { set_k_side(p, P::kBatch, 3, P::kHeadsK, P::kHeadDim); },  // seqlen_k < q
        [](P& p) {  // size-1 dimensions may carry any stride
          set_q_side(p, P::kBatch, 1, P::kHeadsQ, P::kHeadDim);
          for (Tensor* t : {&p.q, &p.out, &p.dout, &p.dq}) {
            t->stride[1] = -3;
          }
        },
        [](P& p) {  // gradients as views of larger tensors: every other row
          const int64_t row = 2 * P::kHeadsQ * P::kHeadDim;
          p.dq.stride = {P::kSeqlenQ * row, row, P::kHeadDim, 1};
          const int64_t k_row = 2 * P::kHeadsK * P::kHeadDim;
          p.dk.stride = {P::kSeqlenK * k_row, k_row, P::kHeadDim, 1};
        },
        [](P& p) {  // (batch, heads, seqlen, headdim) memory viewed as (b, s, h, d)
          p.dv.stride = {P::kHeadsK * P::kSeqlenK * P::kHeadDim, P::kHeadDim,
                         P::kSeqlenK * P::kHeadDim, 1};
        },
        [](P& p) {  // inputs may alias each other: they are only read
          p.dout.data = p.out.data;
          p.v.data = p.k.data;
        },
        [](P& p) {  // a workspace of exactly the size asked for
          size_t bytes = 0;
          ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &bytes).ok());
          p.options.workspace_bytes = bytes;
        },
        [](P& p) {  // sinks and their gradient, the workspace of their size
          p.options.sinks = floats_at(p.lse_buffer.data(), 4096);
          p.options.dsinks = floats_at(p.lse_buffer.data(), 8192);
          size_t bytes = 0;
          ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &bytes).ok());
          p.options.workspace_bytes = bytes;
        }));

TEST(BackwardCAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_backward(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_backward: args is null",
                      flash3_last_error());
}

TEST(BackwardCAbi, ZeroInitializedArgsNameDout) {
  const flash3_backward_args args{};
  EXPECT_EQ(flash3_backward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::backward: dout.data is null",
                      flash3_last_error());
}

// The C struct's options reach the C++ fields: each one, broken alone, is named.
TEST(BackwardCAbi, OptionsArePassedThrough) {
  {
    P p;
    flash3_backward_args args = p.c_args();
    args.softmax_scale = -2.0f;
    EXPECT_EQ(flash3_backward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "options.softmax_scale = -2", flash3_last_error());
  }
  {
    P p;
    flash3_backward_args args = p.c_args();
    args.workspace_bytes = 512;
    EXPECT_EQ(flash3_backward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "options.workspace_bytes = 512",
                        flash3_last_error());
  }
  {
    P p;
    flash3_backward_args args = p.c_args();
    args.workspace = offset_bytes(p.workspace, 16);
    EXPECT_EQ(flash3_backward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "options.workspace is not 256-byte aligned",
                        flash3_last_error());
  }
  {  // deterministic GQA needs the dK / dV turns: a workspace of the nondeterministic size is short
    P p;
    BackwardOptions plain = p.options;
    plain.deterministic = false;
    size_t plain_bytes = 0;
    ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, plain, &plain_bytes).ok());
    flash3_backward_args args = p.c_args();
    args.workspace_bytes = plain_bytes;
    args.deterministic = 1;
    EXPECT_EQ(flash3_backward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "options.workspace_bytes", flash3_last_error());
    args.deterministic = 0;
    expect_c_passes_validation(flash3_backward(&args, nullptr));
    EXPECT_TRUE(p.untouched());
  }
}

// ---------------------------------------------------------------- workspace size

size_t workspace_bytes(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                       int64_t heads_k, int64_t headdim, bool deterministic) {
  const Tensor q = Tensor::contiguous(far_address(1), DType::kBFloat16, batch, seqlen_q, heads_q,
                                      headdim);
  const Tensor k = Tensor::contiguous(far_address(2), DType::kBFloat16, batch, seqlen_k, heads_k,
                                      headdim);
  BackwardOptions options;
  options.deterministic = deterministic;
  size_t bytes = 0;
  const Status s = flash3::backward_workspace_size(q, k, options, &bytes);
  EXPECT_TRUE(s.ok()) << s.message;
  return bytes;
}

TEST(BackwardWorkspaceSize, NeedsNoDevice) {
  P p;
  size_t bytes = 0;
  const Status s = flash3::backward_workspace_size(p.q, p.k, p.options, &bytes);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(bytes % kWorkspaceAlign, 0u);
  EXPECT_TRUE(p.untouched());
}

TEST(BackwardWorkspaceSize, HoldsAnFp32DqAccumulatorAndTheRowStatistics) {
  for (const int64_t headdim : {64, 96, 128, 192, 256}) {
    for (const bool deterministic : {false, true}) {
      const size_t bytes = workspace_bytes(3, 1000, 700, 4, 4, headdim, deterministic);
      EXPECT_GE(bytes, size_t{3} * 4 * 1000 * (headdim + 2) * sizeof(float)) << headdim;
    }
  }
}

// O(seqlen * headdim), not O(seqlen^2): doubling the sequence lengths (in
// whole tiles) doubles the size, up to the regions' 256-byte rounding.
TEST(BackwardWorkspaceSize, GrowsLinearlyWithSeqlen) {
  for (const int64_t headdim : {64, 96, 128, 192, 256}) {
    for (const bool deterministic : {false, true}) {
      for (const int64_t heads_k : {8, 2}) {
        const double s1 = workspace_bytes(2, 1024, 1024, 8, heads_k, headdim, deterministic);
        const double s2 = workspace_bytes(2, 2048, 2048, 8, heads_k, headdim, deterministic);
        const double s16 = workspace_bytes(2, 16384, 16384, 8, heads_k, headdim, deterministic);
        EXPECT_NEAR(s2 / s1, 2.0, 0.01) << headdim << " " << deterministic << " " << heads_k;
        EXPECT_NEAR(s16 / s1, 16.0, 0.1) << headdim << " " << deterministic << " " << heads_k;
      }
    }
  }
  // 128k tokens, head dim 128: about 4 bytes per q element plus a little, far from seqlen^2.
  const double bytes = workspace_bytes(1, 131072, 131072, 1, 1, 128, true);
  EXPECT_LT(bytes, 131072.0 * 128 * 4 * 1.1);
}

// GQA adds the fp32 dK/dV accumulators; deterministic GQA adds their turns
// (the dQ state is there in both modes).
TEST(BackwardWorkspaceSize, LargerWithGqaAndDeterministic) {
  for (const int64_t headdim : {64, 96, 128, 192, 256}) {
    const size_t mha = workspace_bytes(2, 512, 1024, 8, 8, headdim, false);
    const size_t gqa = workspace_bytes(2, 512, 1024, 8, 2, headdim, false);
    const size_t mqa = workspace_bytes(2, 512, 1024, 8, 1, headdim, false);
    EXPECT_GT(gqa, mha) << headdim;
    EXPECT_GT(gqa, mqa) << headdim;  // one K/V head: smaller accumulators
    EXPECT_GE(gqa - mha, size_t{2} * 2 * 2 * 1024 * headdim * sizeof(float)) << headdim;
    EXPECT_EQ(workspace_bytes(2, 512, 1024, 8, 8, headdim, true), mha) << headdim;
    EXPECT_GT(workspace_bytes(2, 512, 1024, 8, 2, headdim, true), gqa) << headdim;
  }
}

// The size backward_workspace_size gives is what backward asks for: one byte
// less is refused, with both numbers in the message.
TEST(BackwardWorkspaceSize, IsWhatBackwardNeeds) {
  P p;
  size_t bytes = 0;
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &bytes).ok());
  p.options.workspace_bytes = bytes - 1;
  const Status s = p.call();
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  const std::string expected = "flash3::backward: options.workspace_bytes = " +
                               std::to_string(bytes - 1) + " is less than the " +
                               std::to_string(bytes) + " bytes";
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected, s.message);
  p.options.workspace_bytes = bytes;
  expect_passes_validation(p.call());
  EXPECT_TRUE(p.untouched());
}

// v wider than q ((64, 256)) needs the overload that takes v: its GQA dV
// sums are of v's head dim (and its tiles 256's), so where they outweigh the
// smaller tiles' padding the size for v of q's head dim falls short and
// backward() refuses it; v narrower ((192, 128)) needs no more than q's.
TEST(BackwardWorkspaceSize, TakesVsHeadDim) {
  P p;
  set_q_side(p, 1, 64, 2, 64);  // 64 rows: no tile padding; GQA 2 / 1
  set_k_side(p, 1, 64, 1, 256);
  set_dims(p.k, 1, 64, 1, 64);
  set_dims(p.dk, 1, 64, 1, 64);
  for (Tensor* t : {&p.out, &p.dout}) {
    set_dims(*t, 1, 64, 2, 256);
  }
  size_t with_v = 0, without_v = 0;
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.v, p.options, &with_v).ok());
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &without_v).ok());
  EXPECT_GT(with_v, without_v);
  p.options.workspace_bytes = without_v;
  const Status s = p.call();
  EXPECT_EQ(s.code, Code::kInvalidArgument) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "is less than the " + std::to_string(with_v) + " bytes",
                      s.message);
  p.options.workspace_bytes = with_v;
  expect_passes_validation(p.call());
  EXPECT_TRUE(p.untouched());

  P narrow;
  set_v128_beside_q192(narrow);
  ASSERT_TRUE(
      flash3::backward_workspace_size(narrow.q, narrow.k, narrow.v, narrow.options, &with_v).ok());
  ASSERT_TRUE(flash3::backward_workspace_size(narrow.q, narrow.k, narrow.options, &without_v).ok());
  EXPECT_LT(with_v, without_v);

  // v's head dim is checked as backward() checks it.
  set_dims(p.v, 1, 64, 1, 128);
  const Status refused = flash3::backward_workspace_size(p.q, p.k, p.v, p.options, &with_v);
  EXPECT_EQ(refused.code, Code::kUnsupported);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "v's head dim beside q's 64 must be one of 64, 256",
                      refused.message);
}

// Only the shapes and options.deterministic count: options.workspace (and
// the other options) are ignored.
TEST(BackwardWorkspaceSize, DependsOnlyOnShapesAndDeterministic) {
  P p;
  size_t expected = 0;
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &expected).ok());
  BackwardOptions options = p.options;
  options.workspace = offset_bytes(p.workspace, 1);
  options.workspace_bytes = 0;
  options.softmax_scale = -1.0f;
  options.causal = !options.causal;
  size_t bytes = 0;
  const Status s = flash3::backward_workspace_size(p.q, p.k, options, &bytes);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(bytes, expected);
}

struct WorkspaceSizeCase {
  const char* name;
  void (*mutate)(P&);
  StatusCode code;
  const char* message;
};

std::ostream& operator<<(std::ostream& os, const WorkspaceSizeCase& c) { return os << c.name; }

const WorkspaceSizeCase kWorkspaceSizeCases[] = {
    {"NullQ", [](P& p) { p.q.data = nullptr; }, Code::kInvalidArgument,
     "flash3::backward_workspace_size: q.data is null"},
    {"NullK", [](P& p) { p.k.data = nullptr; }, Code::kInvalidArgument, "k.data is null"},
    {"QFloat8", [](P& p) { p.q.dtype = DType::kFloat8E4M3; }, Code::kUnsupported,
     "q.dtype is float8_e4m3: the backward has no FP8 path"},
    {"KFloat32", [](P& p) { p.k.dtype = DType::kFloat32; }, Code::kInvalidArgument,
     "k.dtype is float32"},
    {"KDtypeDiffers", [](P& p) { p.k.dtype = DType::kFloat16; }, Code::kInvalidArgument,
     "k.dtype (float16) differs from q.dtype (bfloat16)"},
    {"UnknownDtype", [](P& p) { p.q.dtype = static_cast<DType>(kUnknownDtype); },
     Code::kInvalidArgument, "q.dtype has the unknown value 7"},
    {"ZeroSeqlen", [](P& p) { p.k.shape[1] = 0; }, Code::kInvalidArgument,
     "k.shape[1] (seqlen) = 0 must be at least 1"},
    {"LastDimStrided", [](P& p) { p.q.stride[3] = 2; }, Code::kInvalidArgument,
     "q.stride[3] (headdim) = 2 must be 1"},
    {"HeadDim80", [](P& p) { set_headdim_all(p, 80); }, Code::kUnsupported,
     "headdim = 80 is not supported"},
    {"HeadDimMismatch", [](P& p) { set_dims(p.k, 2, 16, 2, 128); }, Code::kInvalidArgument,
     "k.shape[3] (headdim) = 128 differs from q's 64"},
    {"BatchMismatch", [](P& p) { set_dims(p.k, 3, 16, 2, 64); }, Code::kInvalidArgument,
     "k.shape[0] (batch) = 3 differs from q's 2"},
    {"HeadsNotAMultiple", [](P& p) { set_dims(p.k, 2, 16, 3, 64); }, Code::kInvalidArgument,
     "q.shape[2] (heads_q) = 4 is not a multiple of k.shape[2] (heads_k) = 3"},
    {"TooManyLseRows",
     [](P& p) {
       spread_far_apart(p);
       set_q_side(p, kLseRowsLimitSide, 1, kLseRowsLimitSide, 64);
       set_k_side(p, kLseRowsLimitSide, 16, 1, 64);
     },
     Code::kInvalidArgument, "batch * heads_q = 4294967296 exceeds 2^31-1"},
};

class InvalidBackwardWorkspaceSize : public ::testing::TestWithParam<WorkspaceSizeCase> {};

TEST_P(InvalidBackwardWorkspaceSize, IsRefusedAndLeavesBytes) {
  P p;
  GetParam().mutate(p);
  size_t bytes = 12345;
  const Status s = flash3::backward_workspace_size(p.q, p.k, p.options, &bytes);
  EXPECT_EQ(s.code, GetParam().code) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, GetParam().message, s.message);
  EXPECT_EQ(bytes, 12345u);
  EXPECT_TRUE(p.untouched());
}

TEST_P(InvalidBackwardWorkspaceSize, IsRefusedThroughTheCAbi) {
  P p;
  GetParam().mutate(p);
  const flash3_backward_args args = p.c_args();
  size_t bytes = 12345;
  EXPECT_EQ(flash3_backward_workspace_size(&args, &bytes),
            static_cast<flash3_status>(GetParam().code));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, GetParam().message, flash3_last_error());
  EXPECT_EQ(bytes, 12345u);
}

INSTANTIATE_TEST_SUITE_P(Cases, InvalidBackwardWorkspaceSize,
                         ::testing::ValuesIn(kWorkspaceSizeCases), CaseName{});

// dsinks: one float per (batch, head, query block) more, rounded to the alignment.
TEST(BackwardWorkspaceSize, HoldsTheSinksPartialSumsWithDsinks) {
  P p;
  size_t without = 0, with = 0;
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &without).ok());
  p.options.sinks = floats_at(p.lse_buffer.data(), 4096);
  p.options.dsinks = floats_at(p.lse_buffer.data(), 8192);
  ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &with).ok());
  EXPECT_GE(with, without + P::kBatch * P::kHeadsQ * sizeof(float));
  EXPECT_LE(with, without + P::kBatch * P::kHeadsQ * sizeof(float) + kWorkspaceAlign);
}

TEST(BackwardWorkspaceSize, NullBytesIsRefused) {
  P p;
  const Status s = flash3::backward_workspace_size(p.q, p.k, p.options, nullptr);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::backward_workspace_size: bytes is null",
                      s.message);
}

TEST(BackwardWorkspaceSizeCAbi, NullArgsAndNullBytesAreRefused) {
  size_t bytes = 12345;
  EXPECT_EQ(flash3_backward_workspace_size(nullptr, &bytes), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_backward_workspace_size: args is null",
                      flash3_last_error());
  EXPECT_EQ(bytes, 12345u);
  P p;
  const flash3_backward_args args = p.c_args();
  EXPECT_EQ(flash3_backward_workspace_size(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_backward_workspace_size: bytes is null",
                      flash3_last_error());
}

TEST(BackwardWorkspaceSizeCAbi, ZeroInitializedArgsNameQ) {
  const flash3_backward_args args{};
  size_t bytes = 0;
  EXPECT_EQ(flash3_backward_workspace_size(&args, &bytes), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::backward_workspace_size: q.data is null",
                      flash3_last_error());
}

// The C call reads q, k and deterministic from the struct and ignores the
// rest (the gradients, lse and workspace may be anything).
TEST(BackwardWorkspaceSizeCAbi, MatchesTheCppCall) {
  for (const bool deterministic : {false, true}) {
    P p;
    p.options.deterministic = deterministic;
    size_t expected = 0;
    ASSERT_TRUE(flash3::backward_workspace_size(p.q, p.k, p.options, &expected).ok());
    flash3_backward_args args = p.c_args();
    args.dq = flash3_tensor{};
    args.softmax_lse = nullptr;
    args.workspace = offset_bytes(p.workspace, 3);
    size_t bytes = 0;
    EXPECT_EQ(flash3_backward_workspace_size(&args, &bytes), FLASH3_OK) << flash3_last_error();
    EXPECT_EQ(bytes, expected);
    EXPECT_STREQ(flash3_last_error(), "");
  }
}

// ---------------------------------------------------------------- backward_varlen

// The problem packed as one batch of 2 sequences (totals 16 queries, 32
// keys), with its offsets and counts in host memory apart from the tensors
// (validation reads neither).
struct HostVarlenProblem : HostBackwardProblem {
  PoisonedBuffer index_buffer{1024};
  int* cu_q = reinterpret_cast<int*>(index_buffer.data());
  Varlen varlen{cu_q, cu_q + 8, 2, 9, cu_q + 16, cu_q + 24};

  HostVarlenProblem() {
    set_q_side(*this, 1, kBatch * kSeqlenQ, kHeadsQ, kHeadDim);
    set_k_side(*this, 1, kBatch * kSeqlenK, kHeadsK, kHeadDim);
  }
  Status call() const {
    return flash3::backward_varlen(dout, q, k, v, out, lse, dq, dk, dv, varlen, options, nullptr);
  }
  flash3_status c_call() const {
    flash3_backward_varlen_args args{};
    args.backward = c_args();
    args.cu_seqlens_q = varlen.cu_seqlens_q;
    args.cu_seqlens_k = varlen.cu_seqlens_k;
    args.batch = varlen.batch;
    args.max_seqlen_q = varlen.max_seqlen_q;
    args.seqused_q = varlen.seqused_q;
    args.seqused_k = varlen.seqused_k;
    return flash3_backward_varlen(&args, nullptr);
  }
};

struct VarlenCase {
  const char* name;
  void (*mutate)(HostVarlenProblem&);
  const char* message;
};

const VarlenCase kVarlenCases[] = {
    {"BatchNotOne",
     [](HostVarlenProblem& p) { set_q_side(p, 2, P::kSeqlenQ, P::kHeadsQ, P::kHeadDim); },
     "dout.shape[0] = 2: a varlen batch is packed"},
    {"NullCuSeqlensQ", [](HostVarlenProblem& p) { p.varlen.cu_seqlens_q = nullptr; },
     "varlen.cu_seqlens_q"},
    {"MisalignedCuSeqlensK",
     [](HostVarlenProblem& p) {
       p.varlen.cu_seqlens_k = reinterpret_cast<const int*>(
           reinterpret_cast<const char*>(p.varlen.cu_seqlens_k) + 2);
     },
     "varlen.cu_seqlens_k"},
    {"ZeroBatch", [](HostVarlenProblem& p) { p.varlen.batch = 0; },
     "varlen.batch = 0 must be at least 1"},
    {"ZeroMaxSeqlenQ", [](HostVarlenProblem& p) { p.varlen.max_seqlen_q = 0; },
     "varlen.max_seqlen_q = 0 must be at least 1"},
    {"SequsedKInsideDk",
     [](HostVarlenProblem& p) { p.varlen.seqused_k = static_cast<const int*>(p.dk.data); },
     "varlen.seqused_k overlaps dk"},
    {"CuSeqlensQInsideTheWorkspace",
     [](HostVarlenProblem& p) { p.varlen.cu_seqlens_q = static_cast<const int*>(p.workspace); },
     "varlen.cu_seqlens_q overlaps options.workspace"},
};

class InvalidBackwardVarlen : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(InvalidBackwardVarlen, IsRefusedNamingTheArgument) {
  for (const bool c_abi : {false, true}) {
    HostVarlenProblem p;
    GetParam().mutate(p);
    std::string message;
    if (c_abi) {
      EXPECT_EQ(p.c_call(), FLASH3_ERROR_INVALID_ARGUMENT);
      message = flash3_last_error();
    } else {
      const Status s = p.call();
      EXPECT_EQ(s.code, Code::kInvalidArgument);
      message = s.message;
    }
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3::backward_varlen: ", message);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, GetParam().message, message);
    EXPECT_TRUE(p.untouched());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, InvalidBackwardVarlen, ::testing::ValuesIn(kVarlenCases),
                         [](const ::testing::TestParamInfo<VarlenCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(BackwardVarlenValidation, ValidCallsPassValidation) {
  for (const bool c_abi : {false, true}) {
    for (const bool seqused : {true, false}) {
      HostVarlenProblem p;
      if (!seqused) {
        p.varlen.seqused_q = p.varlen.seqused_k = nullptr;
      }
      const bool gpu = cuda_device_count() > 0;
      std::string message;
      if (c_abi) {
        EXPECT_EQ(p.c_call(), gpu ? FLASH3_ERROR_INVALID_ARGUMENT : FLASH3_ERROR_NO_DEVICE);
        message = flash3_last_error();
      } else {
        const Status s = p.call();
        EXPECT_EQ(s.code, gpu ? Code::kInvalidArgument : Code::kNoDevice);
        message = s.message;
      }
      EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                          gpu ? "flash3::backward_varlen: dout.data is not device memory"
                              : "flash3::backward_varlen: no usable CUDA device",
                          message);
      EXPECT_TRUE(p.untouched());
    }
  }
}

// Each sequence's query rows padded apart (a tile of rows more per
// sequence), and the key blocks' prefix sums: more than the dense
// workspace of the totals, growing with the number of sequences.
TEST(BackwardVarlenWorkspaceSize, AddsATilePerSequence) {
  for (const int64_t headdim : {64, 96, 128, 192, 256}) {
    const Tensor q = Tensor::contiguous(far_address(1), DType::kBFloat16, 1, 4096, 8, headdim);
    const Tensor k = Tensor::contiguous(far_address(2), DType::kBFloat16, 1, 4096, 8, headdim);
    BackwardOptions options;
    size_t dense = 0, two = 0, many = 0;
    ASSERT_TRUE(flash3::backward_workspace_size(q, k, options, &dense).ok());
    Varlen varlen{nullptr, nullptr, 2, 1};
    ASSERT_TRUE(flash3::backward_workspace_size(q, k, varlen, options, &two).ok());
    varlen.batch = 100;
    ASSERT_TRUE(flash3::backward_workspace_size(q, k, varlen, options, &many).ok());
    EXPECT_GT(two, dense) << headdim;
    const size_t per_row = (headdim + 2) * sizeof(float) * 8;  // dq sums, two statistics, 8 heads
    EXPECT_GE(many - two, per_row * 98 * 64) << headdim;  // block_m >= 64 rows each
    flash3_backward_varlen_args args{};
    args.backward.q = to_c(q);
    args.backward.k = to_c(k);
    args.batch = 100;
    size_t c_bytes = 0;
    EXPECT_EQ(flash3_backward_varlen_workspace_size(&args, &c_bytes), FLASH3_OK)
        << flash3_last_error();
    EXPECT_EQ(c_bytes, many);
    varlen.batch = 0;
    const Status s = flash3::backward_workspace_size(q, k, varlen, options, &two);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "varlen.batch = 0", s.message);
  }
}

TEST(BackwardVarlenCAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_backward_varlen(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "flash3_backward_varlen: args is null",
                      flash3_last_error());
  size_t bytes = 0;
  EXPECT_EQ(flash3_backward_varlen_workspace_size(nullptr, &bytes), FLASH3_ERROR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace flash3::test
