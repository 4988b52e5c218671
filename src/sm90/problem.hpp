// The problem of one validated call, as the API layer (src/api/) fills it
// and the kernels' launchers (src/sm90/) read it: the layer between them.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "flash3/flash3.hpp"

namespace flash3::detail {

// The public calls, as their error messages begin.
inline constexpr char kForwardCall[] = "flash3::forward";
inline constexpr char kQuantizeCall[] = "flash3::quantize_fp8";
inline constexpr char kQuantizeVCall[] = "flash3::quantize_fp8_v";
inline constexpr char kForwardFp8Call[] = "flash3::forward_fp8";
inline constexpr char kFp8VLayoutCall[] = "flash3::fp8_v_layout";
inline constexpr char kBackwardCall[] = "flash3::backward";
inline constexpr char kBackwardWorkspaceCall[] = "flash3::backward_workspace_size";
inline constexpr char kBackwardVarlenCall[] = "flash3::backward_varlen";
inline constexpr char kForwardWorkspaceCall[] = "flash3::forward_workspace_size";
inline constexpr char kForwardVarlenCall[] = "flash3::forward_varlen";
inline constexpr char kForwardKvCacheCall[] = "flash3::forward_kvcache";
inline constexpr char kKvAppendCall[] = "flash3::kvcache_append";
inline constexpr char kCombineCall[] = "flash3::combine";

#if defined(__CUDACC__)
#define FLASH3_HOST_DEVICE __host__ __device__
#define FLASH3_UNROLL _Pragma("unroll")
#else
#define FLASH3_HOST_DEVICE
#define FLASH3_UNROLL
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
  int headdim = 0;    // of q and k
  int headdim_v = 0;  // of v and out: headdim, or one ForwardValueDims allows (head_dims.hpp)
  float softmax_scale = 0.0f;  // resolved: never 0 here
  bool causal = false;
  // A sliding window (FlashAttention's window_size): query row i sees keys
  // [d - window_left, d + window_right], d = i + seqlen_k - seqlen_q; -1
  // leaves that side unbounded (with causal, the right side is 0 whatever it
  // says).
  int window_left = -1;
  int window_right = -1;
  // FlashAttention-3's attention_chunk (0: none): row i sees only the keys
  // of d's chunk, [c, c + attention_chunk), c = floor(d / attention_chunk) *
  // attention_chunk, within the window.
  int attention_chunk = 0;
  // Gemma 2's logit softcapping (0: none): scores s become softcap * tanh(s /
  // softcap). The masked kernels apply it, forward and backward.
  float softcap = 0.0f;

  bool local() const { return window_left >= 0 || window_right >= 0 || attention_chunk > 0; }
  // Whether the masked kernels run it (mask.cuh): causal, a window, or
  // softcap (which without either is the window (unbounded, unbounded))...
  bool masked() const { return causal || local_kernels(); }
  // ... and which of them: their local variants for a window, a chunk or
  // softcap, the causal ones (which carry none of that) for causal alone.
  bool local_kernels() const { return local() || softcap > 0.0f; }
  // The masked kernels' window sides (mask.cuh: kUnbounded is INT_MAX). A
  // side of seqlen_q + seqlen_k keys or more bounds nothing, and is unbounded
  // there: the kernels' sums of a window side and a position then stay within
  // 32 bits (no tensor holds 2^29 keys).
  int mask_window_left() const { return bounded(window_left) ? window_left : INT_MAX; }
  int mask_window_right() const {
    return causal ? 0 : bounded(window_right) ? window_right : INT_MAX;
  }
  // A chunk of seqlen_q + seqlen_k keys or more hides what that many does
  // (every diagonal lies in [-seqlen_q, seqlen_k)), and keeps sums in 32 bits.
  int mask_chunk() const {
    const long long most = static_cast<long long>(seqlen_q) + seqlen_k;
    return attention_chunk <= 0 ? 0 : static_cast<int>(std::min<long long>(attention_chunk, most));
  }
  bool bounded(int side) const {
    return side >= 0 && static_cast<long long>(side) < static_cast<long long>(seqlen_q) + seqlen_k;
  }
};

// Varlen (varlen_batch > 0): the tensors packed as batch 1 (seqlen_q,
// seqlen_k: the total rows), sequence b's rows from cu_seqlens_q/k[b] to
// [b + 1] (device, varlen_batch + 1 each), the longest query sequence at
// most max_seqlen_q rows (an upper bound that picks a kernel or a grid);
// lse (heads_q, total_q).
struct VarlenFields {
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;  // or null: sequence b uses its first seqused_q[b] rows
  const int* seqused_k = nullptr;
  int varlen_batch = 0;
  int max_seqlen_q = 0;
};

struct ForwardParams : DeviceFields, AttentionProblem, VarlenFields {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  const float* sinks = nullptr;  // heads_q, device, or null (ForwardOptions::sinks)
  float* softmax_lse = nullptr;  // contiguous (batch, heads_q, seqlen_q), or null

