// The C++ entry point: validate, check the device, dispatch.
#include <exception>
#include <string>

#include "device.hpp"
#include "dispatch.hpp"
#include "flash3/flash3.hpp"
#include "validate.hpp"

namespace flash3 {

Status forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               float* softmax_lse, const ForwardOptions& options, cudaStream_t stream) {
  try {
    detail::ForwardParams params;
    if (Status s = detail::validate_forward(q, k, v, out, softmax_lse, options, &params);
        !s.ok()) {
      return s;
    }
    if (Status s = detail::check_device(&params); !s.ok()) {
      return s;
    }
    if (Status s = detail::check_pointers(params); !s.ok()) {
      return s;
    }
    return detail::dispatch_forward(params, stream);
  } catch (const std::exception& e) {
    return Status{StatusCode::kInternal, std::string("flash3::forward: ") + e.what()};
  } catch (...) {
    return Status{StatusCode::kInternal, "flash3::forward: unknown exception"};
  }
}

const char* version() { return flash3_version(); }

}  // namespace flash3
