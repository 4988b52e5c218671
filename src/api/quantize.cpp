// The C++ entry points of the FP8 quantization: validate, check the device, dispatch.
#include "call.hpp"
#include "flash3/flash3.hpp"
#include "validate.hpp"

namespace flash3 {

Status quantize_fp8(const Tensor& x, const Tensor& x_fp8, float* descale,
                    const QuantizeOptions& options, cudaStream_t stream) {
  return detail::run_call<detail::QuantizeParams>(
      detail::kQuantizeCall,
      [&](detail::QuantizeParams* params) {
        return detail::validate_quantize(x, x_fp8, descale, options, params);
      },
      stream);
}

Status quantize_fp8_v(const Tensor& v, const Fp8V& v_out, float* descale,
                      const QuantizeOptions& options, cudaStream_t stream) {
  return detail::run_call<detail::QuantizeParams>(
      detail::kQuantizeVCall,
      [&](detail::QuantizeParams* params) {
        return detail::validate_quantize_v(v, v_out, descale, options, params);
      },
      stream);
}

}  // namespace flash3
