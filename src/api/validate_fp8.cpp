// The argument checks of flash3::forward_fp8 and flash3::fp8_v_layout.
#include <cstdint>
#include <limits>
#include <string>

#include "sm90/head_dims.hpp"
#include "validate_common.hpp"

namespace flash3::detail {
namespace {

using namespace validation;

// q and k of the FP8 forward, and v of fp8_v_layout.
Status fp8_input_dtype(const char* name, DType dtype) {
  Status s = e4m3_dtype(name, dtype);
  if (!s.ok()) {
    s.message += " (quantize_fp8 writes it)";
  }
  return s;
}

// The FP8 kernel's tiles: a query descale block must cover whole tiles of
// query rows (one consumer warpgroup's 64), a key descale block whole key tiles.
constexpr int kFp8QueryDescaleRows = 64;
constexpr int kFp8KeyDescaleRows = 128;

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
  if (q.shape[3] > 0 && !contains(Fp8HeadDims{}, q.shape[3])) {  // as check_headdim_first
    return unsupported("headdim = ", q.shape[3], " is not supported by the FP8 forward; supported: ",
                       list_text(Fp8HeadDims{}));
  }
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
  if (Status s = check_lse_and_options(q, softmax_lse, options, out_span); !s.ok()) {
    return s;
  }
  if (options.softcap > 0.0f) {
    return unsupported("options.softcap = ", options.softcap,
                       ": the FP8 forward has no softcap yet");
  }
  if (options.window_left >= 0 || options.window_right >= 0 || options.attention_chunk > 0) {
    return unsupported("options.window_left, window_right, attention_chunk = (",
                       options.window_left, ", ", options.window_right, ", ",
                       options.attention_chunk, "): the FP8 forward has no sliding window yet");
  }
  if (Status s = check_forward_workspace(
          options, {{"q", span_of(q)}, {"k", span_of(k)}, {"v", v_span}, {"out", out_span},
                    {"softmax_lse", lse_span(q, softmax_lse)},
                    {"options.sinks", sinks_span(q, options)}, {"descales.q", q_scales},
                    {"descales.k", k_scales}, {"descales.v", v_scales}});
      !s.ok()) {
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
  if (Status s = check_headdim(v.shape[3]); !s.ok()) {
    return s;
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

namespace validation {

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

}  // namespace validation

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
