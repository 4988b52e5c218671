// The C++ entry point of combine (split-KV partial results merged):
// validate, check the device, dispatch.
#include "call.hpp"
#include "flash3/flash3.hpp"
#include "validate.hpp"

namespace flash3 {

Status combine(const CombineArgs& args, cudaStream_t stream) {
  return detail::run_call<detail::CombineParams>(
      detail::kCombineCall,
      [&](detail::CombineParams* params) { return detail::validate_combine(args, params); },
      stream);
}

}  // namespace flash3
