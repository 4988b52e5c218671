// flash3: FlashAttention-3 for NVIDIA Hopper. C++ API.
//
// Same calls and rules as the C ABI in flash3.h: every call validates all of
// its arguments before it touches the device; on error it launches nothing,
// writes nothing and returns a Status whose message names the bad argument.
// No exception crosses this boundary.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3 {

enum class DType : int {
  kFloat16 = FLASH3_DTYPE_FLOAT16,
  kBFloat16 = FLASH3_DTYPE_BFLOAT16,
  kFloat32 = FLASH3_DTYPE_FLOAT32,
  kFloat8E4M3 = FLASH3_DTYPE_FLOAT8_E4M3,
};

enum class StatusCode : int {
  kOk = FLASH3_OK,
  kInvalidArgument = FLASH3_ERROR_INVALID_ARGUMENT,
  kUnsupported = FLASH3_ERROR_UNSUPPORTED,
  kNoDevice = FLASH3_ERROR_NO_DEVICE,
  kCudaError = FLASH3_ERROR_CUDA,
  kInternal = FLASH3_ERROR_INTERNAL,
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
};

// A 4-d tensor (batch, seqlen, heads, headdim) in device memory; strides in
// elements, the last one 1.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};

  // A densely packed (batch, seqlen, heads, headdim) tensor.
  static Tensor contiguous(void* data, DType dtype, int64_t batch, int64_t seqlen,
                           int64_t heads, int64_t headdim) {
    Tensor t;
    t.data = data;
    t.dtype = dtype;
    t.shape = {batch, seqlen, heads, headdim};
    t.stride = {seqlen * heads * headdim, heads * headdim, headdim, 1};
    return t;
  }
};

struct ForwardOptions {
  // Causal mask aligned to the bottom-right corner: query row i sees keys
  // j <= i + seqlen_k - seqlen_q (FlashAttention's convention).
  bool causal = false;
  // Scale applied to Q K^T; 0 means 1/sqrt(headdim).
  float softmax_scale = 0.0f;
  // Device scratch for the pieces of a split last wave of tiles (fp32
  // partial outputs and flags): at least forward_workspace_size() bytes,
  // 256-byte aligned, zero-filled before its first use. Each call leaves it
  // fit for the next, so keep one for all forwards on one stream (calls that
  // may run at the same time need their own); it must not overlap a tensor.
  // Unlike the per-stream default it may be used while the stream is
  // captured into a CUDA graph (allocate and zero it in the capture).
  // nullptr: flash3 uses a buffer it keeps per (device, stream), and runs
  // unsplit under graph capture.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // the size of workspace; ignored when it is nullptr
  // Learnable attention sinks (gpt-oss): float32, heads_q values on the
  // device, or nullptr. Each row of query head h has one more logit,
  // sinks[h], in its softmax: it takes probability but adds no value, so
  // out is scaled by exp(lse - lse') and softmax_lse is lse' = log(exp(lse)
  // + exp(sinks[h])) (a row that sees no key: zero out, lse' = sinks[h]).
  // backward() then needs the same sinks' lse (softmax_lse of this call) and
  // gives dq, dk and dv through it.
  const float* sinks = nullptr;
  // A sliding window (FlashAttention's window_size): query row i sees keys
  // j with d - window_left <= j <= d + window_right, d = i + seqlen_k -
  // seqlen_q (bottom-right aligned, like causal); -1 leaves that side
  // unbounded, and with causal the right side is 0 whatever it says. The
  // kernels visit only the key blocks inside each tile's window. A row that
  // sees no key gets zeros and lse +inf (or the sink's). backward() takes
  // the same window (BackwardOptions::window_left/right).
  int window_left = -1;
  int window_right = -1;
  // FlashAttention-3's attention_chunk (Llama 4's chunked attention), 0 for
  // none: row i sees only the keys of its diagonal's chunk, [c, c +
  // attention_chunk) with c = floor(d / attention_chunk) * attention_chunk,
  // within the window and the causal limit.
  int attention_chunk = 0;
  // Logit softcapping (Gemma 2; FlashAttention's softcap), 0 for none: every
  // scaled score s becomes softcap * tanh(s / softcap) before the softmax.
  // 16-bit forward only so far (backward() has none).
  float softcap = 0.0f;
};

// Exact attention forward: out = softmax(scale * q k^T [masked]) v, per head;
// heads_q may be a multiple of heads_k (GQA/MQA). softmax_lse (optional, may
// be nullptr) receives the natural-log log-sum-exp, float32, contiguous
// (batch, heads_q, seqlen_q); rows that see no key get +inf and zero output.
Status forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               float* softmax_lse, const ForwardOptions& options = {},
               cudaStream_t stream = nullptr);

