// The argument checks of flash3::forward.
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

Status check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     float* softmax_lse, const ForwardOptions& options, ForwardParams* params) {
  const struct {
    const char* name;
    const Tensor& t;
  } tensors[] = {{"q", q}, {"k", k}, {"v", v}, {"out", out}};
  if (Status s = check_headdim_first(q); !s.ok()) {
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
    if (Status s = check_batch_and_headdim_match_q(name, t, q); !s.ok()) {
      return s;
    }
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
  if (Status s = check_forward_workspace(
          options, {{"q", span_of(q)}, {"k", span_of(k)}, {"v", span_of(v)}, {"out", span_of(out)},
                    {"softmax_lse", lse_span(q, softmax_lse)}});
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
    if (Status s = check_headdim(q.shape[3]); !s.ok()) {
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

Status validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        float* softmax_lse, const ForwardOptions& options,
                        ForwardParams* params) {
  return with_call(kForwardCall, check_forward(q, k, v, out, softmax_lse, options, params));
}

}  // namespace flash3::detail
