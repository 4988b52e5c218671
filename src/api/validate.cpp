#include "validate.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace flash3::detail {
namespace {

// TMA (cp.async.bulk.tensor) limits, from the CUDA driver's cuTensorMapEncodeTiled.
constexpr int64_t kTmaAlignmentBytes = 16;  // base address and every stride (also the
                                            // quantization kernel's vector accesses)
constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;
// Tile coordinates and row indices are 32-bit signed inside the kernels.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();
// One CTA quantizes a whole block of rows: larger blocks would leave most SMs idle.
constexpr int64_t kMaxBlockRows = int64_t{1} << 20;

const char* const kDimNames[4] = {"batch", "seqlen", "heads", "headdim"};

// Messages name the argument; with_call puts the public call's name in front.
template <class... Parts>
Status error(StatusCode code, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return Status{code, os.str()};
}

template <class... Parts>
Status invalid(Parts&&... parts) {
  return error(StatusCode::kInvalidArgument, std::forward<Parts>(parts)...);
}

template <class... Parts>
Status unsupported(Parts&&... parts) {
  return error(StatusCode::kUnsupported, std::forward<Parts>(parts)...);
}

int64_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFloat8E4M3:
      return 1;
  }
  return 0;
}

bool known_dtype(DType dtype) { return element_bytes(dtype) != 0; }

// Whether a call takes a tensor of this (known) dtype.
using DTypeRule = Status (*)(const char* name, DType dtype);

// q, k, v and out of the forward.
Status forward_dtype(const char* name, DType dtype) {
  if (dtype == DType::kFloat32) {
    return invalid(name, ".dtype is float32; q, k, v and out must be float16 or bfloat16");
  }
  if (dtype == DType::kFloat8E4M3) {
    return unsupported(name, ".dtype is float8_e4m3, which the forward does not support yet; "
                       "use float16 or bfloat16");
  }
  return Status{};
}

// The input of quantize_fp8.
Status half_dtype(const char* name, DType dtype) {
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return invalid(name, ".dtype is ", dtype_name(dtype), "; ", name,
                   " must be float16 or bfloat16");
  }
  return Status{};
}

// The output of quantize_fp8.
Status e4m3_dtype(const char* name, DType dtype) {
  if (dtype != DType::kFloat8E4M3) {
    return invalid(name, ".dtype is ", dtype_name(dtype), "; ", name, " must be float8_e4m3");
  }
  return Status{};
}

// q and k of the FP8 forward, and v of fp8_v_layout.
Status fp8_input_dtype(const char* name, DType dtype) {
  Status s = e4m3_dtype(name, dtype);
  if (!s.ok()) {
    s.message += " (quantize_fp8 writes it)";
  }
  return s;
}

// Byte span [lo, hi) that a tensor's elements occupy; false if it overflows.
bool byte_span(const Tensor& t, uint64_t* lo, uint64_t* hi) {
  const int64_t bytes = element_bytes(t.dtype);
  unsigned __int128 last = 0;
  for (int i = 0; i < 4; ++i) {
    last += static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<uint64_t>(t.stride[i]);
  }
  const unsigned __int128 end =
      reinterpret_cast<uintptr_t>(t.data) + (last + 1) * static_cast<uint64_t>(bytes);
  if (end > std::numeric_limits<uint64_t>::max()) {
    return false;
  }
  *lo = reinterpret_cast<uintptr_t>(t.data);
  *hi = static_cast<uint64_t>(end);
  return true;
}

