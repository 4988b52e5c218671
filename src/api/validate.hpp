// The argument checks of the public calls, one validate_* per call
// (validate_<call>.cpp; what they share is in validate_common.hpp). Pure
// host code: it touches neither the device nor the memory behind the
// pointers, so it runs (and is tested) on machines without a GPU.
#pragma once

#include <cstddef>

#include "flash3/flash3.hpp"
#include "sm90/problem.hpp"

namespace flash3::detail {

// Checks q, k, v, out, softmax_lse and options; on success fills `params`
// (everything but the device fields) and returns an ok Status.
Status validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        float* softmax_lse, const ForwardOptions& options,
                        ForwardParams* params);

// Checks forward_varlen's arguments: those of validate_forward (as batch 1)
// and the varlen description; on success fills `params`.
Status validate_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, float* softmax_lse, const Varlen& varlen,
                               const ForwardOptions& options, ForwardParams* params);

// Checks forward_kvcache's arguments: those of validate_forward (k and v
// with their own batch when cache_batch_idx is given) and the cache's
// description; on success fills `params`.
Status validate_forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor& out, float* softmax_lse, const KvCache& cache,
                                const ForwardOptions& options, ForwardParams* params);

// Checks kvcache_append's arguments; on success fills `params`.
Status validate_kvcache_append(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const KvCache& cache, const KvCacheAppend& append,
                               KvAppendParams* params);

// Checks q and bytes as forward_workspace_size() takes them; on success
// sets *bytes to the size of a forward workspace for q's head dim on any
// Hopper GPU. On error *bytes is left as it was.
Status validate_forward_workspace_size(const Tensor& q, size_t* bytes);

// Checks the backward's tensors, softmax_lse and options (the workspace, if
// given, against backward_workspace_size); on success fills `params`
// (everything but the device fields) and returns an ok Status.
Status validate_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const float* softmax_lse, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv, const BackwardOptions& options,
                         BackwardParams* params);

// Checks q, k (v: null, or its head dim and dtype) and bytes as
// backward_workspace_size() takes them; on success
// sets *bytes to the size of the backward's workspace for these shapes and
// options.deterministic. On error *bytes is left as it was.
Status validate_backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor* v,
                                        const Varlen* varlen, const BackwardOptions& options,
                                        size_t* bytes);

// Checks backward_varlen's arguments: those of validate_backward (as batch
// 1, softmax_lse (heads_q, total_q)) and the varlen description.
Status validate_backward_varlen(const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const float* softmax_lse,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const Varlen& varlen, const BackwardOptions& options,
                                BackwardParams* params);

// Checks x, x_fp8, descale and options; on success fills `params`
// (everything but the device fields) and returns an ok Status.
Status validate_quantize(const Tensor& x, const Tensor& x_fp8, float* descale,
                         const QuantizeOptions& options, QuantizeParams* params);
// The same for quantize_fp8_v (codes into the Fp8V layout: params->v_out).
Status validate_quantize_v(const Tensor& v, const Fp8V& v_out, float* descale,
                           const QuantizeOptions& options, QuantizeParams* params);

// Checks the FP8 forward's arguments; on success fills `params` (everything
// but the device fields; dtype kFloat8E4M3, out_dtype from out).
Status validate_forward_fp8(const Tensor& q, const Tensor& k, const Fp8V& v, const Tensor& out,
                            float* softmax_lse, const Fp8Descales& descales,
                            const ForwardOptions& options, ForwardParams* params);

// Checks fp8_v_layout's arguments; on success fills `params` (but the device).
Status validate_fp8_v_layout(const Tensor& v, const Fp8V& v_out, Fp8VLayoutParams* params);

// Checks combine's arguments; on success fills `params` (but the device
// fields). An empty problem (batch, seqlen or heads 0) passes with rows 0 and
// null pointers: nothing to launch, nothing to check on the device.
Status validate_combine(const CombineArgs& args, CombineParams* params);

const char* dtype_name(DType dtype);

}  // namespace flash3::detail