// A packed variable-length batch (FlashAttention's varlen layout): sequence
// b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and out,
// its keys rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v. The
// offsets are int32 in device memory, batch + 1 of each, from 0 and
// non-decreasing; flash3 cannot read them before launching, so it clamps
// every sequence into the tensors (malformed offsets give wrong rows, never
// an access outside them).
struct Varlen {
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int batch = 0;
  int max_seqlen_q = 0;  // at least every sequence's query count (picks the kernel)
  // Optional (int32, device, batch entries each): sequence b uses only its
  // first seqused_q[b] queries and seqused_k[b] keys (FlashAttention's
  // seqused_q / seqused_k); the other query rows of out and lse are left as
  // they were.
  const int* seqused_q = nullptr;
  const int* seqused_k = nullptr;
};

// forward() on a packed variable-length batch: q and out (1, total_q,
// heads_q, headdim), k and v (1, total_k, heads_k, headdim); causal is
// bottom-right per sequence; softmax_lse (optional) (heads_q, total_q).
// Rows of k and v outside every sequence are still read (and hidden by the
// mask), so they must be finite: a NaN there is a NaN in some output row.
// The offsets and counts must not overlap out, softmax_lse or the
// workspace.
// float16 / bfloat16. options.workspace, when given, also holds the
// sequences' prefix sums (forward_workspace_size covers 1.8 million
// sequences); else flash3's per-stream buffer, which graph capture excludes.
Status forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      float* softmax_lse, const Varlen& varlen,
                      const ForwardOptions& options = {}, cudaStream_t stream = nullptr);

// A KV cache (FlashAttention's flash_attn_with_kvcache layout): query batch
// b attends to the first cache_seqlens[b] of its `capacity` key slots.
//  - Contiguous (page_table null): k and v (kv_batch, capacity, heads_k,
//    headdim), batch b's slots in K/V batch cache_batch_idx[b] (b when null).
//  - Paged: k and v are a pool (num_pages, page_size, heads_k, headdim);
//    page_table (page_table_rows, pages_per_batch) lists pages in order, and
//    batch b reads row r = cache_batch_idx[b] (b when null): slot s is row
//    s % page_size of page page_table[r][s / page_size]; capacity =
//    pages_per_batch x page_size. page_size a multiple of 16.
// The arrays are int32 in device memory (cache_seqlens and cache_batch_idx
// batch entries, page_table contiguous); flash3 cannot read them before
// launching, so it clamps each length into [0, capacity], each index into
// [0, kv_batch) and each page into [0, num_pages) (malformed values give
// wrong keys, never an access outside k and v). The slots of a batch's last
// key block past cache_seqlens[b] are read and hidden by the mask, so they
// must hold finite values (a NaN there would reach the output).
struct KvCache {
  const int* cache_seqlens = nullptr;
  const int* cache_batch_idx = nullptr;
  const int* page_table = nullptr;
  int pages_per_batch = 0;  // page_table's columns (paged caches only)
  int page_table_rows = 0;  // page_table's rows; 0: q's batch (paged caches only)
  // Optional (int32, device, batch entries; contiguous caches only): batch
  // b's keys start at slot cache_leftpad[b] (FlashAttention's cache_leftpad:
  // slots before it are padding), so it attends to slots [cache_leftpad[b],
  // cache_seqlens[b]), causal bottom-right over them. kvcache_append ignores
  // it (new keys go to slot cache_seqlens[b], rotated to that position).
  const int* cache_leftpad = nullptr;
};

// forward() against a KV cache: q and out (batch, seqlen_q, heads_q,
// headdim); k and v (kv_batch, capacity, heads_k, headdim), kv_batch ==
// batch unless cache_batch_idx is given, or a paged pool; causal is bottom-right per batch
// (query row i sees cache key j <= i + cache_seqlens[b] - seqlen_q); rows
// that see no key (cache_seqlens[b] = 0) get zeros and +inf. Decoding
// (seqlen_q 1, GQA) packs the group's query heads into one tile and splits
// the keys over the SMs. float16 / bfloat16.
Status forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& out, float* softmax_lse, const KvCache& cache,
                       const ForwardOptions& options = {}, cudaStream_t stream = nullptr);

