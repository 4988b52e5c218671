// Host-side launch helpers of the kernels of both directions: cluster
// launches and the once-per-(kernel, device) setup.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace flash3::detail {

// A launch of `ctas` CTAs of `threads` in clusters of `cluster_ctas`.
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};

  ClusterLaunch(unsigned ctas, int threads, int smem_bytes, cudaStream_t stream,
                unsigned cluster_ctas) {
    config.gridDim = dim3(ctas);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cluster_ctas;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points at cluster
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Once per (kernel, device), since each costs microseconds and holds for the
// context's lifetime: the kernel's dynamic shared memory attribute and, with
// kClusterCtas > 1, how many such clusters of it fit on the device at once
// (cudaOccupancyMaxActiveClusters: 66 of two on the H200's 132 SMs; 0 if
// none, and the launch goes without clusters). The kernel is a template
// argument (not its type, which all forward kernels share).
struct KernelSetup {
  cudaError_t err;
  int max_clusters;
};
template <auto kKernel, int kClusterCtas>
KernelSetup setup_kernel(int threads, int smem_bytes, int device) {
  static std::atomic<int> done[64] = {};  // max_clusters + 1 once set up
  std::atomic<int>* slot = device >= 0 && device < 64 ? &done[device] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) > 0) {
    return {cudaSuccess, slot->load(std::memory_order_relaxed) - 1};
  }
  const cudaError_t err =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) {
    return {err, 0};
  }
  int clusters = 0;
  if constexpr (kClusterCtas > 1) {
    const ClusterLaunch launch(kClusterCtas, threads, smem_bytes, nullptr, kClusterCtas);
    if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &launch.config) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky
      clusters = 0;
    }
  }
  if (slot != nullptr) {
    slot->store(clusters + 1, std::memory_order_relaxed);
  }
  return {cudaSuccess, clusters};
}

}  // namespace flash3::detail
