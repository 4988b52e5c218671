#include "dispatch.hpp"

#include <string>

#include "kernels_built.hpp"  // generated: the (dtype, head dim) pairs of FLASH3_KERNELS
#include "validate.hpp"

namespace flash3::detail {
namespace {

template <DType kDType, int kHeadDim>
Status launch_if_built(const ForwardParams& p, cudaStream_t stream) {
  if constexpr (kKernelBuilt<kDType, kHeadDim>) {
    return launch_forward_sm90<kDType, kHeadDim>(p, stream);
  } else {
    return Status{StatusCode::kUnsupported,
                  std::string("flash3::forward: the ") + dtype_name(kDType) + " headdim " +
                      std::to_string(kHeadDim) +
                      " kernel is not in this build (configure with -DFLASH3_KERNELS=all)"};
  }
}

template <DType kDType>
Status dispatch_headdim(const ForwardParams& p, cudaStream_t stream) {
  switch (p.headdim) {
    case 64:
      return launch_if_built<kDType, 64>(p, stream);
    case 128:
      return launch_if_built<kDType, 128>(p, stream);
    case 256:
      return launch_if_built<kDType, 256>(p, stream);
    default:
      break;
  }
  return Status{StatusCode::kInternal,
                "flash3::forward: no kernel for headdim " + std::to_string(p.headdim)};
}

}  // namespace

Status dispatch_forward(const ForwardParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat16:
      return dispatch_headdim<DType::kFloat16>(p, stream);
    case DType::kBFloat16:
      return dispatch_headdim<DType::kBFloat16>(p, stream);
    default:
      break;
  }
  return Status{StatusCode::kInternal, "flash3::forward: no kernel for this dtype"};
}

}  // namespace flash3::detail
