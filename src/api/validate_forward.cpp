// The argument checks of flash3::forward.
#include <algorithm>
#include <climits>
#include <iterator>
#include <utility>

#include "sm90/fwd/kv_cache.hpp"
#include "sm90/fwd/tail_split.hpp"
#include "validate_common.hpp"

namespace flash3::detail {
namespace {

using namespace validation;

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

// kv_own_batch: k and v may have a batch count of their own (a KV cache
// indexed by cache_batch_idx), the same for both. k has q's head dim, out
// v's (check_value_headdim_first).
Status check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     float* softmax_lse, const ForwardOptions& options, ForwardParams* params,
                     bool kv_own_batch = false) {
  const struct {
    const char* name;
    const Tensor& t;
  } tensors[] = {{"q", q}, {"k", k}, {"v", v}, {"out", out}};
  if (Status s = check_headdim_first(q, HeadDimsOf::kForward); !s.ok()) {
    return s;
  }
  if (Status s = check_value_headdim_first(q, v); !s.ok()) {
    return s;
  }
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
    const bool of_v = &t == &out;  // whose head dim t has: v's, else q's (v: its own)
    if (Status s = check_headdim_like(name, t, of_v ? "v" : "q", of_v ? v : q);
        &t != &v && !s.ok()) {
      return s;
    }
    if (!(kv_own_batch && (&t == &k || &t == &v)) && t.shape[0] != q.shape[0]) {
      return invalid(name, ".shape[0] (batch) = ", t.shape[0], " differs from q's ", q.shape[0]);
    }
  }
  if (v.shape[0] != k.shape[0]) {
    return invalid("v.shape[0] (batch) = ", v.shape[0], " differs from k's ", k.shape[0]);
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
  if (Status s = check_lse_and_options(q, softmax_lse, options, span_of(out)); !s.ok()) {
    return s;
  }
  if (Status s = check_forward_workspace(
          options, {{"q", span_of(q)}, {"k", span_of(k)}, {"v", span_of(v)}, {"out", span_of(out)},
                    {"softmax_lse", lse_span(q, softmax_lse)},
                    {"options.sinks", sinks_span(q, options)}});
      !s.ok()) {
    return s;
  }

  ForwardParams p;
  fill_forward(q, k, v.data, out, softmax_lse, options, &p);
  p.v_stride = strides_of(v);
  *params = p;
  return Status{};
}

}  // namespace

Status validate_forward_workspace_size(const Tensor& q, size_t* bytes) {
  const auto check = [&]() -> Status {
    if (bytes == nullptr) {
      return invalid("bytes is null");
    }
    // q of either forward: float16, bfloat16 or float8_e4m3.
    const auto any_forward_dtype = [](const char* name, DType dtype) {
      switch (dtype) {
        case DType::kFloat16: case DType::kBFloat16: case DType::kFloat8E4M3: return Status{};
        default: return invalid(name, ".dtype is ", dtype_name(dtype), "; use float16, bfloat16 or float8_e4m3");
      }
    };
    // Only what the size depends on: the head dim (and a dtype a forward takes).
    if (Status s = check_headdim(q.shape[3], HeadDimsOf::kForward); !s.ok()) {
      return s;
    }
    if (Status s = any_forward_dtype("q", q.dtype); !s.ok()) {
      return s;
    }
    using sm90::fwd::PartialWorkspace;
    *bytes = PartialWorkspace::bound(PartialWorkspace::kMaxSms, static_cast<int>(q.shape[3]));
    return Status{};
  };
  return with_call(kForwardWorkspaceCall, check());
}

namespace {

// Device arrays of int32 a kernel reads while it writes out, softmax_lse
// and the workspace (varlen offsets, cache lengths): each apart from all
// three, since a store into it mid-kernel could make the producer and the
// consumers see different work (a hang).
template <class Arrays>
Status check_index_arrays(const Arrays& arrays, const Tensor& q, const Tensor& out,
                          const float* softmax_lse, const ForwardOptions& options) {
  const Span written[] = {
      span_of(out), lse_span(q, softmax_lse),
      options.workspace == nullptr
          ? Span{}
          : Span{reinterpret_cast<uintptr_t>(options.workspace),
                 reinterpret_cast<uintptr_t>(options.workspace) + options.workspace_bytes}};
  const char* written_names[] = {"out", "softmax_lse", "options.workspace"};
  for (const IndexArray& a : arrays) {
    if (Status s = check_index_array(a); !s.ok()) {
      return s;
    }
    for (size_t i = 0; i < std::size(written); ++i) {
      if (intersect(span_of(a), written[i])) {
        return invalid(a.name, " overlaps ", written_names[i],
                       "; the call writes there while its kernels read it");
      }
    }
  }
  return Status{};
}

}  // namespace

