// What the argument checks of the public calls share (validate_*.cpp): the
// limits, message helpers, the check of one Tensor, byte spans and overlap
// tests, and the pieces both forwards use. Pure host code, like validate.hpp.
#pragma once

#include <array>
#include <initializer_list>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <utility>

#include "flash3/flash3.hpp"
#include "sm90/problem.hpp"
#include "validate.hpp"

namespace flash3::detail::validation {

// TMA (cp.async.bulk.tensor) limits, from the CUDA driver's cuTensorMapEncodeTiled.
inline constexpr int64_t kTmaAlignmentBytes = 16;  // base address and every stride (also
                                                   // the quantization kernel's vector accesses)
inline constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;
// Tile coordinates and row indices are 32-bit signed inside the kernels.
inline constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();

extern const char* const kDimNames[4];  // batch, seqlen, heads, headdim

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

// "<call>: <message>" for an error; an ok Status as it is.
Status with_call(const char* call, Status s);

// Bytes per element; 0 for a value outside the enum.
int64_t element_bytes(DType dtype);
bool known_dtype(DType dtype);

// Whether a call takes a tensor of this (known) dtype.
using DTypeRule = Status (*)(const char* name, DType dtype);

// float16 or bfloat16 (the input of quantize_fp8, the output of the FP8 forward).
Status half_dtype(const char* name, DType dtype);
// float8_e4m3 (the output of quantize_fp8).
Status e4m3_dtype(const char* name, DType dtype);

// Byte span [lo, hi) that a tensor's elements occupy; false if it overflows.
bool byte_span(const Tensor& t, uint64_t* lo, uint64_t* hi);

// One tensor on its own: pointer, dtype (known, and one `accepts` takes),
// shape, strides, alignment.
Status check_tensor(const char* name, const Tensor& t, DTypeRule accepts);

// True if two distinct index tuples of `t` can reach the same element.
bool self_overlapping(const Tensor& t);

// Byte span [lo, hi) of something already checked not to overflow.
struct Span {
  uint64_t lo = 0;
  uint64_t hi = 0;
};

Span span_of(const Tensor& t);
bool intersect(const Span& a, const Span& b);
bool spans_intersect(const Tensor& a, const Tensor& b);
// Whether some element of a may be an element of b: their spans meet, and
// they are not the side-by-side views of one packed buffer.
bool elements_intersect(const Tensor& a, const Tensor& b);

// An Fp8V on its own: pointer, sizes, alignment, the layout's strides and
// span (set in *span); and its four sizes against those of the tensor `like`
// (validate_fp8.cpp).
Status check_fp8_v(const char* name, const Fp8V& v, Span* span);
Status check_fp8_v_shape(const char* name, const Fp8V& v, const char* like_name,
                         const Tensor& like);

// The span of `count` floats at `data`; false if it passes the end of the
// address space.
bool float_span(const float* data, uint64_t count, Span* span);

// A caller's workspace, of which the kernels use `bytes`: aligned to
// `align`, inside the address space, not aliasing any of `spans`.
struct NamedSpan {
  const char* name;
  Span span;
};
Status check_workspace(const void* workspace, size_t bytes, size_t align,
                       std::initializer_list<NamedSpan> spans);
// options.workspace of a forward, when given: check_workspace over its
// workspace_bytes (its size against this device's need is checked at
// dispatch).
// The span of a forward's softmax_lse ((batch, heads_q, seqlen_q) floats;
// empty when null), after check_lse_and_options.
Span lse_span(const Tensor& q, const float* softmax_lse);
Status check_forward_workspace(const ForwardOptions& options,
                               std::initializer_list<NamedSpan> spans);

// Unsupported (naming the head dims the kernels have) unless d is one of
// them (sm90/head_dims.hpp): the 16-bit forward's (kForward, with the
// KV-cache append), the backward's, or the others' (quantization, the FP8 V
// layout).
enum class HeadDimsOf { kForward, kBackward, kOthers };
Status check_headdim(int64_t d, HeadDimsOf of = HeadDimsOf::kOthers);
// check_headdim of q's head dim when it is positive, before the tensors'
// own checks: a head dim without a kernel (d = 59) is refused as such rather
// than blamed on the strides it makes (59 x 2 bytes is not a multiple of 16).
Status check_headdim_first(const Tensor& q, HeadDimsOf of = HeadDimsOf::kOthers);
// The 16-bit forward's v (kForward) or the backward's (kBackward): of q's
// head dim, or of another that ForwardValueDims / BackwardValueDims lists
// beside it (head_dims.hpp), else kUnsupported saying which (q's head dim
// checked first; v's other checks after this).
Status check_value_headdim_first(const Tensor& q, const Tensor& v, const char* v_name = "v",
                                 HeadDimsOf of = HeadDimsOf::kForward);

// The (batch, seqlen, heads, headdim) sizes of a validated tensor into params.
template <class Params>
void set_dims(const Tensor& t, Params* p) {
  p->batch = static_cast<int>(t.shape[0]);
  p->seqlen = static_cast<int>(t.shape[1]);
  p->heads = static_cast<int>(t.shape[2]);
  p->headdim = static_cast<int>(t.shape[3]);
}

// The element strides the kernels use; size-1 dimensions get a harmless one.
Strides3 strides_of(const Tensor& t);

// t's head dim that of `like` (named like_name: q, or v for out).
Status check_headdim_like(const char* name, const Tensor& t, const char* like_name,
                          const Tensor& like);
// t's batch and head dim equal q's.
Status check_batch_and_headdim_match_q(const char* name, const Tensor& t, const Tensor& q);

// ------------------------------------------------- shared by the attention calls

// options.softmax_scale positive and finite, or 0.
Status check_softmax_scale(float softmax_scale);
// The masked kernels' options, forward and backward alike: window_left,
// window_right -1 or more, attention_chunk 0 or more, softcap finite and 0
// or more.
template <class Options>
Status check_mask_options(const Options& options);
// The scale the kernels use: softmax_scale, or 1/sqrt(headdim) for 0.
float resolve_softmax_scale(float softmax_scale, int headdim);
// batch * heads_q rows of log-sum-exp fit the kernels' 32-bit indices.
Status check_lse_rows(const Tensor& q);

// q's heads are a multiple of k's (GQA/MQA).
Status check_heads(const Tensor& q, const Tensor& k);

// out is shaped like q (seqlen, heads); q's heads are a multiple of k's.
Status check_out_and_heads(const Tensor& q, const Tensor& k, const Tensor& out);

// softmax_lse (optional) aligned, the scale, the number of lse rows.
// (and options.sinks: aligned, apart from out_span and softmax_lse)
Status check_lse_and_options(const Tensor& q, float* softmax_lse, const ForwardOptions& options,
                             const Span& out_span);
// The bytes of options.sinks (heads_q floats of q's), empty when null.
Span sinks_span(const Tensor& q, const ForwardOptions& options);
// A per-head float32 array (sinks, dsinks: q's heads_q floats) named `name`:
// null (an empty *span), or 4-byte aligned and within the address space.
Status check_head_floats(const char* name, const float* data, const Tensor& q, Span* span);

// An int32 device array a call reads or writes (varlen offsets, cache
// lengths, page tables): `count` entries at data, which may be null unless
// `required`.
struct IndexArray {
  const char* name;
  const int* data;
  int64_t count;
  bool required;
};
// Null (an error where required) or 4-byte aligned.
Status check_index_array(const IndexArray& a);
// A varlen batch's offsets and counts (flash3.hpp: Varlen), as the forward
// and the backward check them.
std::array<IndexArray, 4> index_arrays_of(const Varlen& varlen);
// Its bytes; empty when null.
Span span_of(const IndexArray& a);

// A KV cache's layout as forward_kvcache and kvcache_append take it
// (flash3.hpp: KvCache): contiguous k_cache with q's batches (or any with
// cache_batch_idx), or a paged pool with its page table. On success sets
// *capacity (key slots per batch) and *table_rows (the page table's rows;
// 0 when not paged).
Status check_cache_layout(const Tensor& q, const Tensor& k_cache, const KvCache& cache,
                          int64_t* capacity, int64_t* table_rows);

// The fields both forwards share (v's layout and the descales are the caller's).
void fill_forward(const Tensor& q, const Tensor& k, const void* v, const Tensor& out,
                  float* softmax_lse, const ForwardOptions& options, ForwardParams* p);

}  // namespace flash3::detail::validation
