// The argument checks of flash3::backward and flash3::backward_workspace_size.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "sm90/bwd/workspace.hpp"
#include "validate_common.hpp"

namespace flash3::detail {
namespace {

using namespace validation;
using sm90::bwd::WorkspaceLayout;

// WorkspaceLayout::of's sizes must stay far from size_t's range: a bound of
// the whole workspace (in 128 bits) at most this.
constexpr unsigned __int128 kMaxWorkspaceBytes = static_cast<unsigned __int128>(1) << 62;

// Every tensor of the backward.
Status backward_dtype(const char* name, DType dtype) {
  if (dtype == DType::kFloat32) {
    return invalid(name, ".dtype is float32; the backward's tensors must be float16 or bfloat16");
  }
  if (dtype == DType::kFloat8E4M3) {
    return unsupported(name, ".dtype is float8_e4m3: the backward has no FP8 path; "
                       "use float16 or bfloat16");
  }
  return Status{};
}

std::string shape_text(const Tensor& t) {
  std::ostringstream os;
  os << "(" << t.shape[0] << ", " << t.shape[1] << ", " << t.shape[2] << ", " << t.shape[3] << ")";
  return os.str();
}

// t has the shape of `like` (named like_name).
Status check_same_shape(const char* name, const Tensor& t, const char* like_name,
                        const Tensor& like) {
  if (t.shape != like.shape) {
    return invalid(name, ".shape ", shape_text(t), " differs from ", like_name, ".shape ",
                   shape_text(like));
  }
  return Status{};
}

// k of q's dtype, batch and head dim; q's heads a multiple of k's. What
// backward() and backward_workspace_size() both check once each tensor
// passed check_tensor (the head dim each checks itself: backward() first of
// all, check_headdim_first).
Status check_q_and_k(const Tensor& q, const Tensor& k) {
  if (k.dtype != q.dtype) {
    return invalid("k.dtype (", dtype_name(k.dtype), ") differs from q.dtype (",
                   dtype_name(q.dtype), ")");
  }
  if (Status s = check_batch_and_headdim_match_q("k", k, q); !s.ok()) {
    return s;
  }
  return check_heads(q, k);
}

// The workspace of q's and k's shapes and v's head dim, after check_q_and_k:
// refused if its tile counts or bytes would not fit the layout's arithmetic.
// Varlen (varlen_batch sequences): each sequence's rows padded apart
// (workspace.hpp).
Status workspace_layout(const Tensor& q, const Tensor& k, int headdim_v, bool deterministic,
                        WorkspaceLayout* layout, int varlen_batch = 0, bool dsinks = false) {
  using u128 = unsigned __int128;
  const int headdim = static_cast<int>(q.shape[3]);
  const int64_t block_m = sm90::bwd::block_m(headdim, headdim_v);
  const int64_t block_n = sm90::bwd::block_n(headdim, headdim_v);
  const int64_t padding = static_cast<int64_t>(varlen_batch);  // tiles more, varlen
  const int64_t padded_q = (q.shape[1] + (padding + 1) * block_m - 1) / block_m * block_m;
  const int64_t padded_k = (k.shape[1] + (padding + 1) * block_n - 1) / block_n * block_n;
  if (padded_q > kMaxDimension) {
    return invalid("q.shape[1] (seqlen_q) = ", q.shape[1],
                   varlen_batch > 0 ? " plus a tile per sequence" : "",
                   " rounded up to the backward's tile of ", block_m,
                   " query rows exceeds 2^31-1");
  }
  if (padded_k > kMaxDimension) {
    return invalid("k.shape[1] (seqlen_k) = ", k.shape[1],
                   varlen_batch > 0 ? " plus a tile per sequence" : "",
                   " rounded up to the backward's tile of ", block_n, " keys exceeds 2^31-1");
  }
  // A bound of every region (dQ accumulator, two row statistics, the dK/dV
  // accumulators, semaphores, alignment), so that the layout's size_t sums
  // cannot wrap.
  const u128 rows_q = static_cast<u128>(q.shape[0] * q.shape[2]) * static_cast<u128>(padded_q);
  const u128 rows_k = static_cast<u128>(k.shape[0] * k.shape[2]) * static_cast<u128>(padded_k);
  const u128 bound = (rows_q * static_cast<u128>(headdim + 3) +
                      rows_k * static_cast<u128>(headdim + headdim_v + 1)) *
                         sizeof(float) +
                     static_cast<u128>(padding + 1) * sizeof(int32_t) +
                     rows_q * sizeof(float) +  // a bound of the sinks' partial sums
                     8 * WorkspaceLayout::kAlign;
  if (bound > kMaxWorkspaceBytes) {
    return invalid("the backward's workspace for these shapes (about ",
                   static_cast<uint64_t>(bound >> 30), " GiB) exceeds 2^62 bytes");
  }
  *layout = WorkspaceLayout::of(static_cast<int>(q.shape[0]), static_cast<int>(q.shape[1]),
                                static_cast<int>(k.shape[1]), static_cast<int>(q.shape[2]),
                                static_cast<int>(k.shape[2]), headdim, headdim_v,
                                deterministic, varlen_batch, dsinks);
  return Status{};
}

struct Named {
  const char* name;
  const Tensor& t;
};

// The sequences of a varlen batch (varlen non-null; the tensors of batch 1).
Status check_varlen(const Varlen& varlen) {
  if (varlen.batch < 1) {
    return invalid("varlen.batch = ", varlen.batch, " must be at least 1");
  }
  if (varlen.max_seqlen_q < 1) {
    return invalid("varlen.max_seqlen_q = ", varlen.max_seqlen_q, " must be at least 1");
  }
  for (const IndexArray& a : index_arrays_of(varlen)) {
    if (Status s = check_index_array(a); !s.ok()) {
      return s;
    }
  }
  return Status{};
}

// backward() and (varlen non-null) backward_varlen().
Status check_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const float* softmax_lse, const Tensor& dq,
                      const Tensor& dk, const Tensor& dv, const Varlen* varlen,
                      const BackwardOptions& options, BackwardParams* params) {
  const Named tensors[] = {{"dout", dout}, {"q", q},   {"k", k},   {"v", v},
                           {"out", out},   {"dq", dq}, {"dk", dk}, {"dv", dv}};
  if (Status s = check_headdim_first(q, HeadDimsOf::kBackward); !s.ok()) {
    return s;
  }
  // v (and out, dout, dv) of q's head dim or one paired with it (dv != d:
  // sm90/head_dims.hpp, BackwardValueDims).
  if (Status s = check_value_headdim_first(q, v, "v", HeadDimsOf::kBackward); !s.ok()) {
    return s;
  }
  const bool own_dv = v.shape[3] != q.shape[3];
  for (const auto& [name, t] : tensors) {
    if (Status s = check_tensor(name, t, backward_dtype); !s.ok()) {
      return s;
    }
  }
  if (varlen != nullptr) {
    for (const auto& [name, t] : tensors) {
      if (t.shape[0] != 1) {
        return invalid(name, ".shape[0] = ", t.shape[0],
                       ": a varlen batch is packed, (1, total, heads, headdim)");
      }
    }
    if (Status s = check_varlen(*varlen); !s.ok()) {
      return s;
    }
  }
  for (const auto& [name, t] : tensors) {
    if (t.dtype != q.dtype) {
      return invalid(name, ".dtype (", dtype_name(t.dtype), ") differs from q.dtype (",
                     dtype_name(q.dtype), ")");
    }
  }
  if (Status s = check_q_and_k(q, k); !s.ok()) {  // k's batch and head dim among them
    return s;
  }
  // v's head dim passed check_value_headdim_first: only its batch is left.
  if (v.shape[0] != q.shape[0]) {
    return invalid("v.shape[0] (batch) = ", v.shape[0], " differs from q's ", q.shape[0]);
  }
  if (v.shape[1] != k.shape[1]) {
    return invalid("v.shape[1] (seqlen) = ", v.shape[1], " differs from k's ", k.shape[1]);
  }
  if (v.shape[2] != k.shape[2]) {
    return invalid("v.shape[2] (heads) = ", v.shape[2], " differs from k's ", k.shape[2]);
  }
  // out and dout: q's rows of v's head dim.
  Tensor q_rows_of_v = q;
  q_rows_of_v.shape[3] = v.shape[3];
  const char* q_rows_of_v_name = own_dv ? "(q's rows, v's head dim)" : "q";
  const struct {
    const char* name;
    const Tensor& t;
    const char* like_name;
    const Tensor& like;
  } shapes[] = {{"out", out, q_rows_of_v_name, q_rows_of_v},
                {"dout", dout, q_rows_of_v_name, q_rows_of_v},
                {"dq", dq, "q", q},
                {"dk", dk, "k", k},
                {"dv", dv, own_dv ? "v" : "k", own_dv ? v : k}};
  for (const auto& [name, t, like_name, like] : shapes) {
    if (Status s = check_same_shape(name, t, like_name, like); !s.ok()) {
      return s;
    }
  }

  if (softmax_lse == nullptr) {
    return invalid("softmax_lse is null: the backward needs the forward's log-sum-exp "
                   "(float32, contiguous ",
                   varlen != nullptr ? "(heads_q, total_q))" : "(batch, heads_q, seqlen_q))");
  }
  if (reinterpret_cast<uintptr_t>(softmax_lse) % alignof(float) != 0) {
    return invalid("softmax_lse is not 4-byte aligned");
  }
  if (Status s = check_softmax_scale(options.softmax_scale); !s.ok()) {
    return s;
  }
  if (Status s = check_mask_options(options); !s.ok()) {
    return s;
  }
  if (Status s = check_lse_rows(q); !s.ok()) {
    return s;
  }
  const uint64_t lse_count = static_cast<uint64_t>(q.shape[0] * q.shape[2]) *
                             static_cast<uint64_t>(q.shape[1]);  // < 2^62
  Span lse_span;
  if (!float_span(softmax_lse, lse_count, &lse_span)) {
    return invalid("softmax_lse: its batch * heads_q * seqlen_q = ", lse_count,
                   " floats address past the end of the address space");
  }
  WorkspaceLayout layout;
  if (Status s = workspace_layout(q, k, static_cast<int>(v.shape[3]), options.deterministic,
                                  &layout, varlen != nullptr ? varlen->batch : 0,
                                  options.dsinks != nullptr);
      !s.ok()) {
    return s;
  }
  // The sinks (read) and their gradient (written): heads_q floats each.
  Span sinks_span, dsinks_span;
  if (options.dsinks != nullptr && options.sinks == nullptr) {
    return invalid("options.dsinks is given without options.sinks");
  }
  for (const auto& [name, ptr, span] :
       {std::tuple<const char*, const float*, Span*>{"options.sinks", options.sinks, &sinks_span},
        {"options.dsinks", options.dsinks, &dsinks_span}}) {
    if (Status s = check_head_floats(name, ptr, q, span); !s.ok()) {
      return s;
    }
  }

  // The gradients: none aliases itself, another or an input.
  const Named grads[] = {{"dq", dq}, {"dk", dk}, {"dv", dv}};
  for (const auto& [name, t] : grads) {
    if (self_overlapping(t)) {
      return invalid(name, "'s strides make elements overlap; ", name, " must not alias itself");
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (elements_intersect(grads[i].t, grads[j].t)) {
        return invalid(grads[i].name, " overlaps ", grads[j].name,
                       " in memory; the gradients must not alias each other");
      }
    }
  }
  const struct {
    const char* name;
    Span span;
  } inputs[] = {{"dout", span_of(dout)}, {"q", span_of(q)},     {"k", span_of(k)},
                {"v", span_of(v)},       {"out", span_of(out)}, {"softmax_lse", lse_span},
                {"options.sinks", sinks_span}};
  for (const auto& [grad, t] : grads) {
    const Span grad_span = span_of(t);
    for (const auto& [name, span] : inputs) {
      if (intersect(grad_span, span)) {
        return invalid(grad, " overlaps ", name,
                       " in memory; a gradient must not alias an input");
      }
    }
  }
  for (const auto& [name, span] : inputs) {
    if (intersect(dsinks_span, span)) {
      return invalid("options.dsinks overlaps ", name,
                     " in memory; a gradient must not alias an input");
    }
  }
  for (const auto& [grad, t] : grads) {
    if (intersect(dsinks_span, span_of(t))) {
      return invalid("options.dsinks overlaps ", grad,
                     "; the gradients must not alias each other");
    }
  }
  // Varlen: the offsets and counts, which every kernel reads, apart from what
  // the call writes.
  const Span workspace_span =
      options.workspace == nullptr
          ? Span{}
          : Span{reinterpret_cast<uintptr_t>(options.workspace),
                 reinterpret_cast<uintptr_t>(options.workspace) + layout.bytes};
  if (varlen != nullptr) {
    for (const IndexArray& a : index_arrays_of(*varlen)) {
      for (const auto& [name, written] :
           {std::pair<const char*, Span>{"dq", span_of(dq)}, {"dk", span_of(dk)},
            {"dv", span_of(dv)}, {"options.workspace", workspace_span}}) {
        if (intersect(span_of(a), written)) {
          return invalid(a.name, " overlaps ", name,
                         "; the call writes there while its kernels read it");
        }
      }
    }
  }

  if (options.workspace != nullptr) {
    if (options.workspace_bytes < layout.bytes) {
      return invalid("options.workspace_bytes = ", options.workspace_bytes, " is less than the ",
                     layout.bytes, " bytes these shapes need (backward_workspace_size)");
    }
    // What the kernels use of it: its first layout.bytes.
    if (Status s = check_workspace(
            options.workspace, layout.bytes, WorkspaceLayout::kAlign,
            {{"dout", span_of(dout)}, {"q", span_of(q)}, {"k", span_of(k)}, {"v", span_of(v)},
             {"out", span_of(out)}, {"dq", span_of(dq)}, {"dk", span_of(dk)}, {"dv", span_of(dv)},
             {"softmax_lse", lse_span}, {"options.sinks", sinks_span},
             {"options.dsinks", dsinks_span}});
        !s.ok()) {
      return s;
    }
  }

  BackwardParams p;
  p.dout = dout.data;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.softmax_lse = softmax_lse;
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  p.workspace = options.workspace;
  p.workspace_bytes = options.workspace != nullptr ? options.workspace_bytes : 0;
  p.dtype = q.dtype;
  p.batch = static_cast<int>(q.shape[0]);
  p.seqlen_q = static_cast<int>(q.shape[1]);
  p.seqlen_k = static_cast<int>(k.shape[1]);
  p.heads_q = static_cast<int>(q.shape[2]);
  p.heads_k = static_cast<int>(k.shape[2]);
  p.headdim = static_cast<int>(q.shape[3]);
  p.headdim_v = static_cast<int>(v.shape[3]);
  p.dout_stride = strides_of(dout);
  p.q_stride = strides_of(q);
  p.k_stride = strides_of(k);
  p.v_stride = strides_of(v);
  p.out_stride = strides_of(out);
  p.dq_stride = strides_of(dq);
  p.dk_stride = strides_of(dk);
  p.dv_stride = strides_of(dv);
  p.softmax_scale = resolve_softmax_scale(options.softmax_scale, p.headdim);
  p.causal = options.causal;
  p.window_left = options.window_left;
  p.window_right = options.window_right;
  p.attention_chunk = options.attention_chunk;
  p.softcap = options.softcap;
  p.deterministic = options.deterministic;
  p.sinks = options.dsinks != nullptr ? options.sinks : nullptr;
  p.dsinks = options.dsinks;
  if (varlen != nullptr) {
    p.cu_seqlens_q = varlen->cu_seqlens_q;
    p.cu_seqlens_k = varlen->cu_seqlens_k;
    p.seqused_q = varlen->seqused_q;
    p.seqused_k = varlen->seqused_k;
    p.varlen_batch = varlen->batch;
    // Sizes the per-row passes' grid only: no sequence is longer than total_q.
    p.max_seqlen_q = static_cast<int>(std::min<int64_t>(varlen->max_seqlen_q, q.shape[1]));
  }
  *params = p;
  return Status{};
}

// v: null for v of q's head dim; else only its head dim (and dtype) count.
Status check_backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor* v,
                                     const Varlen* varlen, const BackwardOptions& options,
                                     size_t* bytes) {
  if (bytes == nullptr) {
    return invalid("bytes is null");
  }
  const Tensor& v_or_k = v != nullptr ? *v : k;
  for (const auto& [name, t] : {Named{"q", q}, Named{"k", k}, Named{"v", v_or_k}}) {
    if (Status s = check_tensor(name, t, backward_dtype); !s.ok()) {
      return s;
    }
    if (varlen != nullptr && t.shape[0] != 1) {
      return invalid(name, ".shape[0] = ", t.shape[0],
                     ": a varlen batch is packed, (1, total, heads, headdim)");
    }
  }
  if (varlen != nullptr && varlen->batch < 1) {
    return invalid("varlen.batch = ", varlen->batch, " must be at least 1");
  }
  if (Status s = check_q_and_k(q, k); !s.ok()) {
    return s;
  }
  if (Status s = check_headdim(q.shape[3], HeadDimsOf::kBackward); !s.ok()) {
    return s;
  }
  if (v != nullptr) {
    if (v->dtype != q.dtype) {
      return invalid("v.dtype (", dtype_name(v->dtype), ") differs from q.dtype (",
                     dtype_name(q.dtype), ")");
    }
    if (Status s = check_value_headdim_first(q, *v, "v", HeadDimsOf::kBackward); !s.ok()) {
      return s;
    }
  }
  if (Status s = check_lse_rows(q); !s.ok()) {
    return s;
  }
  WorkspaceLayout layout;
  if (Status s = workspace_layout(q, k, static_cast<int>(v_or_k.shape[3]), options.deterministic,
                                  &layout, varlen != nullptr ? varlen->batch : 0,
                                  options.dsinks != nullptr);
      !s.ok()) {
    return s;
  }
  *bytes = layout.bytes;
  return Status{};
}

}  // namespace

Status validate_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const float* softmax_lse, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv, const BackwardOptions& options,
                         BackwardParams* params) {
  return with_call(kBackwardCall, check_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv,
                                                 nullptr, options, params));
}

Status validate_backward_varlen(const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const float* softmax_lse,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const Varlen& varlen, const BackwardOptions& options,
                                BackwardParams* params) {
  return with_call(kBackwardVarlenCall, check_backward(dout, q, k, v, out, softmax_lse, dq, dk,
                                                       dv, &varlen, options, params));
}

Status validate_backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor* v,
                                        const Varlen* varlen, const BackwardOptions& options,
                                        size_t* bytes) {
  return with_call(kBackwardWorkspaceCall,
                   check_backward_workspace_size(q, k, v, varlen, options, bytes));
}

}  // namespace flash3::detail
