// The C ABI: converts flash3_* structs to the C++ API and keeps the last error.
#include <string>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"

namespace {

thread_local std::string g_last_error;

#define FLASH3_STR2(x) #x
#define FLASH3_STR(x) FLASH3_STR2(x)

flash3::Tensor to_cpp(const flash3_tensor& t) {
  flash3::Tensor r;
  r.data = t.data;
  r.dtype = static_cast<flash3::DType>(t.dtype);
  for (int i = 0; i < 4; ++i) {
    r.shape[i] = t.shape[i];
    r.stride[i] = t.stride[i];
  }
  return r;
}

static_assert(FLASH3_FP8_V_KEY_GROUP == flash3::kFp8VKeyGroup,
              "flash3.h and flash3.hpp disagree on the FP8 V layout's key group");
static_assert(FLASH3_MAX_COMBINE_HEAD_DIM == flash3::kMaxCombineHeadDim,
              "flash3.h and flash3.hpp disagree on combine's widest row");

flash3::Fp8V to_cpp(const flash3_fp8_v& v) {
  flash3::Fp8V r;
  r.data = v.data;
  r.batch = v.batch;
  r.seqlen = v.seqlen;
  r.heads = v.heads;
  r.headdim = v.headdim;
  return r;
}

flash3::Fp8Descale to_cpp(const flash3_fp8_descale& d) {
  flash3::Fp8Descale r;
  r.data = d.data;
  r.block_rows = d.block_rows;
  return r;
}

// Sinks and windows: flash3_forward_args has them, the FP8 forward's args not yet.
const float* sinks_of(const flash3_forward_args& args) { return args.sinks; }
template <class Args>
const float* sinks_of(const Args&) {
  return nullptr;
}
// The masked kernels' options of flash3_forward_args or flash3_backward_args.
template <class Args, class Options>
void set_window(const Args& args, Options* options) {
  if (args.window != 0) {
    options->window_left = args.window_left;
    options->window_right = args.window_right;
  }
  options->attention_chunk = args.attention_chunk;
  options->softcap = args.softcap;
}
void set_window(const flash3_forward_fp8_args&, flash3::ForwardOptions*) {}

// Either forward's args (flash3_forward_args, flash3_forward_fp8_args).
template <class Args>
flash3::ForwardOptions forward_options(const Args& args) {
  flash3::ForwardOptions options;
  options.causal = args.causal != 0;
  options.softmax_scale = args.softmax_scale;
  options.workspace = args.workspace;
  options.workspace_bytes = args.workspace_bytes;
  options.sinks = sinks_of(args);
  set_window(args, &options);
  return options;
}

flash3::BackwardOptions backward_options(const flash3_backward_args& args) {
  flash3::BackwardOptions options;
  options.causal = args.causal != 0;
  options.softmax_scale = args.softmax_scale;
  options.sinks = args.sinks;
  options.dsinks = args.dsinks;
  set_window(args, &options);
  options.deterministic = args.deterministic != 0;
  options.workspace = args.workspace;
  options.workspace_bytes = args.workspace_bytes;
  return options;
}

flash3_status finish(const flash3::Status& s) {
  g_last_error = s.message;
  return static_cast<flash3_status>(s.code);
}

}  // namespace

extern "C" {

flash3_status flash3_forward(const flash3_forward_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_forward: args is null"});
  }
  return finish(flash3::forward(to_cpp(args->q), to_cpp(args->k), to_cpp(args->v),
                                to_cpp(args->out), args->softmax_lse, forward_options(*args),
                                stream));
}

flash3_status flash3_forward_varlen(const flash3_forward_varlen_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_forward_varlen: args is null"});
  }
  const flash3_forward_args& f = args->forward;
  const flash3::Varlen varlen{args->cu_seqlens_q, args->cu_seqlens_k, args->batch,
                              args->max_seqlen_q, args->seqused_q, args->seqused_k};
  return finish(flash3::forward_varlen(to_cpp(f.q), to_cpp(f.k), to_cpp(f.v), to_cpp(f.out),
                                       f.softmax_lse, varlen, forward_options(f), stream));
}

