// The C++ entry point of the forward: validate, check the device, dispatch.
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

const char* version() { return flash3_version(); }

}  // namespace flash3
