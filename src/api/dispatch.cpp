#include "dispatch.hpp"

#include <string>
#include <type_traits>

#include "kernels_built.hpp"  // generated: the (dtype, head dim) pairs of FLASH3_KERNELS
#include "sm90/fwd/tail_split.hpp"
#include "sm90/head_dims.hpp"
#include "validate.hpp"

namespace flash3::detail {
namespace {

// launch() if the (kind, dtype, head dim, V's head dim) kernel is in this
// build (FLASH3_KERNELS), else kUnsupported naming it.
template <bool kBuilt, DType kDType, int kHeadDim, class Launch, int kHeadDimV = kHeadDim>
Status launch_if_built(const char* call, const char* kind, const Launch& launch) {
  if constexpr (kBuilt) {
    return launch();
  } else {
    const std::string v =
        kHeadDimV == kHeadDim ? "" : " (v headdim " + std::to_string(kHeadDimV) + ")";
    return Status{StatusCode::kUnsupported,
                  std::string(call) + ": the " + kind + dtype_name(kDType) + " headdim " +
                      std::to_string(kHeadDim) + v +
                      " kernel is not in this build (configure with -DFLASH3_KERNELS=all)"};
  }
}

// fn(std::integral_constant<DType, dtype>{}) for the 16-bit dtypes.
template <class Fn>
Status visit_dtype(const char* call, DType dtype, const Fn& fn) {
  switch (dtype) {
    case DType::kFloat16:
      return fn(std::integral_constant<DType, DType::kFloat16>{});
    case DType::kBFloat16:
      return fn(std::integral_constant<DType, DType::kBFloat16>{});
    default:
      break;
  }
  return Status{StatusCode::kInternal, std::string(call) + ": no kernel for this dtype"};
}

// fn(std::integral_constant<int, headdim>{}) for the head dims of Dims
// (sm90/head_dims.hpp).
template <class Dims = HeadDims, class Fn>
Status visit_headdim(const char* call, int headdim, const Fn& fn) {
  return visit_head_dim(Dims{}, headdim, fn, [&] {
    return Status{StatusCode::kInternal,
                  std::string(call) + ": no kernel for headdim " + std::to_string(headdim)};
  });
}

// fn(dtype, headdim, headdim_v) as integral constants for a 16-bit call: the
// head dims of HeadDimsOf and, beside each, v's of ValueDims<headdim>.
template <class HeadDimsOf, template <int> class ValueDims, class Fn>
Status visit_dims(const char* call, DType dtype, int headdim, int headdim_v, const Fn& fn) {
  return visit_dtype(call, dtype, [&](auto dt) {
    return visit_headdim<HeadDimsOf>(call, headdim, [&](auto hd) {
      return visit_headdim<ValueDims<decltype(hd)::value>>(call, headdim_v,
                                                           [&](auto dv) { return fn(dt, hd, dv); });
    });
  });
}

template <DType kOutDType, int kHeadDim>
Status launch_fp8(const ForwardParams& p, cudaStream_t stream) {
  return launch_if_built<kFp8KernelBuilt<kOutDType, kHeadDim>, kOutDType, kHeadDim>(
      kForwardFp8Call, "fp8 -> ",
      [&] { return launch_forward_fp8_sm90<kOutDType, kHeadDim>(p, stream); });
}

Status dispatch_fp8(const ForwardParams& p, cudaStream_t stream) {
  return visit_dtype(kForwardFp8Call, p.out_dtype, [&](auto out_dtype) {
    return visit_headdim<Fp8HeadDims>(kForwardFp8Call, p.headdim, [&](auto headdim) {
      return launch_fp8<decltype(out_dtype)::value, decltype(headdim)::value>(p, stream);
    });
  });
}

}  // namespace

Status dispatch(const ForwardParams& p, cudaStream_t stream) {
  if (p.workspace != nullptr) {
    const size_t need = sm90::fwd::PartialWorkspace::bound(p.num_sms, p.headdim);
    if (p.workspace_bytes < need) {
      return Status{StatusCode::kInvalidArgument,
                    std::string(p.dtype == DType::kFloat8E4M3 ? kForwardFp8Call : kForwardCall) +
                        ": options.workspace_bytes = " + std::to_string(p.workspace_bytes) +
                        " is less than the " + std::to_string(need) + " bytes a forward of head dim " +
                        std::to_string(p.headdim) + " needs (forward_workspace_size)"};
    }
  }
  if (p.dtype == DType::kFloat8E4M3) {
    return dispatch_fp8(p, stream);
  }
  return visit_dims<ForwardHeadDims, ForwardValueDims>(
      kForwardCall, p.dtype, p.headdim, p.headdim_v, [&](auto dtype, auto headdim, auto dv) {
        constexpr DType kDType = decltype(dtype)::value;
        constexpr int kHeadDim = decltype(headdim)::value, kHeadDimV = decltype(dv)::value;
        const auto launch = [&] {
          return launch_forward_sm90<kDType, kHeadDim, kHeadDimV>(p, stream);
        };
        return launch_if_built<kKernelBuilt<kDType, kHeadDim, kHeadDimV>, kDType, kHeadDim,
                               decltype(launch), kHeadDimV>(kForwardCall, "", launch);
      });
}

Status dispatch(const BackwardParams& p, cudaStream_t stream) {
  return visit_dims<BackwardHeadDims, BackwardValueDims>(
      kBackwardCall, p.dtype, p.headdim, p.headdim_v, [&](auto dtype, auto headdim, auto dv) {
        constexpr DType kDType = decltype(dtype)::value;
        constexpr int kHeadDim = decltype(headdim)::value, kHeadDimV = decltype(dv)::value;
        const auto launch = [&] {
          return launch_backward_sm90<kDType, kHeadDim, kHeadDimV>(p, stream);
        };
        return launch_if_built<kBwdKernelBuilt<kDType, kHeadDim, kHeadDimV>, kDType, kHeadDim,
                               decltype(launch), kHeadDimV>(kBackwardCall, "backward ", launch);
      });
}

Status dispatch(const QuantizeParams& p, cudaStream_t stream) {
  return visit_dtype(kQuantizeCall, p.dtype, [&](auto dtype) {
    return visit_headdim(kQuantizeCall, p.headdim, [&](auto headdim) {
      constexpr DType kDType = decltype(dtype)::value;
      constexpr int kHeadDim = decltype(headdim)::value;
      if (p.v_out != nullptr) {  // validated without the transform
        return launch_quantize_sm90<kDType, kHeadDim, false, true>(p, stream);
      }
      return p.hadamard ? launch_quantize_sm90<kDType, kHeadDim, true, false>(p, stream)
                        : launch_quantize_sm90<kDType, kHeadDim, false, false>(p, stream);
    });
  });
}

Status dispatch(const Fp8VLayoutParams& p, cudaStream_t stream) {
  return launch_fp8_v_layout_sm90(p, stream);
}

Status dispatch(const KvAppendParams& p, cudaStream_t stream) {
  return launch_kv_append_sm90(p, stream);
}

Status dispatch(const CombineParams& p, cudaStream_t stream) {
  if (p.rows == 0) {
    return Status{};  // an empty problem: nothing to launch
  }
  return launch_combine_sm90(p, stream);
}

}  // namespace flash3::detail
