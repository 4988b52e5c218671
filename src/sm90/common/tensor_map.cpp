#include "tensor_map.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <sstream>

namespace flash3::detail {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_tiled() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                         cudaEnableDefault, &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      ptr = nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

}  // namespace

Status make_tensor_map(const TensorMapShape& t, int box_cols, int box_rows, CUtensorMap* map) {
  EncodeTiledFn encode = encode_tiled();
  if (encode == nullptr) {
    return {StatusCode::kCudaError,
            "flash3: the driver has no cuTensorMapEncodeTiled (driver too old for CUDA 12+?)"};
  }
  const int64_t bytes = t.dtype == DType::kFloat8E4M3 ? 1 : 2;
  const CUtensorMapDataType type = t.dtype == DType::kFloat16    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.headdim), static_cast<cuuint64_t>(t.seqlen),
                              static_cast<cuuint64_t>(t.heads), static_cast<cuuint64_t>(t.batch)};
  // Strides of dims 1..3 in bytes (dim 0 is contiguous).
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.stride.seq * bytes),
                                 static_cast<cuuint64_t>(t.stride.head * bytes),
                                 static_cast<cuuint64_t>(t.stride.batch * bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows),
                             1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUresult r = encode(map, type, 4, const_cast<void*>(t.data), dims, strides, box, elem_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::ostringstream os;
    os << "flash3: cuTensorMapEncodeTiled failed with CUresult " << static_cast<int>(r)
       << " (dims " << t.headdim << "x" << t.seqlen << "x" << t.heads << "x" << t.batch
       << ", box " << box_cols << "x" << box_rows << ")";
    return {StatusCode::kInternal, os.str()};
  }
  return {};
}

}  // namespace flash3::detail