flash3_status flash3_kvcache_append(const flash3_kvcache_append_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_kvcache_append: args is null"});
  }
  const flash3::KvCache cache{args->cache_seqlens, args->cache_batch_idx, args->page_table,
                              args->pages_per_batch, args->page_table_rows};
  flash3::KvCacheAppend append;
  append.k_new = to_cpp(args->k_new);
  append.v_new = to_cpp(args->v_new);
  append.rotary_cos = args->rotary_cos;
  append.rotary_sin = args->rotary_sin;
  append.rotary_rows = args->rotary_rows;
  append.rotary_dim = args->rotary_dim;
  append.rotary_interleaved = args->rotary_interleaved != 0;
  append.causal = args->causal != 0;
  append.q_rotated = to_cpp(args->q_rotated);
  append.seqlens_out = args->seqlens_out;
  append.rotary_seqlens = args->rotary_seqlens;
  return finish(flash3::kvcache_append(to_cpp(args->q), to_cpp(args->k_cache),
                                       to_cpp(args->v_cache), cache, append, stream));
}

flash3_status flash3_forward_kvcache(const flash3_forward_kvcache_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_forward_kvcache: args is null"});
  }
  const flash3_forward_args& f = args->forward;
  const flash3::KvCache cache{args->cache_seqlens, args->cache_batch_idx, args->page_table,
                              args->pages_per_batch, args->page_table_rows,
                              args->cache_leftpad};
  return finish(flash3::forward_kvcache(to_cpp(f.q), to_cpp(f.k), to_cpp(f.v), to_cpp(f.out),
                                        f.softmax_lse, cache, forward_options(f), stream));
}

flash3_status flash3_forward_workspace_size(const flash3_tensor* q, size_t* bytes) {
  if (q == nullptr) {
    return finish(
        {flash3::StatusCode::kInvalidArgument, "flash3_forward_workspace_size: q is null"});
  }
  return finish(flash3::forward_workspace_size(to_cpp(*q), bytes));
}

flash3_status flash3_backward(const flash3_backward_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_backward: args is null"});
  }
  return finish(flash3::backward(to_cpp(args->dout), to_cpp(args->q), to_cpp(args->k),
                                 to_cpp(args->v), to_cpp(args->out), args->softmax_lse,
                                 to_cpp(args->dq), to_cpp(args->dk), to_cpp(args->dv),
                                 backward_options(*args), stream));
}

flash3_status flash3_backward_workspace_size(const flash3_backward_args* args, size_t* bytes) {
  if (args == nullptr) {
    return finish(
        {flash3::StatusCode::kInvalidArgument, "flash3_backward_workspace_size: args is null"});
  }
  if (bytes == nullptr) {
    return finish(
        {flash3::StatusCode::kInvalidArgument, "flash3_backward_workspace_size: bytes is null"});
  }
  if (args->v.shape[3] == 0) {  // v not set: of q's head dim
    return finish(flash3::backward_workspace_size(to_cpp(args->q), to_cpp(args->k),
                                                  backward_options(*args), bytes));
  }
  return finish(flash3::backward_workspace_size(to_cpp(args->q), to_cpp(args->k),
                                                to_cpp(args->v), backward_options(*args), bytes));
}

namespace {
flash3::Varlen varlen_of(const flash3_backward_varlen_args& args) {
  return {args.cu_seqlens_q, args.cu_seqlens_k, args.batch,
          args.max_seqlen_q, args.seqused_q,    args.seqused_k};
}
}  // namespace

flash3_status flash3_backward_varlen(const flash3_backward_varlen_args* args,
                                     cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_backward_varlen: args is null"});
  }
  const flash3_backward_args& b = args->backward;
  return finish(flash3::backward_varlen(to_cpp(b.dout), to_cpp(b.q), to_cpp(b.k), to_cpp(b.v),
                                        to_cpp(b.out), b.softmax_lse, to_cpp(b.dq),
                                        to_cpp(b.dk), to_cpp(b.dv), varlen_of(*args),
                                        backward_options(b), stream));
}