// One tensor on its own: pointer, dtype (known, and one `accepts` takes),
// shape, strides, alignment.
Status check_tensor(const char* name, const Tensor& t, DTypeRule accepts) {
  if (t.data == nullptr) {
    return invalid(name, ".data is null");
  }
  if (!known_dtype(t.dtype)) {
    return invalid(name, ".dtype has the unknown value ", static_cast<int>(t.dtype));
  }
  if (Status s = accepts(name, t.dtype); !s.ok()) {
    return s;
  }
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 1) {
      return invalid(name, ".shape[", i, "] (", kDimNames[i], ") = ", t.shape[i],
                     " must be at least 1");
    }
    if (t.shape[i] > kMaxDimension) {
      return invalid(name, ".shape[", i, "] (", kDimNames[i], ") = ", t.shape[i],
                     " exceeds 2^31-1, the largest size the kernels index with 32 bits");
    }
  }
  if (t.stride[3] != 1) {
    return invalid(name, ".stride[3] (headdim) = ", t.stride[3],
                   " must be 1: the last dimension must be contiguous");
  }
  const int64_t bytes = element_bytes(t.dtype);
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] == 1) {
      continue;  // the stride of a dimension of size 1 is never used
    }
    if (t.stride[i] < 1) {
      return invalid(name, ".stride[", i, "] (", kDimNames[i], ") = ", t.stride[i],
                     " must be positive");
    }
    if (t.stride[i] > kTmaMaxStrideBytes / bytes) {
      return invalid(name, ".stride[", i, "] (", kDimNames[i], ") = ", t.stride[i],
                     " elements exceeds the 2^40-byte stride limit of TMA");
    }
    if ((t.stride[i] * bytes) % kTmaAlignmentBytes != 0) {
      return invalid(name, ".stride[", i, "] (", kDimNames[i], ") = ", t.stride[i],
                     " elements (", t.stride[i] * bytes, " bytes) is not a multiple of ",
                     kTmaAlignmentBytes, " bytes, which 16-byte accesses (TMA, vectors) need");
    }
  }
  if (reinterpret_cast<uintptr_t>(t.data) % kTmaAlignmentBytes != 0) {
    return invalid(name, ".data is not ", kTmaAlignmentBytes,
                   "-byte aligned, which 16-byte accesses (TMA, vectors) need");
  }
  uint64_t lo = 0, hi = 0;
  if (!byte_span(t, &lo, &hi)) {
    return invalid(name, ": shape and strides address past the end of the address space");
  }
  return Status{};
}

// True if two distinct index tuples of `t` can reach the same element.
bool self_overlapping(const Tensor& t) {
  // Order the dimensions of size > 1 by stride; each stride must clear the
  // extent of all smaller ones.
  int order[4] = {0, 1, 2, 3};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      if (t.stride[order[j]] < t.stride[order[i]]) {
        std::swap(order[i], order[j]);
      }
    }
  }
  int64_t extent = 1;  // elements spanned by the dims visited so far
  for (int i = 0; i < 4; ++i) {
    const int d = order[i];
    if (t.shape[d] == 1) {
      continue;
    }
    if (t.stride[d] < extent) {
      return true;
    }
    extent = t.stride[d] * (t.shape[d] - 1) + extent;
  }
  return false;
}

// Byte span [lo, hi) of something already checked not to overflow.
struct Span {
  uint64_t lo = 0;
  uint64_t hi = 0;
};

Span span_of(const Tensor& t) {
  Span s;
  byte_span(t, &s.lo, &s.hi);
  return s;
}

bool intersect(const Span& a, const Span& b) { return a.lo < b.hi && b.lo < a.hi; }

bool spans_intersect(const Tensor& a, const Tensor& b) { return intersect(span_of(a), span_of(b)); }

template <class T, size_t kN>
bool one_of(const T (&set)[kN], int64_t d) {
  for (T s : set) {
    if (d == s) {
      return true;
    }
  }
  return false;
}

bool supported_headdim(int64_t d) { return one_of(kSupportedHeadDims, d); }

// The (batch, seqlen, heads, headdim) sizes of a validated tensor into params.
template <class Params>
void set_dims(const Tensor& t, Params* p) {
  p->batch = static_cast<int>(t.shape[0]);
  p->seqlen = static_cast<int>(t.shape[1]);
  p->heads = static_cast<int>(t.shape[2]);
  p->headdim = static_cast<int>(t.shape[3]);
}

// The `blocks_per_head` scales of each (batch, head) of x as a float32 tensor
// (batch, heads, blocks, 1), for the span and overlap checks.
Tensor descale_tensor(float* descale, const Tensor& x, int64_t blocks_per_head) {
  Tensor t;
  t.data = descale;
  t.dtype = DType::kFloat32;
  t.shape = {x.shape[0], x.shape[2], blocks_per_head, 1};
  t.stride = {x.shape[2] * blocks_per_head, blocks_per_head, 1, 1};
  return t;
}

