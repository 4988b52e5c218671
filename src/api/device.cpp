#include "device.hpp"

#include <cuda_runtime_api.h>

#include <sstream>

namespace flash3::detail {
namespace {

constexpr int kHopperMajor = 9;
constexpr int kHopperMinor = 0;

Status cuda_status(StatusCode code, const char* what, cudaError_t err) {
  std::ostringstream os;
  os << "flash3::forward: " << what << " (" << cudaGetErrorName(err) << ": "
     << cudaGetErrorString(err) << ")";
  return Status{code, os.str()};
}

Status check_pointer(const char* name, const void* ptr, int device) {
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
    return cuda_status(StatusCode::kInvalidArgument, name, err);
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return Status{StatusCode::kInvalidArgument,
                  std::string("flash3::forward: ") + name +
                      " is not device memory (pass a cudaMalloc'd or managed pointer)"};
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    std::ostringstream os;
    os << "flash3::forward: " << name << " lives on device " << attr.device
       << " but the current device is " << device;
    return Status{StatusCode::kInvalidArgument, os.str()};
  }
  return Status{};
}

}  // namespace

Status check_device(ForwardParams* params) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    int count = 0;
    err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count == 0) {
      err = cudaErrorNoDevice;
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(StatusCode::kNoDevice, "no usable CUDA device; flash3 needs a Hopper GPU",
                       err);
  }
  int major = 0, minor = 0, sms = 0;
  if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) !=
          cudaSuccess) {
    cudaGetLastError();
    return cuda_status(StatusCode::kCudaError, "cannot query the current device", err);
  }
  if (major != kHopperMajor || minor != kHopperMinor) {
    std::ostringstream os;
    os << "flash3::forward: device " << device << " has compute capability " << major << "."
       << minor << "; flash3's kernels need a Hopper GPU (sm_90: H100, H200)";
    return Status{StatusCode::kNoDevice, os.str()};
  }
  params->device = device;
  params->num_sms = sms;
  return Status{};
}

Status check_pointers(const ForwardParams& p) {
  const struct {
    const char* name;
    const void* ptr;
  } pointers[] = {{"q.data", p.q},     {"k.data", p.k},
                  {"v.data", p.v},     {"out.data", p.out},
                  {"softmax_lse", p.softmax_lse}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr == nullptr) {
      continue;  // only softmax_lse may be null here; validation saw to the rest
    }
    if (Status s = check_pointer(name, ptr, p.device); !s.ok()) {
      return s;
    }
  }
  return Status{};
}

}  // namespace flash3::detail
