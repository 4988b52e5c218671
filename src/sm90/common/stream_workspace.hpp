// Device memory that flash3 keeps for a stream: the tail split's partial
// outputs and flags (src/sm90/fwd/tail_split.hpp), and the backward's
// accumulators (src/sm90/bwd/workspace.hpp) when the caller passes none. One
// buffer per (device, stream, use), grown in stream order and kept for the process's lifetime, so
// kernels on one stream never share it with kernels on another; the flags
// are zeroed when the buffer is made and every kernel leaves them zero.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace flash3::detail {

// At least `bytes` of this stream's workspace, the first `flag_bytes` of
// them zero whenever a kernel starts on the stream; null while the stream is
// being captured into a CUDA graph (a graph, replayed on any stream, must
// not hold memory that this cache hands to eager calls) or if the allocation
// fails: the caller then runs without one.
enum class WorkspaceUse { kForwardTailSplit, kBackward, kVarlenPrefix };
void* stream_workspace(int device, cudaStream_t stream, size_t bytes, size_t flag_bytes,
                       WorkspaceUse use = WorkspaceUse::kForwardTailSplit);

}  // namespace flash3::detail
