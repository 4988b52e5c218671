// The one place where run-time choices (dtype, head dim, transform) become a
// kernel template instantiation.
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.hpp"
#include "sm90/launch.hpp"
#include "sm90/problem.hpp"

namespace flash3::detail {

Status dispatch(const ForwardParams& params, cudaStream_t stream);
Status dispatch(const BackwardParams& params, cudaStream_t stream);
Status dispatch(const QuantizeParams& params, cudaStream_t stream);
Status dispatch(const Fp8VLayoutParams& params, cudaStream_t stream);
Status dispatch(const CombineParams& params, cudaStream_t stream);
Status dispatch(const KvAppendParams& params, cudaStream_t stream);

}  // namespace flash3::detail