// New tokens for a KV cache (FlashAttention-3's k, v, rotary_cos, rotary_sin
// of flash_attn_with_kvcache), written by kvcache_append() before
// forward_kvcache() reads the cache.
struct KvCacheAppend {
  // (batch, seqlen_new, heads_k, headdim), q's dtype: batch b's rows go to
  // its cache slots cache_seqlens[b] .. + seqlen_new (slots past the
  // capacity are dropped).
  Tensor k_new, v_new;
  // Rotary embedding (optional: both null for none): tables (rotary_rows,
  // rotary_dim / 2) of q's dtype, contiguous; rotary_dim even, at most the
  // head dim; rotary_rows at least the cache's capacity. Key row s rotates
  // to position cache_seqlens[b] + s, query row s to cache_seqlens[b] + s
  // when `causal`, else to cache_seqlens[b]; pairs (i, i + rotary_dim / 2),
  // or (2i, 2i + 1) when interleaved.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int rotary_rows = 0;
  int rotary_dim = 0;
  bool rotary_interleaved = false;
  bool causal = false;
  // Optional (int32, device, batch entries): the rotary positions start at
  // rotary_seqlens[b] instead of cache_seqlens[b] (FlashAttention-3's
  // rotary_seqlens); positions are clamped into the tables.
  const int* rotary_seqlens = nullptr;
  // Outputs: q rotated (like q; required with rotary, else unused) and each
  // batch's new length, min(cache_seqlens[b] + seqlen_new, capacity) (int32,
  // device, batch entries; required): forward_kvcache's cache_seqlens next.
  Tensor q_rotated;
  int* seqlens_out = nullptr;
};

// Appends `append`'s new keys and values to the cache (contiguous or paged,
// as forward_kvcache takes it) and rotates q. Then call forward_kvcache with
// q_rotated (or q) and cache_seqlens = seqlens_out. The new rows must not
// overlap the cache, q or the outputs.
Status kvcache_append(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const KvCache& cache, const KvCacheAppend& append,
                      cudaStream_t stream = nullptr);

// The workspace forward() and forward_fp8() may use for q's head dim, in
// *bytes: a bound for any Hopper GPU, 7.5 / 9.9 / 19.3 MB at head dims 64 /
// 128 / 256. Pure host code: needs no GPU.
Status forward_workspace_size(const Tensor& q, size_t* bytes);

struct BackwardOptions {
  // As the forward that produced out and softmax_lse.
  bool causal = false;
  float softmax_scale = 0.0f;  // 0 means 1/sqrt(headdim)
  // dq, dk and dv bitwise identical from run to run: the fp32 accumulations
  // across key blocks (dQ) and, for GQA, across query heads (dK, dV) run in
  // a fixed order. Off: the same sums in whatever order the CTAs finish.
  bool deterministic = false;
  // Device scratch of at least backward_workspace_size() bytes, 256-byte
  // aligned, owned by the caller until the call's kernels are done (stream
  // order); its first backward_workspace_size() bytes must not overlap a
  // tensor or softmax_lse. nullptr: flash3 uses a buffer it keeps per
  // (device, stream), which is not allowed while the stream is captured into
  // a CUDA graph.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // the size of workspace; ignored when it is nullptr
  // The forward's sinks (ForwardOptions::sinks) and, to receive their
  // gradient, dsinks: float32, heads_q values on the device, written (not
  // added to), the same from run to run. dq, dk and dv need neither (the
  // forward's softmax_lse holds the sinks); dsinks needs sinks.
  const float* sinks = nullptr;
  float* dsinks = nullptr;
  // The forward's sliding window (ForwardOptions::window_left/right), -1 for
  // an unbounded side, and its attention_chunk.
  int window_left = -1;
  int window_right = -1;
  int attention_chunk = 0;
  // The forward's softcap (ForwardOptions::softcap), 0 for none.
  float softcap = 0.0f;
};

// Gradients of forward(): given dout (shaped like out) and the forward's q,
// k, v, out and softmax_lse (required here), writes dq, dk and dv (shaped
// and typed like q, k and v; any strides Tensor allows; they must not
// overlap each other or an input). GQA: dk and dv are summed over the query
// heads that share a K/V head. Rows that see no key get zero gradients.
Status backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const float* softmax_lse, const Tensor& dq, const Tensor& dk,
                const Tensor& dv, const BackwardOptions& options = {},
                cudaStream_t stream = nullptr);

// The workspace backward() needs for q and k of these shapes, in *bytes (q
// and k validated as backward() validates them; of the options only
// deterministic and whether dsinks is given count). Pure host code: needs no
// GPU. An fp32 dQ accumulator, two fp32 row statistics and an int per
// query block, fp32 dK/dV accumulators with GQA (and an int per key block
// when deterministic), one float per query block with dsinks: O(seqlen *
// headdim), never O(seqlen^2). For v of q's head dim, or narrower ((192, 128)); with v wider than q ((64, 256)) the
// overload that takes v (of v only its head dim and dtype count).
Status backward_workspace_size(const Tensor& q, const Tensor& k, const BackwardOptions& options,
                               size_t* bytes);