Strides3 strides_of(const Tensor& t) {
  // Dimensions of size 1 may carry any stride (PyTorch's do); give them a
  // harmless one that TMA accepts.
  Strides3 s;
  s.head = t.shape[2] == 1 ? t.shape[3] : t.stride[2];
  s.seq = t.shape[1] == 1 ? s.head * t.shape[2] : t.stride[1];
  s.batch = t.shape[0] == 1 ? s.seq * t.shape[1] : t.stride[0];
  return s;
}

Status with_call(const char* call, Status s) {
  if (!s.ok()) {
    s.message = std::string(call) + ": " + s.message;
  }
  return s;
}

Status check_batch_and_headdim_match_q(const char* name, const Tensor& t, const Tensor& q) {
  if (t.shape[3] != q.shape[3]) {
    return invalid(name, ".shape[3] (headdim) = ", t.shape[3], " differs from q's ", q.shape[3]);
  }
  if (t.shape[0] != q.shape[0]) {
    return invalid(name, ".shape[0] (batch) = ", t.shape[0], " differs from q's ", q.shape[0]);
  }
  return Status{};
}

// out is shaped like q; q's heads are a multiple of k's.
Status check_out_and_heads(const Tensor& q, const Tensor& k, const Tensor& out) {
  if (out.shape[1] != q.shape[1] || out.shape[2] != q.shape[2]) {
    return invalid("out.shape (", out.shape[0], ", ", out.shape[1], ", ", out.shape[2], ", ",
                   out.shape[3], ") differs from q.shape (", q.shape[0], ", ", q.shape[1], ", ",
                   q.shape[2], ", ", q.shape[3], ")");
  }
  if (q.shape[2] % k.shape[2] != 0) {
    return invalid("q.shape[2] (heads_q) = ", q.shape[2],
                   " is not a multiple of k.shape[2] (heads_k) = ", k.shape[2]);
  }
  return Status{};
}

Status check_lse_and_options(const Tensor& q, float* softmax_lse, const ForwardOptions& options) {
  if (softmax_lse != nullptr && reinterpret_cast<uintptr_t>(softmax_lse) % alignof(float) != 0) {
    return invalid("softmax_lse is not 4-byte aligned");
  }
  if (!std::isfinite(options.softmax_scale) || options.softmax_scale < 0.0f) {
    return invalid("options.softmax_scale = ", options.softmax_scale,
                   " must be positive and finite (or 0 for 1/sqrt(headdim))");
  }
  const int64_t lse_rows = q.shape[0] * q.shape[2];
  if (lse_rows > kMaxDimension) {
    return invalid("batch * heads_q = ", lse_rows, " exceeds 2^31-1");
  }
  return Status{};
}

// The fields both forwards share (v's layout and the descales are the caller's).
void fill_forward(const Tensor& q, const Tensor& k, const void* v, const Tensor& out,
                  float* softmax_lse, const ForwardOptions& options, ForwardParams* p) {
  p->q = q.data;
  p->k = k.data;
  p->v = v;
  p->out = out.data;
  p->softmax_lse = softmax_lse;
  p->dtype = q.dtype;
  p->out_dtype = out.dtype;
  p->batch = static_cast<int>(q.shape[0]);
  p->seqlen_q = static_cast<int>(q.shape[1]);
  p->seqlen_k = static_cast<int>(k.shape[1]);
  p->heads_q = static_cast<int>(q.shape[2]);
  p->heads_k = static_cast<int>(k.shape[2]);
  p->headdim = static_cast<int>(q.shape[3]);
  p->q_stride = strides_of(q);
  p->k_stride = strides_of(k);
  p->out_stride = strides_of(out);
  p->softmax_scale = options.softmax_scale > 0.0f
                         ? options.softmax_scale
                         : 1.0f / std::sqrt(static_cast<float>(p->headdim));
  p->causal = options.causal;
}

