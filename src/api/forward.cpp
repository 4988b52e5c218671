// The C++ entry point of the forward: validate, check the device, dispatch.
#include <exception>
#include <string>

#include "call.hpp"
#include "flash3/flash3.hpp"
#include "validate.hpp"

namespace flash3 {

Status forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               float* softmax_lse, const ForwardOptions& options, cudaStream_t stream) {
  return detail::run_call<detail::ForwardParams>(
      detail::kForwardCall,
      [&](detail::ForwardParams* params) {
        return detail::validate_forward(q, k, v, out, softmax_lse, options, params);
      },
      stream);
}

Status forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      float* softmax_lse, const Varlen& varlen, const ForwardOptions& options,
                      cudaStream_t stream) {
  return detail::run_call<detail::ForwardParams>(
      detail::kForwardVarlenCall,
      [&](detail::ForwardParams* params) {
        return detail::validate_forward_varlen(q, k, v, out, softmax_lse, varlen, options,
                                               params);
      },
      stream);
}

Status forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& out, float* softmax_lse, const KvCache& cache,
                       const ForwardOptions& options, cudaStream_t stream) {
  return detail::run_call<detail::ForwardParams>(
      detail::kForwardKvCacheCall,
      [&](detail::ForwardParams* params) {
        return detail::validate_forward_kvcache(q, k_cache, v_cache, out, softmax_lse, cache,
                                                options, params);
      },
      stream);
}

Status kvcache_append(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const KvCache& cache, const KvCacheAppend& append, cudaStream_t stream) {
  return detail::run_call<detail::KvAppendParams>(
      detail::kKvAppendCall,
      [&](detail::KvAppendParams* params) {
        return detail::validate_kvcache_append(q, k_cache, v_cache, cache, append, params);
      },
      stream);
}

Status forward_workspace_size(const Tensor& q, size_t* bytes) {
  // Needs no device: a bound over every Hopper GPU's SM count.
  try {
    return detail::validate_forward_workspace_size(q, bytes);
  } catch (const std::exception& e) {
    return Status{StatusCode::kInternal, std::string(detail::kForwardWorkspaceCall) + ": " + e.what()};
  } catch (...) {
    return Status{StatusCode::kInternal,
                  std::string(detail::kForwardWorkspaceCall) + ": unknown exception"};
  }
}

const char* version() { return flash3_version(); }

}  // namespace flash3
