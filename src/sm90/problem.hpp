// The problem of one validated call, as the API layer (src/api/) fills it
// and the kernels' launchers (src/sm90/) read it: the layer between them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flash3/flash3.hpp"

namespace flash3::detail {

// The public calls, as their error messages begin.
inline constexpr char kForwardCall[] = "flash3::forward";
inline constexpr char kQuantizeCall[] = "flash3::quantize_fp8";
inline constexpr char kForwardFp8Call[] = "flash3::forward_fp8";
inline constexpr char kFp8VLayoutCall[] = "flash3::fp8_v_layout";
inline constexpr char kBackwardCall[] = "flash3::backward";
inline constexpr char kBackwardWorkspaceCall[] = "flash3::backward_workspace_size";
inline constexpr char kForwardWorkspaceCall[] = "flash3::forward_workspace_size";

#if defined(__CUDACC__)
#define FLASH3_HOST_DEVICE __host__ __device__
#else
#define FLASH3_HOST_DEVICE
#endif

// Element strides of a (batch, seqlen, heads, headdim) tensor, headdim contiguous.
struct Strides3 {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;

  // Elements from the tensor's start to (batch, row, head, 0).
  FLASH3_HOST_DEVICE int64_t offset(int64_t b, int64_t row, int64_t h) const {
    return b * batch + row * seq + h * head;
  }
};

// Key slots per head-dim row of the Fp8V layout (Fp8V::padded_seqlen).
inline int fp8_v_padded_seqlen(int seqlen) {
  return static_cast<int>(Fp8V{nullptr, 0, seqlen, 0, 0}.padded_seqlen());
}

// n / d for 0 <= n, d < 2^31 by a multiply-high, an add and a shift: the
// kernels divide by a runtime block size in every key block, where an
// integer division (~20 instructions, two on the MUFU pipe) sat in the
// softmax's critical path (ncu, fp8 d128). Round-up method: with
// s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1,
// n / d = (umulhi(n, m) + n) >> s.
struct FastDivisor {
  uint32_t mul = 1;
  uint32_t shift = 0;

  static FastDivisor of(int d) {
    FastDivisor f;
    while ((1ull << f.shift) < static_cast<uint64_t>(d)) {
      ++f.shift;
    }
    f.mul = static_cast<uint32_t>(((1ull << 32) * ((1ull << f.shift) - d)) / d + 1);
    return f;
  }
  FLASH3_HOST_DEVICE int divide(int n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(static_cast<uint32_t>(n), mul);  // no 64-bit register pair
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * mul) >> 32);
#endif
    return static_cast<int>((hi + static_cast<uint32_t>(n)) >> shift);
  }
};

// One scale per block of rows of one (batch, head): data[(b * heads + h) *
// blocks_per_head + row / block_rows].
struct DescaleParams {
  const float* data = nullptr;
  FastDivisor by_block_rows;  // row / block_rows
  int blocks_per_head = 0;
};

// What the device check fills in, after validation (device.hpp).
struct DeviceFields {
  int device = 0;
  int num_sms = 0;
};

// What every attention call describes (a base that varlen and paged-cache
// fields extend): q (batch, seqlen_q, heads_q, headdim), k and v (batch,
// seqlen_k, heads_k, headdim), the scale and the mask.
struct AttentionProblem {
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_k = 0;
  int headdim = 0;
  float softmax_scale = 0.0f;  // resolved: never 0 here
  bool causal = false;
};

struct ForwardParams : DeviceFields, AttentionProblem {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* softmax_lse = nullptr;  // contiguous (batch, heads_q, seqlen_q), or null

  DType dtype = DType::kBFloat16;      // of q, k, v
  DType out_dtype = DType::kBFloat16;  // of out: dtype, or fp16/bf16 for fp8
  Strides3 q_stride, k_stride, v_stride, out_stride;
  // FP8 only: v is in the Fp8V layout (v_stride unused), and the descales.
  DescaleParams q_descale, k_descale, v_descale;
  // The tail split's workspace (fwd/tail_split.hpp: PartialWorkspace), at
  // least PartialWorkspace::bound bytes; null: the per-stream buffer.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct BackwardParams : DeviceFields, AttentionProblem {
  const void* dout = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const float* softmax_lse = nullptr;  // contiguous (batch, heads_q, seqlen_q)
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* workspace = nullptr;  // null: the per-stream buffer (workspace.hpp)
  size_t workspace_bytes = 0;

  DType dtype = DType::kBFloat16;  // of every tensor
  Strides3 dout_stride, q_stride, k_stride, v_stride, out_stride, dq_stride, dk_stride, dv_stride;

  bool deterministic = false;
};

struct QuantizeParams : DeviceFields {
  const void* x = nullptr;
  void* x_fp8 = nullptr;
  float* descale = nullptr;  // contiguous (batch, heads, blocks_per_head)

  DType dtype = DType::kBFloat16;  // of x
  int batch = 0;
  int seqlen = 0;
  int heads = 0;
  int headdim = 0;
  Strides3 x_stride, x_fp8_stride;

  int block_rows = 0;
  int blocks_per_head = 0;  // ceil(seqlen / block_rows)
  int num_blocks = 0;       // batch * heads * blocks_per_head: the number of scales
  bool hadamard = false;
  uint64_t seed = 0;
};

// fp8_v_layout: v (e4m3, strided) into the Fp8V layout.
struct Fp8VLayoutParams : DeviceFields {
  const void* v = nullptr;
  void* v_out = nullptr;
  int batch = 0;
  int seqlen = 0;
  int heads = 0;
  int headdim = 0;
  Strides3 v_stride;
};

}  // namespace flash3::detail