Status check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     float* softmax_lse, const ForwardOptions& options, ForwardParams* params) {
  const struct {
    const char* name;
    const Tensor& t;
  } tensors[] = {{"q", q}, {"k", k}, {"v", v}, {"out", out}};
  for (const auto& [name, t] : tensors) {
    if (Status s = check_tensor(name, t, forward_dtype); !s.ok()) {
      return s;
    }
  }
  for (const auto& [name, t] : tensors) {
    if (t.dtype != q.dtype) {
      return invalid(name, ".dtype (", dtype_name(t.dtype), ") differs from q.dtype (",
                     dtype_name(q.dtype), ")");
    }
  }
  for (const auto& [name, t] : tensors) {
    if (Status s = check_batch_and_headdim_match_q(name, t, q); !s.ok()) {
      return s;
    }
  }
  if (!supported_headdim(q.shape[3])) {
    return unsupported("headdim = ", q.shape[3], " is not supported; supported: 64, 128, 256");
  }
  if (v.shape[1] != k.shape[1]) {
    return invalid("v.shape[1] (seqlen) = ", v.shape[1], " differs from k's ", k.shape[1]);
  }
  if (v.shape[2] != k.shape[2]) {
    return invalid("v.shape[2] (heads) = ", v.shape[2], " differs from k's ", k.shape[2]);
  }
  if (Status s = check_out_and_heads(q, k, out); !s.ok()) {
    return s;
  }
  if (self_overlapping(out)) {
    return invalid("out's strides make elements overlap; out must not alias itself");
  }
  for (const auto& [name, t] : tensors) {
    if (&t != &out && spans_intersect(out, t)) {
      return invalid("out overlaps ", name, " in memory; the output must not alias an input");
    }
  }
  if (Status s = check_lse_and_options(q, softmax_lse, options); !s.ok()) {
    return s;
  }

  ForwardParams p;
  fill_forward(q, k, v.data, out, softmax_lse, options, &p);
  p.v_stride = strides_of(v);
  *params = p;
  return Status{};
}

Status check_quantize(const Tensor& x, const Tensor& x_fp8, float* descale,
                      const QuantizeOptions& options, QuantizeParams* params) {
  if (Status s = check_tensor("x", x, half_dtype); !s.ok()) {
    return s;
  }
  if (Status s = check_tensor("x_fp8", x_fp8, e4m3_dtype); !s.ok()) {
    return s;
  }
  if (x_fp8.shape != x.shape) {
    return invalid("x_fp8.shape (", x_fp8.shape[0], ", ", x_fp8.shape[1], ", ", x_fp8.shape[2],
                   ", ", x_fp8.shape[3], ") differs from x.shape (", x.shape[0], ", ", x.shape[1],
                   ", ", x.shape[2], ", ", x.shape[3], ")");
  }
  if (!supported_headdim(x.shape[3])) {
    return unsupported("headdim = ", x.shape[3], " is not supported; supported: 64, 128, 256");
  }
  if (options.block_rows < 1 || options.block_rows > kMaxBlockRows) {
    return invalid("options.block_rows = ", options.block_rows, " must be in [1, ",
                   kMaxBlockRows, "]");
  }
  if (descale == nullptr) {
    return invalid("descale is null");
  }
  if (reinterpret_cast<uintptr_t>(descale) % alignof(float) != 0) {
    return invalid("descale is not 4-byte aligned");
  }
  const int64_t blocks_per_head = (x.shape[1] + options.block_rows - 1) / options.block_rows;
  const unsigned __int128 num_blocks =
      static_cast<unsigned __int128>(x.shape[0] * x.shape[2]) * blocks_per_head;
  if (num_blocks > kMaxDimension) {
    return invalid("batch * heads * ceil(seqlen / block_rows) = ",
                   static_cast<uint64_t>(num_blocks), " scales exceeds 2^31-1");
  }
  const Tensor scales = descale_tensor(descale, x, blocks_per_head);
  uint64_t lo = 0, hi = 0;
  if (!byte_span(scales, &lo, &hi)) {
    return invalid("descale: its ", static_cast<uint64_t>(num_blocks),
                   " floats address past the end of the address space");
  }
  if (self_overlapping(x_fp8)) {
    return invalid("x_fp8's strides make elements overlap; x_fp8 must not alias itself");
  }
  if (spans_intersect(x_fp8, x)) {
    return invalid("x_fp8 overlaps x in memory; the output must not alias the input");
  }
  if (spans_intersect(scales, x_fp8)) {
    return invalid("descale overlaps x_fp8 in memory; the outputs must not alias each other");
  }
  if (spans_intersect(scales, x)) {
    return invalid("descale overlaps x in memory; the output must not alias the input");
  }

  QuantizeParams p;
  p.x = x.data;
  p.x_fp8 = x_fp8.data;
  p.descale = descale;
  p.dtype = x.dtype;
  set_dims(x, &p);
  p.x_stride = strides_of(x);
  p.x_fp8_stride = strides_of(x_fp8);
  p.block_rows = options.block_rows;
  p.blocks_per_head = static_cast<int>(blocks_per_head);
  p.num_blocks = static_cast<int>(num_blocks);
  p.hadamard = options.hadamard;
  p.seed = options.seed;
  *params = p;
  return Status{};
}