  DType dtype = DType::kBFloat16;      // of q, k, v
  DType out_dtype = DType::kBFloat16;  // of out: dtype, or fp16/bf16 for fp8
  Strides3 q_stride, k_stride, v_stride, out_stride;
  // FP8 only: v is in the Fp8V layout (v_stride unused), and the descales.
  DescaleParams q_descale, k_descale, v_descale;
  // The tail split's workspace (fwd/tail_split.hpp: PartialWorkspace), at
  // least PartialWorkspace::bound bytes; null: the per-stream buffer.
  // Varlen uses it for its sequences' query-block prefix sums.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // KV cache (cache_seqlens non-null): k and v (kv_batch, seqlen_k, heads_k,
  // headdim) hold seqlen_k slots per batch, of which batch b uses the first
  // cache_seqlens[b] (device, batch entries), in K/V batch cache_batch_idx[b]
  // (device, or null: b).
  const int* cache_seqlens = nullptr;
  const int* cache_batch_idx = nullptr;
  const int* cache_leftpad = nullptr;  // or null: batch b's keys from slot cache_leftpad[b]
  int kv_batch = 0;
  // A paged KV cache (page_table non-null, fwd/kv_cache.hpp): k and v are
  // kv_batch pages of page_size rows, seqlen_k = pages_per_batch x
  // page_size slots per batch, batch b's pages listed in row
  // cache_batch_idx[b] (b without it) of page_table (device,
  // page_table_rows x pages_per_batch).
  const int* page_table = nullptr;
  int page_table_rows = 0;
  int pages_per_batch = 0;
  int page_size = 0;
};

struct BackwardParams : DeviceFields, AttentionProblem, VarlenFields {
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
  const float* sinks = nullptr;  // with dsinks: BackwardOptions::sinks / dsinks
  float* dsinks = nullptr;
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
  // quantize_fp8_v: the codes go to this Fp8V tensor ([batch][heads][headdim]
  // [fp8_v_padded_seqlen(seqlen)], slots permuted by kFp8VKeyOrder) instead
  // of x_fp8 (null).
  void* v_out = nullptr;
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

// combine: the merge of split-KV partial results (fwd/combine.cu). Element
// strides of the split index and of a row (batch, seqlen, head); sizes of 1
// carry stride 0, so the kernel never multiplies an arbitrary one.
struct SplitStrides {
  int64_t split = 0;
  Strides3 row;
};

struct CombineParams : DeviceFields {
  // All null for an empty problem (rows == 0): nothing is read or written.
  const float* out_partial = nullptr;  // (num_splits, batch, seqlen, heads, headdim)
  const float* lse_partial = nullptr;  // (num_splits, batch, seqlen, heads)
  void* out = nullptr;                 // (batch, seqlen, heads, headdim), out_dtype
  float* lse = nullptr;                // (batch, seqlen, heads), or null

  DType out_dtype = DType::kFloat32;  // float32, float16 or bfloat16
  int num_splits = 0;
  int batch = 0;
  int seqlen = 0;
  int heads = 0;
  int headdim = 0;
  int rows = 0;  // batch * seqlen * heads: one output row each
  SplitStrides out_partial_stride, lse_partial_stride;
  Strides3 out_stride, lse_stride;
};

// kvcache_append: new keys and values written into a KV cache (rotated),
// and q rotated to its positions (fwd/kv_append.cu).
struct KvAppendParams : DeviceFields {
  const void* q = nullptr;          // (batch, seqlen_q, heads_q, headdim)
  void* q_rotated = nullptr;        // like q, or null without rotary
  const void* k_new = nullptr;      // (batch, seqlen_new, heads_k, headdim)
  const void* v_new = nullptr;
  void* k_cache = nullptr;          // (kv_batch, rows, heads_k, headdim): contiguous or pages
  void* v_cache = nullptr;
  const int* cache_seqlens = nullptr;  // batch, device
  const int* cache_batch_idx = nullptr;
  const int* page_table = nullptr;     // (page_table_rows, pages_per_batch), or null
  int* seqlens_out = nullptr;          // batch: min(cache_seqlens + seqlen_new, capacity)
  const void* rotary_cos = nullptr;    // (rotary_rows, rotary_dim / 2), q's dtype, or null
  const void* rotary_sin = nullptr;
  const int* rotary_seqlens = nullptr;  // batch: the rotary positions' start, or null (cached)

  DType dtype = DType::kBFloat16;
  int batch = 0, seqlen_q = 0, seqlen_new = 0, heads_q = 0, heads_k = 0, headdim = 0;
  int headdim_v = 0;        // of v_new and v_cache (ForwardParams::headdim_v)
  int kv_batch = 0;         // cache batches, or pages
  int kv_rows = 0;          // rows per cache batch, or the page size
  int capacity = 0;         // key slots per batch
  int pages_per_batch = 0;  // paged only
  int page_table_rows = 0;
  int rotary_dim = 0, rotary_rows = 0;
  bool rotary_interleaved = false;
  bool causal = false;  // q row i at position cache_seqlens[b] + i (else all at cache_seqlens[b])
  Strides3 q_stride, q_rotated_stride, k_new_stride, v_new_stride, k_cache_stride, v_cache_stride;
};

}  // namespace flash3::detail
