// The steps every public call takes, in order: validate its arguments (pure
// host code), find the current Hopper device, check that the pointers live
// on it, and dispatch. No exception crosses the public API: anything thrown
// becomes kInternal, named after the call.
#pragma once

#include <exception>
#include <string>

#include <cuda_runtime_api.h>

#include "device.hpp"
#include "dispatch.hpp"
#include "flash3/flash3.hpp"

namespace flash3::detail {

// validate(Params*) -> Status fills the params of one call.
template <class Params, class Validate>
Status run_call(const char* call, const Validate& validate, cudaStream_t stream) {
  try {
    Params params;
    if (Status s = validate(&params); !s.ok()) {
      return s;
    }
    if (Status s = check_device(call, &params); !s.ok()) {
      return s;
    }
    if (Status s = check_pointers(call, params); !s.ok()) {
      return s;
    }
    return dispatch(params, stream);
  } catch (const std::exception& e) {
    return Status{StatusCode::kInternal, std::string(call) + ": " + e.what()};
  } catch (...) {
    return Status{StatusCode::kInternal, std::string(call) + ": unknown exception"};
  }
}

}  // namespace flash3::detail
