// The C++ entry points of the backward: backward() and backward_varlen()
// validate, check the device and dispatch; backward_workspace_size() is pure
// host code.
#include <exception>
#include <string>

#include "call.hpp"
#include "flash3/flash3.hpp"
#include "validate.hpp"

namespace flash3 {

Status backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const float* softmax_lse, const Tensor& dq, const Tensor& dk,
                const Tensor& dv, const BackwardOptions& options, cudaStream_t stream) {
  return detail::run_call<detail::BackwardParams>(
      detail::kBackwardCall,
      [&](detail::BackwardParams* params) {
        return detail::validate_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, options,
                                         params);
      },
      stream);
}

Status backward_varlen(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const float* softmax_lse, const Tensor& dq,
                       const Tensor& dk, const Tensor& dv, const Varlen& varlen,
                       const BackwardOptions& options, cudaStream_t stream) {
  return detail::run_call<detail::BackwardParams>(
      detail::kBackwardVarlenCall,
      [&](detail::BackwardParams* params) {
        return detail::validate_backward_varlen(dout, q, k, v, out, softmax_lse, dq, dk, dv,
                                                varlen, options, params);
      },
      stream);
}

namespace {
Status workspace_size(const Tensor& q, const Tensor& k, const Tensor* v, const Varlen* varlen,
                      const BackwardOptions& options, size_t* bytes) {
  // Needs no device: the size follows from the shapes alone.
  try {
    return detail::validate_backward_workspace_size(q, k, v, varlen, options, bytes);
  } catch (const std::exception& e) {
    return Status{StatusCode::kInternal,
                  std::string(detail::kBackwardWorkspaceCall) + ": " + e.what()};
  } catch (...) {
    return Status{StatusCode::kInternal,
                  std::string(detail::kBackwardWorkspaceCall) + ": unknown exception"};
  }
}
}  // namespace

Status backward_workspace_size(const Tensor& q, const Tensor& k, const BackwardOptions& options,
                               size_t* bytes) {
  return workspace_size(q, k, nullptr, nullptr, options, bytes);
}

Status backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor& v,
                               const BackwardOptions& options, size_t* bytes) {
  return workspace_size(q, k, &v, nullptr, options, bytes);
}

Status backward_workspace_size(const Tensor& q, const Tensor& k, const Varlen& varlen,
                               const BackwardOptions& options, size_t* bytes) {
  return workspace_size(q, k, nullptr, &varlen, options, bytes);
}

Status backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Varlen& varlen, const BackwardOptions& options,
                               size_t* bytes) {
  return workspace_size(q, k, &v, &varlen, options, bytes);
}

}  // namespace flash3
