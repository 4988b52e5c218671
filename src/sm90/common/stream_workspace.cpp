#include "stream_workspace.hpp"

#include <map>
#include <mutex>
#include <tuple>

namespace flash3::detail {
namespace {

struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

std::mutex g_mutex;
// Keyed by the stream's process-unique ID, not its handle, which a new
// stream may reuse while the old one's kernels still run.
std::map<std::tuple<int, unsigned long long, WorkspaceUse>, Buffer> g_buffers;

}  // namespace

void* stream_workspace(int device, cudaStream_t stream, size_t bytes, size_t flag_bytes,
                       WorkspaceUse use) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return nullptr;
  }
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  const std::lock_guard<std::mutex> lock(g_mutex);
  Buffer& buffer = g_buffers[{device, id, use}];
  if (buffer.bytes >= bytes) {
    return buffer.ptr;
  }
  void* grown = nullptr;
  if (cudaMallocAsync(&grown, bytes, stream) != cudaSuccess ||
      cudaMemsetAsync(grown, 0, flag_bytes, stream) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the launch goes on without a workspace
    if (grown != nullptr) {
      (void)cudaFreeAsync(grown, stream);
    }
    return nullptr;
  }
  if (buffer.ptr != nullptr) {
    (void)cudaFreeAsync(buffer.ptr, stream);  // after the kernels already queued on it
  }
  buffer = {grown, bytes};
  return grown;
}

}  // namespace flash3::detail
