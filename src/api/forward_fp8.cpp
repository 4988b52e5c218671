// The C++ entry points of the FP8 forward and of the V layout step:
// validate, check the device, dispatch.
#include "call.hpp"
#include "flash3/flash3.hpp"
#include "validate.hpp"

namespace flash3 {

Status forward_fp8(const Tensor& q, const Tensor& k, const Fp8V& v, const Tensor& out,
                   float* softmax_lse, const Fp8Descales& descales, const ForwardOptions& options,
                   cudaStream_t stream) {
  return detail::run_call<detail::ForwardParams>(
      detail::kForwardFp8Call,
      [&](detail::ForwardParams* params) {
        return detail::validate_forward_fp8(q, k, v, out, softmax_lse, descales, options, params);
      },
      stream);
}

Status fp8_v_layout(const Tensor& v, const Fp8V& v_out, cudaStream_t stream) {
  return detail::run_call<detail::Fp8VLayoutParams>(
      detail::kFp8VLayoutCall,
      [&](detail::Fp8VLayoutParams* params) {
        return detail::validate_fp8_v_layout(v, v_out, params);
      },
      stream);
}

}  // namespace flash3
