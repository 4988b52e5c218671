/* flash3: FlashAttention-3 for NVIDIA Hopper. C ABI.
 *
 * Every call validates all of its arguments before it touches the device and
 * returns FLASH3_OK or an error code; on error nothing is launched and nothing
 * is written, and flash3_last_error() returns a message naming the bad
 * argument (per thread, valid until the next flash3 call on that thread).
 *
 * Tensors are described by pointer, shape and element strides in the layout
 * (batch, seqlen, heads, headdim), as FlashAttention does. The last dimension
 * must be contiguous (stride 1).
 */
#ifndef FLASH3_FLASH3_H_
#define FLASH3_FLASH3_H_

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASH3_VERSION_MAJOR 0
#define FLASH3_VERSION_MINOR 1
#define FLASH3_VERSION_PATCH 0

typedef enum flash3_status {
  FLASH3_OK = 0,
  FLASH3_ERROR_INVALID_ARGUMENT = 1, /* a bad pointer, shape, stride, dtype or option */
  FLASH3_ERROR_UNSUPPORTED = 2,      /* valid, but not implemented (head dim, dtype, ...) */
  FLASH3_ERROR_NO_DEVICE = 3,        /* no CUDA device, or not a Hopper (sm_90) device */
  FLASH3_ERROR_CUDA = 4,             /* the CUDA runtime or driver reported an error */
  FLASH3_ERROR_INTERNAL = 5          /* a bug in flash3: please report it */
} flash3_status;

typedef enum flash3_dtype {
  FLASH3_DTYPE_FLOAT16 = 1,
  FLASH3_DTYPE_BFLOAT16 = 2,
  FLASH3_DTYPE_FLOAT32 = 3, /* only for the log-sum-exp output */
  FLASH3_DTYPE_FLOAT8_E4M3 = 4
} flash3_dtype;

/* A 4-d tensor (batch, seqlen, heads, headdim) in device memory.
 * Strides are in elements; stride[3] must be 1. */
typedef struct flash3_tensor {
  void* data;
  flash3_dtype dtype;
  int64_t shape[4];
  int64_t stride[4];
} flash3_tensor;

typedef struct flash3_forward_args {
  flash3_tensor q;   /* (batch, seqlen_q, heads_q, headdim) */
  flash3_tensor k;   /* (batch, seqlen_k, heads_k, headdim), heads_q % heads_k == 0 */
  flash3_tensor v;   /* (batch, seqlen_k, heads_k, headdim) */
  flash3_tensor out; /* like q; must not overlap itself */
  /* Optional (NULL to skip): log-sum-exp of each row of scores, natural log,
   * float32, contiguous (batch, heads_q, seqlen_q). Rows with no visible key
   * (causal with seqlen_q > seqlen_k) get +INFINITY and an output of zeros,
   * as FlashAttention does. */
  float* softmax_lse;
  /* Scale applied to Q K^T before the softmax; 0 means 1/sqrt(headdim). */
  float softmax_scale;
  /* Nonzero: causal mask aligned to the bottom-right corner, i.e. query row i
   * sees keys j <= i + seqlen_k - seqlen_q. */
  int causal;
  /* Device scratch for the pieces of a split last wave of tiles: at least
   * flash3_forward_workspace_size() bytes, 256-byte aligned, zero-filled
   * before its first use and then kept for the forwards of one stream (each
   * leaves it fit for the next; calls that may run at the same time need
   * their own); it must not overlap a tensor. Usable while the stream is
   * captured into a CUDA graph. NULL: flash3's own per-stream buffer (and no
   * split under graph capture). Zero-initialize the struct to leave it NULL. */
  void* workspace;
  size_t workspace_bytes; /* the size of workspace; ignored when it is NULL */
  /* Learnable attention sinks (flash3.hpp: ForwardOptions::sinks): float32,
   * heads_q values on the device, or NULL. */
  const float* sinks;
  /* Nonzero: a sliding window (flash3.hpp: ForwardOptions::window_left and
   * window_right): query row i sees keys j with d - window_left <= j <= d +
   * window_right, d = i + seqlen_k - seqlen_q; -1 leaves a side unbounded.
   * Zero (as in a zero-initialized struct): no window, whatever the two say. */
  int window;
  int window_left;
  int window_right;
  /* flash3.hpp: ForwardOptions::attention_chunk; 0: none. */
  int attention_chunk;
  /* flash3.hpp: ForwardOptions::softcap; 0: none. */
  float softcap;
} flash3_forward_args;

/* Exact attention forward, enqueued on `stream`. */
flash3_status flash3_forward(const flash3_forward_args* args, cudaStream_t stream);

