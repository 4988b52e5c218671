// WIP: replaced by the warp-specialized kernel's launcher.
#pragma once
#include "api/dispatch.hpp"
namespace flash3::detail {
template <DType kDType, int kHeadDim>
Status launch_forward_sm90(const ForwardParams&, cudaStream_t) {
  return {StatusCode::kInternal, "flash3: kernel not written yet"};
}
}  // namespace flash3::detail