// ---------------------------------------------------------------- FP8 forward

// Head dimensions the FP8 forward kernel is built for.
constexpr int64_t kFp8HeadDims[] = {128, 256};
// The FP8 kernel's tiles: a query descale block must cover whole tiles of
// query rows (one consumer warpgroup's 64), a key descale block whole key tiles.
constexpr int kFp8QueryDescaleRows = 64;
constexpr int kFp8KeyDescaleRows = 128;

bool fp8_headdim(int64_t d) { return one_of(kFp8HeadDims, d); }

// An Fp8V on its own: pointer, sizes, alignment, the layout's strides and
// span (set in *span).
Status check_fp8_v(const char* name, const Fp8V& v, Span* span) {
  if (v.data == nullptr) {
    return invalid(name, ".data is null");
  }
  const struct {
    const char* dim;
    int64_t value;
  } dims[] = {{"batch", v.batch}, {"seqlen", v.seqlen}, {"heads", v.heads}, {"headdim", v.headdim}};
  for (const auto& [dim, value] : dims) {
    if (value < 1) {
      return invalid(name, ".", dim, " = ", value, " must be at least 1");
    }
    if (value > kMaxDimension) {
      return invalid(name, ".", dim, " = ", value,
                     " exceeds 2^31-1, the largest size the kernels index with 32 bits");
    }
  }
  if (v.padded_seqlen() > kMaxDimension) {
    return invalid(name, ".seqlen = ", v.seqlen, " padded to a multiple of ", kFp8VKeyGroup, " (",
                   v.padded_seqlen(), ") exceeds 2^31-1");
  }
  if (reinterpret_cast<uintptr_t>(v.data) % kTmaAlignmentBytes != 0) {
    return invalid(name, ".data is not ", kTmaAlignmentBytes,
                   "-byte aligned, which 16-byte accesses (TMA, vectors) need");
  }
  // The layout's byte strides: padded_seqlen (headdim; a multiple of 16),
  // headdim * padded_seqlen (heads), heads * headdim * padded_seqlen (batch).
  using u128 = unsigned __int128;
  const u128 head_bytes = static_cast<u128>(v.headdim) * static_cast<u128>(v.padded_seqlen());
  const u128 batch_bytes = head_bytes * static_cast<u128>(v.heads);
  if (v.heads > 1 && head_bytes > static_cast<u128>(kTmaMaxStrideBytes)) {
    return invalid(name, ": headdim * padded_seqlen = ", static_cast<uint64_t>(head_bytes),
                   " bytes, the layout's head stride, exceeds the 2^40-byte stride limit of TMA");
  }
  if (v.batch > 1 && batch_bytes > static_cast<u128>(kTmaMaxStrideBytes)) {
    return invalid(name, ": heads * headdim * padded_seqlen = ", static_cast<uint64_t>(batch_bytes),
                   " bytes, the layout's batch stride, exceeds the 2^40-byte stride limit of TMA");
  }
  const u128 end = reinterpret_cast<uintptr_t>(v.data) + batch_bytes * static_cast<u128>(v.batch);
  if (end > std::numeric_limits<uint64_t>::max()) {
    return invalid(name, ": its batch * heads * headdim * padded_seqlen bytes address past the "
                   "end of the address space");
  }
  span->lo = reinterpret_cast<uintptr_t>(v.data);
  span->hi = static_cast<uint64_t>(end);
  return Status{};
}

