#include "validate_common.hpp"

#include "sm90/fwd/kv_cache.hpp"
#include "sm90/fwd/tail_split.hpp"
#include "sm90/head_dims.hpp"

#include <cmath>
#include <limits>
#include <utility>
#include <string>

namespace flash3::detail {

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

namespace validation {

const char* const kDimNames[4] = {"batch", "seqlen", "heads", "headdim"};

Status with_call(const char* call, Status s) {
  if (!s.ok()) {
    s.message = std::string(call) + ": " + s.message;
  }
  return s;
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

Status half_dtype(const char* name, DType dtype) {
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return invalid(name, ".dtype is ", dtype_name(dtype), "; ", name,
                   " must be float16 or bfloat16");
  }
  return Status{};
}

Status e4m3_dtype(const char* name, DType dtype) {
  if (dtype != DType::kFloat8E4M3) {
    return invalid(name, ".dtype is ", dtype_name(dtype), "; ", name, " must be float8_e4m3");
  }
  return Status{};
}

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

Span span_of(const Tensor& t) {
  Span s;
  byte_span(t, &s.lo, &s.hi);
  return s;
}

bool intersect(const Span& a, const Span& b) { return a.lo < b.hi && b.lo < a.hi; }

bool spans_intersect(const Tensor& a, const Tensor& b) { return intersect(span_of(a), span_of(b)); }

bool elements_intersect(const Tensor& a, const Tensor& b) {
  if (!spans_intersect(a, b)) {
    return false;
  }
  // Rows interleaved, as the views of one packed (batch, seqlen, heads,
  // headdim) buffer are: the same batch and sequence strides, and each one's
  // part of a row (its heads) within one row stride, side by side.
  if (a.dtype != b.dtype || a.shape[0] != b.shape[0] || a.shape[1] != b.shape[1] ||
      a.stride[0] != b.stride[0] || a.stride[1] != b.stride[1]) {
    return true;
  }
  const int64_t bytes = element_bytes(a.dtype);
  const int64_t row = a.stride[1] * bytes;
  const auto width = [&](const Tensor& t) {
    return ((t.shape[2] - 1) * t.stride[2] + t.shape[3]) * bytes;
  };
  const bool a_first = reinterpret_cast<uintptr_t>(a.data) <= reinterpret_cast<uintptr_t>(b.data);
  const Tensor& lo = a_first ? a : b;
  const Tensor& hi = a_first ? b : a;
  const int64_t delta = static_cast<int64_t>(reinterpret_cast<uintptr_t>(hi.data) -
                                             reinterpret_cast<uintptr_t>(lo.data));
  return !(delta >= width(lo) && delta + width(hi) <= row);
}

bool float_span(const float* data, uint64_t count, Span* span) {
  const unsigned __int128 end =
      reinterpret_cast<uintptr_t>(data) + count * static_cast<unsigned __int128>(sizeof(float));
  if (end > std::numeric_limits<uint64_t>::max()) {
    return false;
  }
  span->lo = reinterpret_cast<uintptr_t>(data);
  span->hi = static_cast<uint64_t>(end);
  return true;
}

Status check_headdim(int64_t d, HeadDimsOf of) {
  const auto check = [d](auto dims) {
    return contains(dims, d) ? Status{}
                             : unsupported("headdim = ", d, " is not supported; supported: ",
                                           list_text(dims));
  };
  switch (of) {
    case HeadDimsOf::kForward: return check(ForwardHeadDims{});
    case HeadDimsOf::kBackward: return check(BackwardHeadDims{});
    default: return check(HeadDims{});
  }
}

Status check_headdim_first(const Tensor& q, HeadDimsOf of) {
  return q.shape[3] > 0 ? check_headdim(q.shape[3], of) : Status{};
}

Status check_value_headdim_first(const Tensor& q, const Tensor& v, const char* v_name,
                                 HeadDimsOf of) {
  if (v.shape[3] <= 0 || v.shape[3] == q.shape[3]) {
    return Status{};
  }
  const int d = static_cast<int>(q.shape[3]);
  const bool backward = of == HeadDimsOf::kBackward;
  const auto listed = [&](auto values) {
    return contains(values, v.shape[3])
               ? Status{}
               : unsupported(v_name, ".shape[3] (headdim) = ", v.shape[3], " differs from q's ", d,
                             backward ? "; in the backward, v's" : "; v's",
                             " head dim beside q's ", d, " must be one of ", list_text(values));
  };
  const auto pairs = [&](auto headdim) {
    constexpr int kHeadDim = decltype(headdim)::value;
    return backward ? listed(BackwardValueDims<kHeadDim>{}) : listed(ForwardValueDims<kHeadDim>{});
  };
  const auto none = [] { return Status{}; };
  return backward ? visit_head_dim(BackwardHeadDims{}, d, pairs, none)
                  : visit_head_dim(ForwardHeadDims{}, d, pairs, none);
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

Status check_headdim_like(const char* name, const Tensor& t, const char* like_name,
                          const Tensor& like) {
  if (t.shape[3] != like.shape[3]) {
    return invalid(name, ".shape[3] (headdim) = ", t.shape[3], " differs from ", like_name, "'s ",
                   like.shape[3]);
  }
  return Status{};
}

Status check_batch_and_headdim_match_q(const char* name, const Tensor& t, const Tensor& q) {
  if (Status s = check_headdim_like(name, t, "q", q); !s.ok()) {
    return s;
  }
  if (t.shape[0] != q.shape[0]) {
    return invalid(name, ".shape[0] (batch) = ", t.shape[0], " differs from q's ", q.shape[0]);
  }
  return Status{};
}

// ------------------------------------------------- shared by the attention calls

Status check_softmax_scale(float softmax_scale) {
  if (!std::isfinite(softmax_scale) || softmax_scale < 0.0f) {
    return invalid("options.softmax_scale = ", softmax_scale,
                   " must be positive and finite (or 0 for 1/sqrt(headdim))");
  }
  return Status{};
}

template <class Options>
Status check_mask_options(const Options& options) {
  if (options.window_left < -1 || options.window_right < -1) {
    return invalid("options.window_left, window_right = (", options.window_left, ", ",
                   options.window_right, "): each is a key count, or -1 for unbounded");
  }
  if (options.attention_chunk < 0) {
    return invalid("options.attention_chunk = ", options.attention_chunk,
                   ": a key count, or 0 for none");
  }
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f) {
    return invalid("options.softcap = ", options.softcap, " must be finite and 0 (none) or more");
  }
  return Status{};
}
template Status check_mask_options(const ForwardOptions&);
template Status check_mask_options(const BackwardOptions&);

float resolve_softmax_scale(float softmax_scale, int headdim) {
  return softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(headdim));
}

Status check_lse_rows(const Tensor& q) {
  const int64_t lse_rows = q.shape[0] * q.shape[2];
  if (lse_rows > kMaxDimension) {
    return invalid("batch * heads_q = ", lse_rows, " exceeds 2^31-1");
  }
  return Status{};
}

Status check_heads(const Tensor& q, const Tensor& k) {
  if (q.shape[2] % k.shape[2] != 0) {
    return invalid("q.shape[2] (heads_q) = ", q.shape[2],
                   " is not a multiple of k.shape[2] (heads_k) = ", k.shape[2]);
  }
  return Status{};
}

Status check_out_and_heads(const Tensor& q, const Tensor& k, const Tensor& out) {
  if (out.shape[1] != q.shape[1] || out.shape[2] != q.shape[2]) {
    return invalid("out.shape (", out.shape[0], ", ", out.shape[1], ", ", out.shape[2], ", ",
                   out.shape[3], ") differs from q.shape (", q.shape[0], ", ", q.shape[1], ", ",
                   q.shape[2], ", ", q.shape[3], ")");
  }
  return check_heads(q, k);
}

Span sinks_span(const Tensor& q, const ForwardOptions& options) {
  Span span;
  if (options.sinks != nullptr) {
    float_span(options.sinks, static_cast<uint64_t>(q.shape[2]), &span);
  }
  return span;
}

Status check_head_floats(const char* name, const float* data, const Tensor& q, Span* span) {
  *span = Span{};
  if (data == nullptr) {
    return Status{};
  }
  if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {
    return invalid(name, " is not 4-byte aligned");
  }
  if (!float_span(data, static_cast<uint64_t>(q.shape[2]), span)) {
    return invalid(name, ": its heads_q floats address past the end of the address space");
  }
  return Status{};
}

Status check_lse_and_options(const Tensor& q, float* softmax_lse, const ForwardOptions& options,
                             const Span& out_span) {
  if (softmax_lse != nullptr && reinterpret_cast<uintptr_t>(softmax_lse) % alignof(float) != 0) {
    return invalid("softmax_lse is not 4-byte aligned");
  }
  Span sinks;
  if (Status s = check_head_floats("options.sinks", options.sinks, q, &sinks); !s.ok()) {
    return s;
  }
  for (const auto& [name, written] : {std::pair<const char*, Span>{"out", out_span},
                                      {"softmax_lse", lse_span(q, softmax_lse)}}) {
    if (intersect(sinks, written)) {
      return invalid("options.sinks overlaps ", name,
                     "; the call writes there while it reads the sinks");
    }
  }
  if (Status s = check_mask_options(options); !s.ok()) {
    return s;
  }
  if (Status s = check_softmax_scale(options.softmax_scale); !s.ok()) {
    return s;
  }
  return check_lse_rows(q);
}

Span lse_span(const Tensor& q, const float* softmax_lse) {
  Span span;
  if (softmax_lse != nullptr) {
    float_span(softmax_lse, static_cast<uint64_t>(q.shape[0] * q.shape[1] * q.shape[2]), &span);
  }
  return span;
}

Status check_workspace(const void* workspace, size_t bytes, size_t align,
                       std::initializer_list<NamedSpan> spans) {
  if (reinterpret_cast<uintptr_t>(workspace) % align != 0) {
    return invalid("options.workspace is not ", align, "-byte aligned");
  }
  const unsigned __int128 end =
      static_cast<unsigned __int128>(reinterpret_cast<uintptr_t>(workspace)) + bytes;
  if (end > std::numeric_limits<uint64_t>::max()) {
    return invalid("options.workspace: its ", bytes,
                   " bytes address past the end of the address space");
  }
  const Span span{reinterpret_cast<uintptr_t>(workspace), static_cast<uint64_t>(end)};
  for (const auto& [name, other] : spans) {
    if (intersect(span, other)) {
      return invalid("options.workspace overlaps ", name,
                     " in memory; the workspace must not alias a tensor");
    }
  }
  return Status{};
}

Status check_forward_workspace(const ForwardOptions& options,
                               std::initializer_list<NamedSpan> spans) {
  if (options.workspace == nullptr) {
    return Status{};
  }
  return check_workspace(options.workspace, options.workspace_bytes,
                         sm90::fwd::PartialWorkspace::kAlign, spans);
}

void fill_forward(const Tensor& q, const Tensor& k, const void* v, const Tensor& out,
                  float* softmax_lse, const ForwardOptions& options, ForwardParams* p) {
  p->headdim_v = static_cast<int>(out.shape[3]);  // v's (the callers check they match)
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
  p->softmax_scale = resolve_softmax_scale(options.softmax_scale, p->headdim);
  p->causal = options.causal;
  p->window_left = options.window_left;
  p->window_right = options.window_right;
  p->attention_chunk = options.attention_chunk;
  p->softcap = options.softcap;
  p->workspace = options.workspace;
  p->workspace_bytes = options.workspace != nullptr ? options.workspace_bytes : 0;
  p->sinks = options.sinks;
}

Status check_index_array(const IndexArray& a) {
  if (a.data == nullptr) {
    return a.required ? invalid(a.name, " is null") : Status{};
  }
  if (reinterpret_cast<uintptr_t>(a.data) % alignof(int) != 0) {
    return invalid(a.name, " is not 4-byte aligned");
  }
  return Status{};
}

std::array<IndexArray, 4> index_arrays_of(const Varlen& varlen) {
  const int64_t batch = varlen.batch;
  return {IndexArray{"varlen.cu_seqlens_q", varlen.cu_seqlens_q, batch + 1, true},
          IndexArray{"varlen.cu_seqlens_k", varlen.cu_seqlens_k, batch + 1, true},
          IndexArray{"varlen.seqused_q", varlen.seqused_q, batch, false},
          IndexArray{"varlen.seqused_k", varlen.seqused_k, batch, false}};
}

Span span_of(const IndexArray& a) {
  const uint64_t lo = reinterpret_cast<uintptr_t>(a.data);
  return a.data == nullptr ? Span{} : Span{lo, lo + static_cast<uint64_t>(a.count) * sizeof(int)};
}

Status check_cache_layout(const Tensor& q, const Tensor& k_cache, const KvCache& cache,
                          int64_t* capacity, int64_t* table_rows) {
  const int64_t batch = q.shape[0];
  if (cache.page_table == nullptr) {
    if (cache.pages_per_batch != 0 || cache.page_table_rows != 0) {
      return invalid("cache.pages_per_batch = ", cache.pages_per_batch,
                     " and cache.page_table_rows = ", cache.page_table_rows,
                     " without a cache.page_table (both must be 0)");
    }
    if (cache.cache_batch_idx == nullptr && k_cache.shape[0] != batch) {
      return invalid("k_cache.shape[0] (batch) = ", k_cache.shape[0], " differs from q's ", batch,
                     " (give cache.cache_batch_idx for a cache of its own batches)");
    }
    *capacity = k_cache.shape[1];
    *table_rows = 0;
    return Status{};
  }
  const int64_t page_size = k_cache.shape[1];
  if (page_size % sm90::fwd::kPageBoxRows != 0) {
    return unsupported("k_cache.shape[1] (page size) = ", page_size,
                       ": paged caches take page sizes that are multiples of ",
                       sm90::fwd::kPageBoxRows);
  }
  if (cache.pages_per_batch < 1) {
    return invalid("cache.pages_per_batch = ", cache.pages_per_batch,
                   " must be at least 1 with a page_table");
  }
  const int64_t rows = cache.page_table_rows == 0 ? batch : cache.page_table_rows;
  if (rows < 1 || (cache.cache_batch_idx == nullptr && rows != batch)) {
    return invalid("cache.page_table_rows = ", cache.page_table_rows,
                   ": the page table has one row per batch (", batch,
                   ") unless cache.cache_batch_idx picks the rows");
  }
  if (page_size * cache.pages_per_batch > std::numeric_limits<int32_t>::max() ||
      rows * cache.pages_per_batch > std::numeric_limits<int32_t>::max()) {
    return invalid("cache.pages_per_batch = ", cache.pages_per_batch,
                   ": the capacity (pages_per_batch x page size) and the page table's "
                   "entries (rows x pages_per_batch) must be below 2^31");
  }
  *capacity = page_size * cache.pages_per_batch;
  *table_rows = rows;
  return Status{};
}

}  // namespace validation
}  // namespace flash3::detail