/* A packed variable-length batch (flash3.hpp: Varlen): q and out (1, total_q,
 * heads_q, headdim), k and v (1, total_k, heads_k, headdim), sequence b's
 * rows from cu_seqlens_q/k[b] to [b + 1] (int32, device, batch + 1 each);
 * softmax_lse (heads_q, total_q). The rest as in flash3_forward_args. */
typedef struct flash3_forward_varlen_args {
  flash3_forward_args forward;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int batch;
  int max_seqlen_q; /* at least every sequence's query count */
  /* Optional (NULL, or int32, device, batch entries): sequence b uses its
   * first seqused_q[b] queries and seqused_k[b] keys only. */
  const int* seqused_q;
  const int* seqused_k;
} flash3_forward_varlen_args;

/* Attention forward over a packed variable-length batch, enqueued on `stream`. */
flash3_status flash3_forward_varlen(const flash3_forward_varlen_args* args, cudaStream_t stream);

/* A KV cache (flash3.hpp: KvCache): k and v (kv_batch, capacity, heads_k,
 * headdim); query batch b attends to the first cache_seqlens[b] slots of K/V
 * batch cache_batch_idx[b] (NULL: b); int32, device, batch entries each.
 * Paged (page_table not NULL): k and v (num_pages, page_size, heads_k,
 * headdim), page_table (page_table_rows (0: batch), pages_per_batch) int32,
 * device, row cache_batch_idx[b] (NULL: b) for batch b; page_size a multiple
 * of 16. The rest as in flash3_forward_args. */
typedef struct flash3_forward_kvcache_args {
  flash3_forward_args forward;
  const int* cache_seqlens;
  const int* cache_batch_idx;
  const int* page_table;
  int pages_per_batch;
  int page_table_rows;
  /* Optional (NULL, or int32, device, batch entries; contiguous caches only):
   * batch b attends to slots [cache_leftpad[b], cache_seqlens[b]). */
  const int* cache_leftpad;
} flash3_forward_kvcache_args;

/* Attention forward against a KV cache, enqueued on `stream`. */
flash3_status flash3_forward_kvcache(const flash3_forward_kvcache_args* args, cudaStream_t stream);

/* New tokens for a KV cache (flash3.hpp: KvCacheAppend, kvcache_append): k_new
 * and v_new (batch, seqlen_new, heads_k, headdim) written after each batch's
 * cache_seqlens[b] slots of k_cache / v_cache (contiguous or paged as in
 * flash3_forward_kvcache_args), rotated when rotary_cos and rotary_sin
 * ((rotary_rows, rotary_dim / 2), q's dtype) are given, q rotated into
 * q_rotated; seqlens_out[b] = min(cache_seqlens[b] + seqlen_new, capacity). */
typedef struct flash3_kvcache_append_args {
  flash3_tensor q, k_cache, v_cache, k_new, v_new, q_rotated;
  const int* cache_seqlens;
  const int* cache_batch_idx;
  const int* page_table;
  int pages_per_batch;
  const void* rotary_cos;
  const void* rotary_sin;
  int rotary_rows;
  int rotary_dim;
  int rotary_interleaved;
  int causal;
  int* seqlens_out;
  int page_table_rows;
  const int* rotary_seqlens; /* optional: rotary positions from rotary_seqlens[b] */
} flash3_kvcache_append_args;

/* Appends new keys and values to a KV cache and rotates q, enqueued on `stream`. */
flash3_status flash3_kvcache_append(const flash3_kvcache_append_args* args, cudaStream_t stream);

/* The bytes of workspace a forward (flash3_forward, flash3_forward_fp8) may
 * use for q's head dim on any Hopper GPU; only q's dtype and head dim are
 * read. Needs no GPU. */
flash3_status flash3_forward_workspace_size(const flash3_tensor* q, size_t* bytes);

typedef struct flash3_backward_args {
  flash3_tensor dout; /* gradient of out: shaped and typed like out */
  flash3_tensor q;    /* the forward's inputs and output */
  flash3_tensor k;
  flash3_tensor v;
  flash3_tensor out;
  /* Required: the forward's log-sum-exp, float32, contiguous (batch, heads_q, seqlen_q). */
  const float* softmax_lse;
  flash3_tensor dq; /* shaped and typed like q, k, v; must not overlap each other or an input */
  flash3_tensor dk;
  flash3_tensor dv;
  /* Device scratch of at least flash3_backward_workspace_size() bytes, 256-byte
   * aligned, whose first flash3_backward_workspace_size() bytes do not overlap a
   * tensor or softmax_lse; or NULL for flash3's own per-stream buffer (not while
   * the stream is captured into a CUDA graph). */
  void* workspace;
  size_t workspace_bytes; /* the size of workspace; ignored when it is NULL */
  float softmax_scale; /* as in the forward: 0 means 1/sqrt(headdim) */
  int causal;          /* as in the forward */
  int deterministic;   /* nonzero: dq, dk, dv bitwise identical from run to run */
  /* Optional (flash3.hpp: BackwardOptions): the forward's sinks and, to
   * receive their gradient, dsinks (float32, heads_q each, device). */
  const float* sinks;
  float* dsinks;
  /* Nonzero: the forward's sliding window (flash3_forward_args' window,
   * window_left, window_right); zero: none. And its attention_chunk. */
  int window;
  int window_left;
  int window_right;
  int attention_chunk;
  float softcap; /* the forward's softcap; 0: none */
} flash3_backward_args;