// `name`'s four sizes equal those of the tensor `like` (named like_name).
Status check_fp8_v_shape(const char* name, const Fp8V& v, const char* like_name,
                         const Tensor& like) {
  const int64_t sizes[4] = {v.batch, v.seqlen, v.heads, v.headdim};
  for (int i = 0; i < 4; ++i) {
    if (sizes[i] != like.shape[i]) {
      return invalid(name, ".", kDimNames[i], " = ", sizes[i], " differs from ", like_name,
                     ".shape[", i, "] (", kDimNames[i], ") = ", like.shape[i]);
    }
  }
  return Status{};
}

// One descale of the FP8 forward, for `tensor` (q, k or v) with `seqlen`
// rows (named seqlen_name) of `heads` heads per batch: non-null, aligned,
// blocks of whole kernel tiles (`tile_rows`) or one block per head.
Status check_descale(const char* tensor, const Fp8Descale& d, int64_t batch, int64_t seqlen,
                     int64_t heads, int tile_rows, const char* tile_name,
                     const char* seqlen_name, DescaleParams* params, Span* span) {
  const std::string name = std::string("descales.") + tensor;
  if (d.data == nullptr) {
    return invalid(name, ".data is null: the FP8 forward needs the descale factors of ", tensor,
                   " (float32, (batch, heads, ceil(seqlen / block_rows)), as quantize_fp8 "
                   "writes them)");
  }
  if (reinterpret_cast<uintptr_t>(d.data) % alignof(float) != 0) {
    return invalid(name, ".data is not 4-byte aligned");
  }
  if (d.block_rows < 1) {
    return invalid(name, ".block_rows = ", d.block_rows, " must be positive");
  }
  if (d.block_rows % tile_rows != 0 && d.block_rows < seqlen) {
    return invalid(name, ".block_rows = ", d.block_rows, " must be a multiple of ", tile_rows,
                   " (the kernel's tile of ", tile_name, ") or at least ", seqlen_name, " = ",
                   seqlen, " (one scale per head)");
  }
  const int64_t blocks_per_head = (seqlen + d.block_rows - 1) / d.block_rows;
  const unsigned __int128 count = static_cast<unsigned __int128>(batch * heads) * blocks_per_head;
  if (count > kMaxDimension) {
    return invalid(name, ": batch * heads * ceil(", seqlen_name, " / block_rows) = ",
                   static_cast<uint64_t>(count), " scales exceeds 2^31-1");
  }
  const unsigned __int128 end =
      reinterpret_cast<uintptr_t>(d.data) + count * static_cast<unsigned __int128>(sizeof(float));
  if (end > std::numeric_limits<uint64_t>::max()) {
    return invalid(name, ": its ", static_cast<uint64_t>(count),
                   " floats address past the end of the address space");
  }
  span->lo = reinterpret_cast<uintptr_t>(d.data);
  span->hi = static_cast<uint64_t>(end);
  params->data = d.data;
  params->by_block_rows = FastDivisor::of(d.block_rows);
  params->blocks_per_head = static_cast<int>(blocks_per_head);
  return Status{};
}