Status validate_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, float* softmax_lse, const Varlen& varlen,
                               const ForwardOptions& options, ForwardParams* params) {
  const auto check = [&]() -> Status {
    for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"q", q},
                                  {"k", k}, {"v", v}, {"out", out}}) {
      if (t.shape[0] != 1) {
        return invalid(name, ".shape[0] = ", t.shape[0],
                       ": a varlen batch is packed, (1, total, heads, headdim)");
      }
    }
    if (Status s = check_forward(q, k, v, out, softmax_lse, options, params); !s.ok()) {
      return s;
    }
    if (varlen.batch < 1) {
      return invalid("varlen.batch = ", varlen.batch, " must be at least 1");
    }
    if (Status s = check_index_arrays(index_arrays_of(varlen), q, out, softmax_lse, options);
        !s.ok()) {
      return s;
    }
    if (varlen.max_seqlen_q < 1) {
      return invalid("varlen.max_seqlen_q = ", varlen.max_seqlen_q, " must be at least 1");
    }
    params->cu_seqlens_q = varlen.cu_seqlens_q;
    params->cu_seqlens_k = varlen.cu_seqlens_k;
    params->seqused_q = varlen.seqused_q;
    params->seqused_k = varlen.seqused_k;
    params->varlen_batch = varlen.batch;
    // An upper bound that only picks the kernel: no sequence is longer than total_q.
    params->max_seqlen_q = static_cast<int>(std::min<int64_t>(varlen.max_seqlen_q, q.shape[1]));
    return Status{};
  };
  return with_call(kForwardVarlenCall, check());
}

Status validate_forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor& out, float* softmax_lse, const KvCache& cache,
                                const ForwardOptions& options, ForwardParams* params) {
  const auto check = [&]() -> Status {
    const bool paged = cache.page_table != nullptr;
    if (Status s = check_forward(q, k_cache, v_cache, out, softmax_lse, options, params,
                                 paged || cache.cache_batch_idx != nullptr);
        !s.ok()) {
      return s;
    }
    const int64_t batch = q.shape[0];
    int64_t capacity = 0, table_rows = 0;
    if (Status s = check_cache_layout(q, k_cache, cache, &capacity, &table_rows); !s.ok()) {
      return s;
    }
    if (Status s = check_index_arrays(
            std::initializer_list<IndexArray>{
             {"cache.cache_seqlens", cache.cache_seqlens, batch, true},
             {"cache.cache_batch_idx", cache.cache_batch_idx, batch, false},
             {"cache.page_table", cache.page_table, table_rows * cache.pages_per_batch, false},
             {"cache.cache_leftpad", cache.cache_leftpad, batch, false}},
            q, out, softmax_lse, options);
        !s.ok()) {
      return s;
    }
    if (paged && cache.cache_leftpad != nullptr) {
      return unsupported("cache.cache_leftpad with a paged cache (page_table): left padding "
                         "is taken for contiguous caches only, as in FlashAttention-3");
    }
    params->cache_seqlens = cache.cache_seqlens;
    params->cache_leftpad = cache.cache_leftpad;
    params->cache_batch_idx = cache.cache_batch_idx;
    params->kv_batch = static_cast<int>(k_cache.shape[0]);
    if (paged) {
      params->page_table = cache.page_table;
      params->page_table_rows = static_cast<int>(table_rows);
      params->pages_per_batch = cache.pages_per_batch;
      params->page_size = static_cast<int>(k_cache.shape[1]);
      params->seqlen_k = static_cast<int>(capacity);  // slots per batch
    }
    return Status{};
  };
  return with_call(kForwardKvCacheCall, check());
}

Status validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        float* softmax_lse, const ForwardOptions& options,
                        ForwardParams* params) {
  return with_call(kForwardCall, check_forward(q, k, v, out, softmax_lse, options, params));
}

}  // namespace flash3::detail