/* Gradients dq, dk, dv of flash3_forward, enqueued on `stream`. GQA: dk and dv
 * are summed over the query heads that share a K/V head. */
flash3_status flash3_backward(const flash3_backward_args* args, cudaStream_t stream);

/* The workspace flash3_backward needs, in *bytes, for the shapes of args->q and
 * args->k, args->v's head dim where it is set (shape[3] > 0; needed when v is
 * wider than q, (64, 256)) and args->deterministic (the other fields are
 * ignored). Host only: needs no GPU. */
flash3_status flash3_backward_workspace_size(const flash3_backward_args* args, size_t* bytes);

/* flash3_backward on a packed variable-length batch (flash3.hpp:
 * backward_varlen): the tensors of flash3_backward_args with batch 1 (total
 * rows), softmax_lse (heads_q, total_q), and the forward's sequences. */
typedef struct flash3_backward_varlen_args {
  flash3_backward_args backward;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int batch;
  int max_seqlen_q;
  const int* seqused_q; /* optional, as in flash3_forward_varlen_args */
  const int* seqused_k;
} flash3_backward_varlen_args;

flash3_status flash3_backward_varlen(const flash3_backward_varlen_args* args,
                                     cudaStream_t stream);

/* The workspace flash3_backward_varlen needs, in *bytes (of args, the shapes
 * of backward.q and backward.k, backward.v's head dim where it is set,
 * backward.deterministic and batch count). */
flash3_status flash3_backward_varlen_workspace_size(const flash3_backward_varlen_args* args,
                                                    size_t* bytes);

typedef struct flash3_quantize_args {
  flash3_tensor x;     /* (batch, seqlen, heads, headdim 64, 128 or 256), float16 or bfloat16 */
  flash3_tensor x_fp8; /* like x, float8_e4m3; must not overlap x or descale */
  /* float32, contiguous (batch, heads, ceil(seqlen / block_rows)): the scale
   * of each block, amax / 448 (1 for an all-zero block), so that
   * x ~= float(x_fp8) * descale (in the transformed basis with hadamard). */
  float* descale;
  /* Sequence rows of one (batch, head) that share a scale, 1 to 2^20
   * (the C++ default, 128, is the FP8 forward's tile of query rows). */
  int block_rows;
  /* Nonzero: every row first gets the randomized Hadamard transform
   * (x * signs(seed)) H / sqrt(headdim), for Q and K (incoherent processing). */
  int hadamard;
  uint64_t seed;
} flash3_quantize_args;

/* FP8 (e4m3) quantization with one scale per block of rows of one head,
 * enqueued on `stream`; codes round to nearest-even and saturate at +-448. */
flash3_status flash3_quantize_fp8(const flash3_quantize_args* args, cudaStream_t stream);

/* ---------------------------------------------------------------- FP8 forward
 * FP8 tensor cores take both operands of P V with the reduction (key) index
 * contiguous, so the FP8 forward reads V transposed, in this layout: e4m3
 * bytes, contiguous [batch][heads][headdim][padded_seqlen], padded_seqlen =
 * seqlen rounded up to a multiple of FLASH3_FP8_V_KEY_GROUP (16); within
 * every 16 consecutive key slots, slot i holds key order[i] of that group,
 *   order = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15}
 * (flash3::kFp8VKeyOrder), and slots past seqlen hold zeros. The buffer is
 * batch * heads * headdim * padded_seqlen bytes; flash3_fp8_v_layout writes
 * it from an e4m3 (batch, seqlen, heads, headdim) tensor. */
#define FLASH3_FP8_V_KEY_GROUP 16

typedef struct flash3_fp8_v {
  void* data; /* 16-byte aligned */
  int64_t batch;
  int64_t seqlen;
  int64_t heads;
  int64_t headdim;
} flash3_fp8_v;

/* One scale per block of block_rows sequence rows of one (batch, head), as
 * flash3_quantize_fp8 writes them: float32, contiguous (batch, heads,
 * ceil(seqlen / block_rows)); a value of the tensor is float(code) * scale.
 * block_rows >= seqlen is one scale per head. Scales must be positive and
 * finite (device memory: not checked). */
typedef struct flash3_fp8_descale {
  const float* data;
  int block_rows;
} flash3_fp8_descale;