Status check_forward_fp8(const Tensor& q, const Tensor& k, const Fp8V& v, const Tensor& out,
                         float* softmax_lse, const Fp8Descales& descales,
                         const ForwardOptions& options, ForwardParams* params) {
  if (Status s = check_tensor("q", q, fp8_input_dtype); !s.ok()) {
    return s;
  }
  if (Status s = check_tensor("k", k, fp8_input_dtype); !s.ok()) {
    return s;
  }
  Span v_span;
  if (Status s = check_fp8_v("v", v, &v_span); !s.ok()) {
    return s;
  }
  if (Status s = check_tensor("out", out, half_dtype); !s.ok()) {
    return s;
  }
  const struct {
    const char* name;
    const Tensor& t;
  } tensors[] = {{"k", k}, {"out", out}};
  for (const auto& [name, t] : tensors) {
    if (Status s = check_batch_and_headdim_match_q(name, t, q); !s.ok()) {
      return s;
    }
  }
  if (Status s = check_fp8_v_shape("v", v, "k", k); !s.ok()) {
    return s;
  }
  if (!fp8_headdim(q.shape[3])) {
    return unsupported("headdim = ", q.shape[3],
                       " is not supported by the FP8 forward; supported: 128, 256");
  }
  if (Status s = check_out_and_heads(q, k, out); !s.ok()) {
    return s;
  }

  ForwardParams p;
  Span q_scales, k_scales, v_scales;
  if (Status s = check_descale("q", descales.q, q.shape[0], q.shape[1], q.shape[2],
                               kFp8QueryDescaleRows, "query rows", "seqlen_q", &p.q_descale,
                               &q_scales);
      !s.ok()) {
    return s;
  }
  if (Status s = check_descale("k", descales.k, k.shape[0], k.shape[1], k.shape[2],
                               kFp8KeyDescaleRows, "keys", "seqlen_k", &p.k_descale, &k_scales);
      !s.ok()) {
    return s;
  }
  if (Status s = check_descale("v", descales.v, k.shape[0], k.shape[1], k.shape[2],
                               kFp8KeyDescaleRows, "keys", "seqlen_k", &p.v_descale, &v_scales);
      !s.ok()) {
    return s;
  }

  if (self_overlapping(out)) {
    return invalid("out's strides make elements overlap; out must not alias itself");
  }
  const Span out_span = span_of(out);
  const struct {
    const char* name;
    Span span;
  } inputs[] = {{"q", span_of(q)},
                {"k", span_of(k)},
                {"v", v_span},
                {"descales.q", q_scales},
                {"descales.k", k_scales},
                {"descales.v", v_scales}};
  for (const auto& [name, span] : inputs) {
    if (intersect(out_span, span)) {
      return invalid("out overlaps ", name, " in memory; the output must not alias an input");
    }
  }
  if (Status s = check_lse_and_options(q, softmax_lse, options); !s.ok()) {
    return s;
  }

  fill_forward(q, k, v.data, out, softmax_lse, options, &p);
  *params = p;
  return Status{};
}

Status check_fp8_v_layout(const Tensor& v, const Fp8V& v_out, Fp8VLayoutParams* params) {
  if (Status s = check_tensor("v", v, fp8_input_dtype); !s.ok()) {
    return s;
  }
  Span out_span;
  if (Status s = check_fp8_v("v_out", v_out, &out_span); !s.ok()) {
    return s;
  }
  if (Status s = check_fp8_v_shape("v_out", v_out, "v", v); !s.ok()) {
    return s;
  }
  if (!supported_headdim(v.shape[3])) {
    return unsupported("headdim = ", v.shape[3], " is not supported; supported: 64, 128, 256");
  }
  if (intersect(out_span, span_of(v))) {
    return invalid("v_out overlaps v in memory; the output must not alias the input");
  }

  Fp8VLayoutParams p;
  p.v = v.data;
  p.v_out = v_out.data;
  set_dims(v, &p);
  p.v_stride = strides_of(v);
  *params = p;
  return Status{};
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat8E4M3:
      return "float8_e4m3";
  }
  return "unknown";
}

Status validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        float* softmax_lse, const ForwardOptions& options,
                        ForwardParams* params) {
  return with_call(kForwardCall, check_forward(q, k, v, out, softmax_lse, options, params));
}

Status validate_quantize(const Tensor& x, const Tensor& x_fp8, float* descale,
                         const QuantizeOptions& options, QuantizeParams* params) {
  return with_call(kQuantizeCall, check_quantize(x, x_fp8, descale, options, params));
}

Status validate_forward_fp8(const Tensor& q, const Tensor& k, const Fp8V& v, const Tensor& out,
                            float* softmax_lse, const Fp8Descales& descales,
                            const ForwardOptions& options, ForwardParams* params) {
  return with_call(kForwardFp8Call,
                   check_forward_fp8(q, k, v, out, softmax_lse, descales, options, params));
}

Status validate_fp8_v_layout(const Tensor& v, const Fp8V& v_out, Fp8VLayoutParams* params) {
  return with_call(kFp8VLayoutCall, check_fp8_v_layout(v, v_out, params));
}

}  // namespace flash3::detail