Status backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor& v,
                               const BackwardOptions& options, size_t* bytes);

// backward() on a packed variable-length batch (forward_varlen's layout):
// dout, q, out and dq (1, total_q, heads_q, headdim), k, v, dk and dv (1,
// total_k, heads_k, headdim), softmax_lse (heads_q, total_q) as
// forward_varlen wrote it; `varlen` as the forward's (max_seqlen_q only
// sizes the grid of the per-row passes: any value from 1 is correct). Rows
// of dq outside every sequence's used queries (seqused_q), and of dk and dv
// outside every sequence's used keys, are not written (with GQA dk and dv
// are, as zeros); the offsets and counts must not overlap a gradient or the
// workspace. As in forward_varlen, rows outside the sequences are read where
// a tile overlaps them and their contribution zeroed, so they must be finite.
Status backward_varlen(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const float* softmax_lse, const Tensor& dq,
                       const Tensor& dk, const Tensor& dv, const Varlen& varlen,
                       const BackwardOptions& options = {}, cudaStream_t stream = nullptr);

// The workspace backward_varlen() needs, in *bytes: that of backward() for
// the totals plus each sequence's padding (at most varlen.batch tiles of
// query rows per head) and its key blocks' prefix sums. Needs no GPU; of
// varlen only batch counts. v: as for backward_workspace_size() above.
Status backward_workspace_size(const Tensor& q, const Tensor& k, const Varlen& varlen,
                               const BackwardOptions& options, size_t* bytes);
Status backward_workspace_size(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Varlen& varlen, const BackwardOptions& options,
                               size_t* bytes);

struct QuantizeOptions {
  // Sequence rows of one (batch, head) that share a scale, 1 to 2^20; the
  // default is the FP8 forward's tile of query rows.
  int block_rows = 128;
  // Every row first gets the randomized Hadamard transform
  // (x * signs(seed)) H / sqrt(headdim): for Q and K, where it leaves Q K^T
  // unchanged and spreads outliers (incoherent processing).
  bool hadamard = false;
  uint64_t seed = 0;
};