flash3_status flash3_backward_varlen_workspace_size(const flash3_backward_varlen_args* args,
                                                    size_t* bytes) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument,
                   "flash3_backward_varlen_workspace_size: args is null"});
  }
  if (bytes == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument,
                   "flash3_backward_varlen_workspace_size: bytes is null"});
  }
  const flash3_backward_args& b = args->backward;
  if (b.v.shape[3] == 0) {  // v not set: of q's head dim
    return finish(flash3::backward_workspace_size(to_cpp(b.q), to_cpp(b.k), varlen_of(*args),
                                                  backward_options(b), bytes));
  }
  return finish(flash3::backward_workspace_size(to_cpp(b.q), to_cpp(b.k), to_cpp(b.v),
                                                varlen_of(*args), backward_options(b), bytes));
}

flash3_status flash3_quantize_fp8(const flash3_quantize_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_quantize_fp8: args is null"});
  }
  flash3::QuantizeOptions options;
  options.block_rows = args->block_rows;
  options.hadamard = args->hadamard != 0;
  options.seed = args->seed;
  return finish(flash3::quantize_fp8(to_cpp(args->x), to_cpp(args->x_fp8), args->descale,
                                     options, stream));
}

flash3_status flash3_forward_fp8(const flash3_forward_fp8_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_forward_fp8: args is null"});
  }
  flash3::Fp8Descales descales;
  descales.q = to_cpp(args->q_descale);
  descales.k = to_cpp(args->k_descale);
  descales.v = to_cpp(args->v_descale);
  return finish(flash3::forward_fp8(to_cpp(args->q), to_cpp(args->k), to_cpp(args->v),
                                    to_cpp(args->out), args->softmax_lse, descales,
                                    forward_options(*args), stream));
}

flash3_status flash3_fp8_v_layout(const flash3_fp8_v_layout_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_fp8_v_layout: args is null"});
  }
  return finish(flash3::fp8_v_layout(to_cpp(args->v), to_cpp(args->v_out), stream));
}

flash3_status flash3_quantize_fp8_v(const flash3_quantize_v_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_quantize_fp8_v: args is null"});
  }
  flash3::QuantizeOptions options;
  options.block_rows = args->block_rows;
  return finish(flash3::quantize_fp8_v(to_cpp(args->v), to_cpp(args->v_out), args->descale,
                                       options, stream));
}

flash3_status flash3_combine(const flash3_combine_args* args, cudaStream_t stream) {
  if (args == nullptr) {
    return finish({flash3::StatusCode::kInvalidArgument, "flash3_combine: args is null"});
  }
  flash3::CombineArgs a;
  a.out_partial = args->out_partial;
  a.lse_partial = args->lse_partial;
  a.out = to_cpp(args->out);
  a.lse = args->lse;
  for (int i = 0; i < 5; ++i) {
    a.out_partial_shape[i] = args->out_partial_shape[i];
    a.out_partial_stride[i] = args->out_partial_stride[i];
  }
  for (int i = 0; i < 4; ++i) {
    a.lse_partial_stride[i] = args->lse_partial_stride[i];
  }
  for (int i = 0; i < 3; ++i) {
    a.lse_stride[i] = args->lse_stride[i];
  }
  return finish(flash3::combine(a, stream));
}

const char* flash3_last_error(void) { return g_last_error.c_str(); }

const char* flash3_version(void) {
  return FLASH3_STR(FLASH3_VERSION_MAJOR) "." FLASH3_STR(FLASH3_VERSION_MINOR) "." FLASH3_STR(
      FLASH3_VERSION_PATCH);
}

const char* flash3_status_name(flash3_status status) {
  switch (status) {
    case FLASH3_OK:
      return "FLASH3_OK";
    case FLASH3_ERROR_INVALID_ARGUMENT:
      return "FLASH3_ERROR_INVALID_ARGUMENT";
    case FLASH3_ERROR_UNSUPPORTED:
      return "FLASH3_ERROR_UNSUPPORTED";
    case FLASH3_ERROR_NO_DEVICE:
      return "FLASH3_ERROR_NO_DEVICE";
    case FLASH3_ERROR_CUDA:
      return "FLASH3_ERROR_CUDA";
    case FLASH3_ERROR_INTERNAL:
      return "FLASH3_ERROR_INTERNAL";
  }
  return "FLASH3_UNKNOWN_STATUS";
}

}  // extern "C"