typedef struct flash3_forward_fp8_args {
  flash3_tensor q;   /* float8_e4m3 (batch, seqlen_q, heads_q, headdim 128 or 256) */
  flash3_tensor k;   /* float8_e4m3 (batch, seqlen_k, heads_k, headdim), heads_q % heads_k == 0 */
  flash3_fp8_v v;    /* (batch, seqlen_k, heads_k, headdim) in the layout above */
  flash3_tensor out; /* float16 or bfloat16, shaped like q; must not overlap itself or an input */
  float* softmax_lse; /* optional, as in flash3_forward_args */
  /* Required. q: heads_q heads, block_rows a multiple of 64 or >= seqlen_q;
   * k and v: heads_k heads, block_rows a multiple of 128 or >= seqlen_k. */
  flash3_fp8_descale q_descale;
  flash3_fp8_descale k_descale;
  flash3_fp8_descale v_descale;
  float softmax_scale; /* 0 means 1/sqrt(headdim) */
  int causal;          /* as in flash3_forward_args */
  void* workspace;     /* as in flash3_forward_args */
  size_t workspace_bytes;
} flash3_forward_fp8_args;

/* Attention forward on FP8 q, k, v with their descales, enqueued on `stream`.
 * For incoherent processing quantize q and k with the same Hadamard seed. */
flash3_status flash3_forward_fp8(const flash3_forward_fp8_args* args, cudaStream_t stream);

typedef struct flash3_fp8_v_layout_args {
  flash3_tensor v;     /* float8_e4m3 (batch, seqlen, heads, headdim 64, 128 or 256) */
  flash3_fp8_v v_out;  /* same batch, seqlen, heads, headdim; must not overlap v */
} flash3_fp8_v_layout_args;

/* Writes v into v_out in the FP8 forward's V layout, enqueued on `stream`. */
flash3_status flash3_fp8_v_layout(const flash3_fp8_v_layout_args* args, cudaStream_t stream);

typedef struct flash3_quantize_v_args {
  flash3_tensor v;     /* (batch, seqlen, heads, headdim 64, 128 or 256), float16 or bfloat16 */
  flash3_fp8_v v_out;  /* same batch, seqlen, heads, headdim; must not overlap v or descale */
  float* descale;      /* as flash3_quantize_args' */
  /* As flash3_quantize_args', and a multiple of FLASH3_FP8_V_KEY_GROUP or
   * at least seqlen. No Hadamard option: V is not transformed. */
  int block_rows;
} flash3_quantize_v_args;

/* flash3_quantize_fp8 of v with the codes written straight into v_out in the
 * FP8 forward's V layout (what flash3_quantize_fp8 then flash3_fp8_v_layout
 * give, in one pass), enqueued on `stream`. */
flash3_status flash3_quantize_fp8_v(const flash3_quantize_v_args* args, cudaStream_t stream);

/* ---------------------------------------------------------------- combine
 * Split-KV partial results merged (flash3.hpp: CombineArgs, combine): per row
 * (b, s, h), lse = log(sum_i exp(lse_partial[i, b, s, h])) and out = sum_i
 * exp(lse_partial[i, b, s, h] - lse) * out_partial[i, b, s, h, :], a weight
 * that is inf or NaN counting as 0 (all -inf: zeros and lse -inf). Strides
 * in elements, any non-negative ones; headdim contiguous. */
#define FLASH3_MAX_COMBINE_HEAD_DIM 1024

typedef struct flash3_combine_args {
  /* float32 (num_splits >= 1, batch, seqlen, heads, headdim 1..1024); batch,
   * seqlen or heads 0 is an empty problem (pointers may then be NULL). */
  const float* out_partial;
  int64_t out_partial_shape[5];
  int64_t out_partial_stride[5];
  /* float32 (num_splits, batch, seqlen, heads), shaped by out_partial_shape. */
  const float* lse_partial;
  int64_t lse_partial_stride[4];
  /* float32, float16 or bfloat16 (batch, seqlen, heads, headdim); must not
   * overlap the inputs or lse. */
  flash3_tensor out;
  /* Optional (NULL to skip): float32 (batch, seqlen, heads). */
  float* lse;
  int64_t lse_stride[3];
} flash3_combine_args;

/* The merge of split-KV partial results, enqueued on `stream`. */
flash3_status flash3_combine(const flash3_combine_args* args, cudaStream_t stream);

/* The message of the last error on this thread ("" after a success). */
const char* flash3_last_error(void);

/* "major.minor.patch" */
const char* flash3_version(void);

/* A short name for a status code, e.g. "FLASH3_ERROR_INVALID_ARGUMENT". */
const char* flash3_status_name(flash3_status status);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASH3_FLASH3_H_ */
