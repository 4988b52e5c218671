#include "device.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <initializer_list>
#include <sstream>

namespace flash3::detail {
namespace {

constexpr int kHopperMajor = 9;
constexpr int kHopperMinor = 0;

struct NamedPointer {
  const char* name;
  const void* ptr;
};

Status cuda_status(StatusCode code, const char* call, const char* what, cudaError_t err) {
  std::ostringstream os;
  os << call << ": " << what << " (" << cudaGetErrorName(err) << ": " << cudaGetErrorString(err)
     << ")";
  return Status{code, os.str()};
}

Status check_pointer(const char* call, const char* name, const void* ptr, int device) {
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
    return cuda_status(StatusCode::kInvalidArgument, call, name, err);
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return Status{StatusCode::kInvalidArgument,
                  std::string(call) + ": " + name +
                      " is not device memory (pass a cudaMalloc'd or managed pointer)"};
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    std::ostringstream os;
    os << call << ": " << name << " lives on device " << attr.device
       << " but the current device is " << device;
    return Status{StatusCode::kInvalidArgument, os.str()};
  }
  return Status{};
}

// Null pointers are skipped: validation has refused those that may not be null.
Status check_each_pointer(const char* call, int device, std::initializer_list<NamedPointer> list) {
  for (const auto& [name, ptr] : list) {
    if (ptr == nullptr) {
      continue;
    }
    if (Status s = check_pointer(call, name, ptr, device); !s.ok()) {
      return s;
    }
  }
  return Status{};
}

// SM counts of the Hopper devices seen so far (0: not yet queried), so that a
// call costs one cudaGetDevice instead of five runtime queries.
constexpr int kMaxCachedDevices = 64;
std::atomic<int> g_hopper_sms[kMaxCachedDevices];

}  // namespace

Status check_device(const char* call, DeviceFields* current) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess && device >= 0 && device < kMaxCachedDevices) {
    if (const int sms = g_hopper_sms[device].load(std::memory_order_relaxed); sms > 0) {
      current->device = device;
      current->num_sms = sms;
      return Status{};
    }
  }
  if (err == cudaSuccess) {
    int count = 0;
    err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count == 0) {
      err = cudaErrorNoDevice;
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(StatusCode::kNoDevice, call,
                       "no usable CUDA device; flash3 needs a Hopper GPU", err);
  }
  int major = 0, minor = 0, sms = 0;
  if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) !=
          cudaSuccess) {
    cudaGetLastError();
    return cuda_status(StatusCode::kCudaError, call, "cannot query the current device", err);
  }
  if (major != kHopperMajor || minor != kHopperMinor) {
    std::ostringstream os;
    os << call << ": device " << device << " has compute capability " << major << "." << minor
       << "; flash3's kernels need a Hopper GPU (sm_90: H100, H200)";
    return Status{StatusCode::kNoDevice, os.str()};
  }
  if (device >= 0 && device < kMaxCachedDevices) {
    g_hopper_sms[device].store(sms, std::memory_order_relaxed);
  }
  current->device = device;
  current->num_sms = sms;
  return Status{};
}

Status check_pointers(const char* call, const ForwardParams& p) {
  // The descales are null (skipped) for the 16-bit forward.
  return check_each_pointer(call, p.device,
                            {{"q.data", p.q},
                             {"k.data", p.k},
                             {"v.data", p.v},
                             {"out.data", p.out},
                             {"softmax_lse", p.softmax_lse},
                             {"descales.q.data", p.q_descale.data},
                             {"descales.k.data", p.k_descale.data},
                             {"descales.v.data", p.v_descale.data},
                             {"varlen.cu_seqlens_q", p.cu_seqlens_q},
                             {"varlen.cu_seqlens_k", p.cu_seqlens_k},
                             {"varlen.seqused_q", p.seqused_q},
                             {"varlen.seqused_k", p.seqused_k},
                             {"cache.cache_seqlens", p.cache_seqlens},
                             {"cache.cache_batch_idx", p.cache_batch_idx},
                             {"cache.page_table", p.page_table},
                             {"cache.cache_leftpad", p.cache_leftpad},
                             {"options.sinks", p.sinks}});
}

Status check_pointers(const char* call, const BackwardParams& p) {
  // The workspace is null (skipped) when flash3's own per-stream buffer is used.
  return check_each_pointer(call, p.device,
                            {{"dout.data", p.dout},
                             {"q.data", p.q},
                             {"k.data", p.k},
                             {"v.data", p.v},
                             {"out.data", p.out},
                             {"softmax_lse", p.softmax_lse},
                             {"dq.data", p.dq},
                             {"dk.data", p.dk},
                             {"dv.data", p.dv},
                             {"options.workspace", p.workspace},
                             {"varlen.cu_seqlens_q", p.cu_seqlens_q},
                             {"varlen.cu_seqlens_k", p.cu_seqlens_k},
                             {"varlen.seqused_q", p.seqused_q},
                             {"varlen.seqused_k", p.seqused_k},
                             {"options.sinks", p.sinks},
                             {"options.dsinks", p.dsinks}});
}

Status check_pointers(const char* call, const Fp8VLayoutParams& p) {
  return check_each_pointer(call, p.device, {{"v.data", p.v}, {"v_out.data", p.v_out}});
}

Status check_pointers(const char* call, const CombineParams& p) {
  // All null for an empty problem; lse is null when not asked for.
  return check_each_pointer(call, p.device,
                            {{"out_partial", p.out_partial},
                             {"lse_partial", p.lse_partial},
                             {"out.data", p.out},
                             {"lse", p.lse}});
}

Status check_pointers(const char* call, const KvAppendParams& p) {
  return check_each_pointer(call, p.device,
                            {{"q.data", p.q},
                             {"append.q_rotated.data", p.q_rotated},
                             {"append.k_new.data", p.k_new},
                             {"append.v_new.data", p.v_new},
                             {"k_cache.data", p.k_cache},
                             {"v_cache.data", p.v_cache},
                             {"cache.cache_seqlens", p.cache_seqlens},
                             {"cache.cache_batch_idx", p.cache_batch_idx},
                             {"cache.page_table", p.page_table},
                             {"append.seqlens_out", p.seqlens_out},
                             {"append.rotary_cos", p.rotary_cos},
                             {"append.rotary_sin", p.rotary_sin},
                             {"append.rotary_seqlens", p.rotary_seqlens}});
}

Status check_pointers(const char* call, const QuantizeParams& p) {
  return check_each_pointer(call, p.device,
                            {{"x.data", p.x}, {"x_fp8.data", p.x_fp8}, {"descale", p.descale}});
}

}  // namespace flash3::detail
