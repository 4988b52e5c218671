// The argument checks of flash3::kvcache_append.
#include <climits>
#include <initializer_list>
#include <iterator>
#include <utility>

#include "sm90/fwd/kv_cache.hpp"
#include "validate_common.hpp"

namespace flash3::detail {
namespace {

using namespace validation;

// The append's tensors: 16-bit; FP8 is a path not built yet (unsupported, as
// the forward's forward_dtype says), anything else invalid.
Status append_dtype(const char* name, DType dtype) {
  if (dtype == DType::kFloat8E4M3) {
    return unsupported(name, ".dtype is float8_e4m3: appending to a KV cache has no FP8 path "
                       "yet; use float16 or bfloat16");
  }
  return half_dtype(name, dtype);
}

// t's first `dims` sizes those of u (3: all but the head dim, which v may
// have of its own).
Status check_same_shape(const char* name, const Tensor& t, const char* like, const Tensor& u,
                        int dims = 4) {
  for (int i = 0; i < dims; ++i) {
    if (t.shape[i] != u.shape[i]) {
      return invalid(name, ".shape[", i, "] = ", t.shape[i], " differs from ", like, "'s ",
                     u.shape[i]);
    }
  }
  return Status{};
}

Status check_append(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                    const KvCache& cache, const KvCacheAppend& a, KvAppendParams* p) {
  const bool rotary = a.rotary_cos != nullptr || a.rotary_sin != nullptr;
  if (Status s = check_headdim_first(q, HeadDimsOf::kForward); !s.ok()) {
    return s;
  }
  if (Status s = check_value_headdim_first(q, v_cache, "v_cache"); !s.ok()) {
    return s;
  }
  const std::pair<const char*, const Tensor&> tensors[] = {
      {"q", q}, {"k_cache", k_cache}, {"v_cache", v_cache},
      {"append.k_new", a.k_new}, {"append.v_new", a.v_new}};
  for (const auto& [name, t] : tensors) {
    if (Status s = check_tensor(name, t, append_dtype); !s.ok()) {
      return s;
    }
    if (t.dtype != q.dtype) {
      return invalid(name, ".dtype (", dtype_name(t.dtype), ") differs from q.dtype (",
                     dtype_name(q.dtype), ")");
    }
    const bool of_v = &t == &a.v_new;  // whose head dim t has: v_cache's, else q's
    if (Status s = check_headdim_like(name, t, of_v ? "v_cache" : "q", of_v ? v_cache : q);
        &t != &v_cache && !s.ok()) {
      return s;
    }
  }
  if (Status s = check_same_shape("v_cache", v_cache, "k_cache", k_cache, 3); !s.ok()) {
    return s;
  }
  if (Status s = check_heads(q, k_cache); !s.ok()) {
    return s;
  }
  if (a.k_new.shape[0] != q.shape[0]) {
    return invalid("append.k_new.shape[0] (batch) = ", a.k_new.shape[0], " differs from q's ",
                   q.shape[0]);
  }
  if (a.k_new.shape[2] != k_cache.shape[2]) {
    return invalid("append.k_new.shape[2] (heads) = ", a.k_new.shape[2], " differs from k_cache's ",
                   k_cache.shape[2]);
  }
  if (Status s = check_same_shape("append.v_new", a.v_new, "append.k_new", a.k_new, 3); !s.ok()) {
    return s;
  }

  // The cache, as forward_kvcache takes it.
  const int64_t batch = q.shape[0];
  int64_t capacity = 0, table_rows = 0;
  if (Status s = check_cache_layout(q, k_cache, cache, &capacity, &table_rows); !s.ok()) {
    return s;
  }
  if (capacity + a.k_new.shape[1] > INT_MAX) {
    return invalid("the cache's capacity (", capacity, ") plus append.k_new's rows (",
                   a.k_new.shape[1], ") must be below 2^31");
  }

  // Rotary tables.
  if (rotary) {
    if (a.rotary_cos == nullptr || a.rotary_sin == nullptr) {
      return invalid("append.rotary_", a.rotary_cos == nullptr ? "cos" : "sin",
                     " is null while the other rotary table is given");
    }
    if (a.rotary_dim < 2 || a.rotary_dim % 2 != 0 || a.rotary_dim > q.shape[3]) {
      return invalid("append.rotary_dim = ", a.rotary_dim, " must be even and in [2, headdim = ",
                     q.shape[3], "]");
    }
    if (a.rotary_rows < capacity) {
      return invalid("append.rotary_rows = ", a.rotary_rows,
                     " must cover every position of the cache (capacity ", capacity, ")");
    }
    for (const auto& [name, table] :
         {std::pair<const char*, const void*>{"append.rotary_cos", a.rotary_cos},
          {"append.rotary_sin", a.rotary_sin}}) {
      if (reinterpret_cast<uintptr_t>(table) % element_bytes(q.dtype) != 0) {
        return invalid(name, " is not aligned to its ", element_bytes(q.dtype), "-byte elements");
      }
    }
    if (Status s = check_tensor("append.q_rotated", a.q_rotated, half_dtype); !s.ok()) {
      return s;
    }
    if (a.q_rotated.dtype != q.dtype) {
      return invalid("append.q_rotated.dtype (", dtype_name(a.q_rotated.dtype),
                     ") differs from q.dtype (", dtype_name(q.dtype), ")");
    }
    if (Status s = check_same_shape("append.q_rotated", a.q_rotated, "q", q); !s.ok()) {
      return s;
    }
    if (self_overlapping(a.q_rotated)) {
      return invalid("append.q_rotated's strides make elements overlap");
    }
  } else if (a.rotary_dim != 0) {
    return invalid("append.rotary_dim = ", a.rotary_dim, " without rotary tables");
  }

  // Device arrays: read (cache_seqlens, cache_batch_idx, page_table,
  // rotary_seqlens) and written (seqlens_out).
  if (a.rotary_seqlens != nullptr && !rotary) {
    return invalid("append.rotary_seqlens is given without rotary tables");
  }
  const IndexArray seqlens_out{"append.seqlens_out", a.seqlens_out, batch, true};
  const IndexArray read[] = {
      {"cache.cache_seqlens", cache.cache_seqlens, batch, true},
      {"append.rotary_seqlens", a.rotary_seqlens, batch, false},
      {"cache.cache_batch_idx", cache.cache_batch_idx, batch, false},
      {"cache.page_table", cache.page_table, table_rows * cache.pages_per_batch, false}};
  if (Status s = check_index_array(seqlens_out); !s.ok()) {
    return s;
  }
  for (const IndexArray& array : read) {
    if (Status s = check_index_array(array); !s.ok()) {
      return s;
    }
  }

  // What the kernel writes must not overlap anything it reads (or writes).
  const Span out_spans[] = {span_of(k_cache), span_of(v_cache),
                            rotary ? span_of(a.q_rotated) : Span{}, span_of(seqlens_out)};
  const char* out_names[] = {"k_cache", "v_cache", "append.q_rotated", "append.seqlens_out"};
  const Span in_spans[] = {span_of(q),       span_of(a.k_new),   span_of(a.v_new),
                           span_of(read[0]), span_of(read[2]),   span_of(read[3]),
                           span_of(read[1])};
  const char* in_names[] = {"q", "append.k_new", "append.v_new", "cache.cache_seqlens",
                            "cache.cache_batch_idx", "cache.page_table", "append.rotary_seqlens"};
  for (size_t i = 0; i < std::size(out_spans); ++i) {
    for (size_t j = 0; j < std::size(in_spans); ++j) {
      if (intersect(out_spans[i], in_spans[j])) {
        return invalid(out_names[i], " overlaps ", in_names[j],
                       "; the call writes there while it reads it");
      }
    }
    for (size_t j = i + 1; j < std::size(out_spans); ++j) {
      if (intersect(out_spans[i], out_spans[j])) {
        return invalid(out_names[i], " overlaps ", out_names[j]);
      }
    }
  }

  p->q = q.data;
  p->q_rotated = rotary ? a.q_rotated.data : nullptr;
  p->k_new = a.k_new.data;
  p->v_new = a.v_new.data;
  p->k_cache = k_cache.data;
  p->v_cache = v_cache.data;
  p->cache_seqlens = cache.cache_seqlens;
  p->cache_batch_idx = cache.cache_batch_idx;
  p->page_table = cache.page_table;
  p->seqlens_out = a.seqlens_out;
  p->rotary_cos = rotary ? a.rotary_cos : nullptr;
  p->rotary_sin = rotary ? a.rotary_sin : nullptr;
  p->rotary_seqlens = a.rotary_seqlens;
  p->dtype = q.dtype;
  p->batch = static_cast<int>(batch);
  p->seqlen_q = static_cast<int>(q.shape[1]);
  p->seqlen_new = static_cast<int>(a.k_new.shape[1]);
  p->heads_q = static_cast<int>(q.shape[2]);
  p->heads_k = static_cast<int>(k_cache.shape[2]);
  p->headdim = static_cast<int>(q.shape[3]);
  p->headdim_v = static_cast<int>(v_cache.shape[3]);
  p->kv_batch = static_cast<int>(k_cache.shape[0]);
  p->kv_rows = static_cast<int>(k_cache.shape[1]);
  p->capacity = static_cast<int>(capacity);
  p->pages_per_batch = cache.pages_per_batch;
  p->page_table_rows = static_cast<int>(table_rows);
  p->rotary_dim = rotary ? a.rotary_dim : 0;
  p->rotary_rows = rotary ? a.rotary_rows : 0;
  p->rotary_interleaved = a.rotary_interleaved;
  p->causal = a.causal;
  p->q_stride = strides_of(q);
  p->q_rotated_stride = rotary ? strides_of(a.q_rotated) : Strides3{};
  p->k_new_stride = strides_of(a.k_new);
  p->v_new_stride = strides_of(a.v_new);
  p->k_cache_stride = strides_of(k_cache);
  p->v_cache_stride = strides_of(v_cache);
  return Status{};
}

}  // namespace

Status validate_kvcache_append(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const KvCache& cache, const KvCacheAppend& append,
                               KvAppendParams* params) {
  return with_call(kKvAppendCall, check_append(q, k_cache, v_cache, cache, append, params));
}

}  // namespace flash3::detail