// FP8 (e4m3) quantization of x (float16 or bfloat16; headdim 64, 128 or 256)
// into x_fp8 (same shape, float8_e4m3, both strided as Tensor allows), with
// one scale per block of block_rows sequence rows of one (batch, head):
// descale (float32, contiguous (batch, heads, ceil(seqlen / block_rows)))
// receives amax / 448 (1 for an all-zero block, at least FLT_MIN for any
// other), so that x ~= float(x_fp8) * descale (x transformed, with the
// Hadamard option). Codes are round-to-nearest-even of x times the float
// 1 / descale (with the transform: the unnormalised rows times
// (1 / sqrt(headdim)) / descale), saturated at +-448. x_fp8 must not overlap
// x or descale. Bit for bit the arithmetic of the CPU reference
// (reference/fp8.hpp: quantize_e4m3).
Status quantize_fp8(const Tensor& x, const Tensor& x_fp8, float* descale,
                    const QuantizeOptions& options = {}, cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- FP8 forward
// FP8 tensor cores take both operands of P V with the reduction (key) index
// contiguous, so the FP8 forward reads V transposed, in this layout: e4m3
// bytes, contiguous [batch][heads][headdim][padded_seqlen()], where within
// every 16 consecutive key slots, slot i holds key kFp8VKeyOrder[i] of that
// group (the order in which a thread's P registers already hold the keys);
// slots past seqlen hold zeros. fp8_v_layout() writes it from an e4m3 tensor.
inline constexpr int kFp8VKeyGroup = 16;
inline constexpr int kFp8VKeyOrder[kFp8VKeyGroup] = {0, 1, 8,  9,  2, 3, 10, 11,
                                                     4, 5, 12, 13, 6, 7, 14, 15};
struct Fp8V {
  void* data = nullptr;
  int64_t batch = 0;
  int64_t seqlen = 0;
  int64_t heads = 0;
  int64_t headdim = 0;
  int64_t padded_seqlen() const { return (seqlen + kFp8VKeyGroup - 1) / kFp8VKeyGroup * kFp8VKeyGroup; }
  int64_t bytes() const { return batch * heads * headdim * padded_seqlen(); }
};

// One scale per block of block_rows sequence rows of one (batch, head), as
// quantize_fp8 writes them: float32, contiguous (batch, heads,
// ceil(seqlen / block_rows)); a value v of the tensor is float(code) * scale.
// block_rows >= seqlen is one scale per head (FlashAttention-3's descales).
// Scales must be positive and finite; they live in device memory, so flash3
// cannot check them (a zero or NaN scale gives NaN outputs).
struct Fp8Descale {
  const float* data = nullptr;
  int block_rows = 0;
};
struct Fp8Descales {
  Fp8Descale q;  // heads_q heads; block_rows a multiple of 64, or >= seqlen_q
  Fp8Descale k;  // heads_k heads; block_rows a multiple of 128, or >= seqlen_k
  Fp8Descale v;  // heads_k heads; block_rows a multiple of 128, or >= seqlen_k
};

// Attention forward on FP8 (e4m3) q, k and v (v in the Fp8V layout), with
// their descales; out is float16 or bfloat16 (batch, seqlen_q, heads_q,
// headdim); head dim 128 or 256. Otherwise as forward(). For incoherent
// processing quantize q and k with the same Hadamard seed (quantize_fp8).
Status forward_fp8(const Tensor& q, const Tensor& k, const Fp8V& v, const Tensor& out,
                   float* softmax_lse, const Fp8Descales& descales,
                   const ForwardOptions& options = {}, cudaStream_t stream = nullptr);

// Writes the e4m3 tensor v (batch, seqlen, heads, headdim; strided as Tensor
// allows) into v_out in the Fp8V layout (same batch, seqlen, heads, headdim).
Status fp8_v_layout(const Tensor& v, const Fp8V& v_out, cudaStream_t stream = nullptr);

// quantize_fp8 of v (float16 or bfloat16) with its codes written straight
// into v_out in the Fp8V layout (same sizes): what quantize_fp8 then
// fp8_v_layout give, in one pass. Without the Hadamard option; block_rows a
// multiple of kFp8VKeyGroup or at least seqlen.
Status quantize_fp8_v(const Tensor& v, const Fp8V& v_out, float* descale,
                      const QuantizeOptions& options = {}, cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- combine
// Split-KV partial results (FlashAttention-3's flash_attn_combine): each of
// num_splits splits attended to a part of the keys, giving a partial output
// and log-sum-exp per row; combine() merges them into the attention over all
// the keys. Shapes and strides are in elements; every dimension may have any
// non-negative stride (a size-1 dimension's is ignored) except headdim,
// which must be contiguous (stride 1). Pointers need only their element's
// alignment: 16-byte aligned data and strides take the vectorized path,
// anything else a scalar one.
struct CombineArgs {
  // float32 (num_splits, batch, seqlen, heads, headdim): num_splits >= 1,
  // headdim 1 to kMaxCombineHeadDim; batch, seqlen or heads may be 0 (an
  // empty problem: nothing is launched, and the pointers may be null).
  const float* out_partial = nullptr;
  std::array<int64_t, 5> out_partial_shape{};
  std::array<int64_t, 5> out_partial_stride{};
  // float32 (num_splits, batch, seqlen, heads), shaped by out_partial_shape.
  // FlashAttention-3 lays it out seqlen-contiguous; any strides do here.
  const float* lse_partial = nullptr;
  std::array<int64_t, 4> lse_partial_stride{};
  // float32, float16 or bfloat16 (batch, seqlen, heads, headdim): shaped as
  // out_partial less its split dimension; any strides, headdim contiguous.
  Tensor out;
  // Optional (nullptr to skip): float32 (batch, seqlen, heads).
  // FlashAttention-3 allocates it (batch, heads, seqlen) and transposes it:
  // lse_stride = {heads * seqlen, 1, seqlen}.
  float* lse = nullptr;
  std::array<int64_t, 3> lse_stride{};
};

// The widest row combine() takes (FlashAttention-3 tests up to 512).
inline constexpr int kMaxCombineHeadDim = 1024;

// Per output row (b, s, h), with l_i = lse_partial[i, b, s, h]:
//   lse = log(sum_i exp(l_i))   (torch.logsumexp over the splits)
//   out = sum_i exp(l_i - lse) * out_partial[i, b, s, h, :]
// where a weight exp(l_i - lse) that is inf or NaN counts as 0, as
// FlashAttention-3's reference does: a row whose splits are all -inf (none saw
// a key) gets zeros and lse -inf; any +inf gives zeros and +inf; a NaN lse
// gives zeros and NaN. A split of weight 0 takes no part (whatever its
// values; past the first few it is not even read). Sums in float32; out is
// rounded once to its dtype. out and lse must not overlap each other or
// the inputs.
Status combine(const CombineArgs& args, cudaStream_t stream = nullptr);

// "major.minor.patch"
const char* version();

}  // namespace flash3
