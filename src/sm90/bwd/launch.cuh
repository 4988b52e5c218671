// Host side of one backward instantiation: the workspace, the pre-pass, the
// main kernel and the post-passes, in stream order.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "sm90/launch.hpp"
#include "sm90/common/stream_workspace.hpp"
#include "kernel.cuh"
#include "postpass.cuh"
#include "prepass.cuh"
#include "sm90/common/launch.hpp"
#include "sm90/common/tensor_map.hpp"
#include "sm90/common/varlen_prefix.cuh"
#include "workspace.hpp"

namespace flash3::detail {

namespace bwd_launch {

// The call's name, as its messages begin.
inline const char* call_of(const BackwardParams& p) {
  return p.varlen_batch > 0 ? kBackwardVarlenCall : kBackwardCall;
}

inline Status cuda_failure(const BackwardParams& p, const char* what, cudaError_t err) {
  return {StatusCode::kCudaError, std::string(call_of(p)) + ": " + what + " failed: " +
                                      cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

// The sequences of a varlen call (batch 0: dense), with the key blocks'
// prefix sums in the workspace.
inline sm90::VarlenSequences varlen_of(const BackwardParams& p,
                                       const sm90::bwd::WorkspaceLayout& w, uint8_t* ws) {
  if (p.varlen_batch == 0) {
    return {};
  }
  return {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k,
          reinterpret_cast<const int*>(ws + w.key_prefix), p.varlen_batch, p.seqlen_q,
          p.seqlen_k};
}

// The caller's workspace, or this stream's (not while it is captured).
inline Status workspace_of(const BackwardParams& p, size_t bytes, cudaStream_t stream,
                           uint8_t** ws) {
  if (p.workspace != nullptr) {
    *ws = static_cast<uint8_t*>(p.workspace);
    return {};
  }
  *ws = static_cast<uint8_t*>(
      stream_workspace(p.device, stream, bytes, 0, WorkspaceUse::kBackward));
  if (*ws == nullptr) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const bool capturing = cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
                           capture != cudaStreamCaptureStatusNone;
    (void)cudaGetLastError();
    return {capturing ? StatusCode::kInvalidArgument : StatusCode::kCudaError,
            std::string(call_of(p)) +
                (capturing ? ": options.workspace is null while the stream is being captured "
                             "into a CUDA graph; pass a workspace of backward_workspace_size() "
                             "bytes"
                           : ": could not allocate the workspace (" + std::to_string(bytes) +
                                 " bytes)")};
  }
  return {};
}

// The scores' scale, softcap and mask, as the main kernel takes them and the
// pre-pass too (the rows whose D it takes exactly).
template <class Args>
void set_scores(const BackwardParams& p, Args* a) {
  a->softmax_scale = p.softmax_scale;
  a->scale_log2 = p.softmax_scale * sm90::kLog2e;
  a->softcap = p.softcap;
  a->window_left = p.mask_window_left();
  a->window_right = p.mask_window_right();
  a->chunk = p.mask_chunk();
}

// A Traits type as a value, to choose the main kernels' in a generic lambda.
template <class T>
struct TraitsTag {
  using type = T;
};

template <class T, bool kCausal, bool kVarlen, bool kLocal>
Status launch_main(const BackwardParams& p, const sm90::bwd::WorkspaceLayout& w, uint8_t* ws,
                   cudaStream_t stream) {
  constexpr int kSmemBytes = sm90::bwd::shared_storage_bytes<T>();
  static_assert(kSmemBytes <= sm90::bwd::kMaxSmemPerBlock, "shared memory budget exceeded");
  sm90::bwd::KernelArgs args{};
  const TensorMapShape q{p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, p.headdim, p.q_stride};
  const TensorMapShape dout{p.dout, p.dtype, p.batch, p.seqlen_q, p.heads_q, T::kHeadDimV,
                            p.dout_stride};
  const TensorMapShape k{p.k, p.dtype, p.batch, p.seqlen_k, p.heads_k, p.headdim, p.k_stride};
  const TensorMapShape v{p.v, p.dtype, p.batch, p.seqlen_k, p.heads_k, T::kHeadDimV, p.v_stride};
  constexpr int kCols = T::kSwizzleCols;
  for (Status s : {make_tensor_map(q, kCols, T::kBlockM, &args.q),
                   make_tensor_map(dout, kCols, T::kBlockM, &args.dout),
                   make_tensor_map(k, kCols, T::kBlockN, &args.k),
                   make_tensor_map(v, kCols, T::kBlockN, &args.v)}) {
    if (!s.ok()) {
      return s;
    }
  }
  args.dk = p.dk;
  args.dv = p.dv;
  // Dense without GQA, dK and dV leave by TMA where their strides allow a
  // tensor map (16-byte multiples), else straight from registers.
  if (!kVarlen && !w.gqa) {
    const TensorMapShape dk{p.dk, p.dtype, p.batch, p.seqlen_k, p.heads_k, p.headdim, p.dk_stride};
    const TensorMapShape dv{p.dv, p.dtype, p.batch, p.seqlen_k, p.heads_k, T::kHeadDimV,
                            p.dv_stride};
    args.dkv_tma = make_tensor_map(dk, kCols, T::kBlockN, &args.dk_map).ok() &&
                   make_tensor_map(dv, kCols, T::kBlockN, &args.dv_map).ok();
  }
  args.dk_stride = p.dk_stride;
  args.dv_stride = p.dv_stride;
  args.dk_accum = w.gqa ? reinterpret_cast<float*>(ws + w.dk_accum) : nullptr;
  args.dv_accum = w.gqa ? reinterpret_cast<float*>(ws + w.dv_accum) : nullptr;
  args.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum);
  args.lse_log2 = reinterpret_cast<const float*>(ws + w.lse_log2);
  args.dpsum = reinterpret_cast<const float*>(ws + w.dpsum);
  args.dq_state = reinterpret_cast<int*>(ws + w.dq_state);
  args.dkv_semaphore =
      p.deterministic && w.gqa ? reinterpret_cast<int*>(ws + w.dkv_semaphore) : nullptr;
  args.varlen = varlen_of(p, w, ws);
  args.seqlen_q = p.seqlen_q;
  args.seqlen_k = p.seqlen_k;
  args.heads_q = p.heads_q;
  args.heads_per_kv_head = p.heads_q / p.heads_k;
  args.num_m_blocks = w.num_m_blocks;
  args.num_n_blocks = w.num_n_blocks;
  args.padded_seqlen_q = static_cast<int>(w.padded_seqlen_q);
  set_scores(p, &args);
  args.deterministic = p.deterministic;

  constexpr auto kernel = sm90::bwd::backward_kernel<T, kCausal, kVarlen, kLocal>;
  const KernelSetup setup = setup_kernel<kernel, 1>(T::kThreads, kSmemBytes, p.device);
  if (setup.err != cudaSuccess) {
    return cuda_failure(p, "setting up the kernel", setup.err);
  }
  // Varlen: p.batch is 1, and num_n_blocks bounds every sequence's key blocks together.
  kernel<<<dim3(w.num_n_blocks, p.heads_q, p.batch), T::kThreads, kSmemBytes, stream>>>(args);
  return {};
}

}  // namespace bwd_launch

template <DType kDType, int kHeadDim, int kHeadDimV>
Status launch_backward_sm90(const BackwardParams& p, cudaStream_t stream) {
  using T = sm90::bwd::Traits<kDType, kHeadDim, kHeadDimV>;
  const bool dsinks = p.dsinks != nullptr;
  const auto w = sm90::bwd::WorkspaceLayout::of(p.batch, p.seqlen_q, p.seqlen_k, p.heads_q,
                                                p.heads_k, p.headdim, kHeadDimV, p.deterministic,
                                                p.varlen_batch, dsinks);
  const int row_batches = p.varlen_batch > 0 ? p.varlen_batch : p.batch;
  if (w.padded_seqlen_q > INT_MAX || row_batches > 65535 || p.heads_q > 65535) {
    return {StatusCode::kInvalidArgument,
            std::string(bwd_launch::call_of(p)) + ": the batch (or varlen.batch) and heads_q must be at most " +
                "65535 and the query rows, rounded up to " + std::to_string(T::kBlockM) +
                " per sequence, at most 2^31-1"};
  }
  uint8_t* ws = nullptr;
  if (Status s = bwd_launch::workspace_of(p, w.bytes, stream, &ws); !s.ok()) {
    return s;
  }
  // The main kernel's Traits: TD where deterministic mode has kernels of
  // its own (traits.cuh, ConfigFor), else T. They say whether its consumers
  // add dQ into zeroed sums themselves (kDqAtomic), or its dQ writer stores
  // each block's first part and adds the others (the dQ state, workspace.hpp).
  using TD = sm90::bwd::Traits<kDType, kHeadDim, kHeadDimV, true>;
  const bool own_deterministic = TD::Config::kOwnKernels && p.deterministic;
  const bool dq_atomic = own_deterministic ? TD::kDqAtomic : T::kDqAtomic;
  cudaError_t err = cudaSuccess;
  // Sums that start at zero: GQA's dK / dV (two regions one after the
  // other), and their deterministic turns.
  if (w.gqa) {
    err = cudaMemsetAsync(ws + w.dk_accum, 0, w.dkv_end - w.dk_accum, stream);
  }
  if (err == cudaSuccess && p.deterministic && w.gqa) {
    const size_t end = p.varlen_batch > 0 ? w.key_prefix : dsinks ? w.sink_partials : w.bytes;
    err = cudaMemsetAsync(ws + w.dkv_semaphore, 0, end - w.dkv_semaphore, stream);
  }
  if (err == cudaSuccess && dsinks) {  // the gaps between varlen sequences' blocks stay 0
    err = cudaMemsetAsync(ws + w.sink_partials, 0, w.bytes - w.sink_partials, stream);
  }
  if (err != cudaSuccess) {
    return bwd_launch::cuda_failure(p, "zeroing the workspace", err);
  }
  const sm90::VarlenSequences varlen = bwd_launch::varlen_of(p, w, ws);
  if (p.varlen_batch > 0) {
    sm90::varlen_prefix_kernel<T::kBlockN><<<1, sm90::kVarlenPrefixThreads, 0, stream>>>(
        p.cu_seqlens_k, p.seqused_k, p.varlen_batch, p.seqlen_k,
        reinterpret_cast<int*>(ws + w.key_prefix));
  }

  // The per-query-block passes: (query block, head, batch), or varlen (a
  // stride over each sequence's query blocks, head, sequence); the pre-pass
  // takes the same blocks in another order (below).
  const dim3 row_blocks(
      p.varlen_batch > 0 ? (p.max_seqlen_q + T::kBlockM - 1) / T::kBlockM : w.num_m_blocks,
      p.heads_q, row_batches);
  sm90::bwd::PrepassArgs pre{};
  pre.out = p.out;
  pre.dout = p.dout;
  pre.out_stride = p.out_stride;
  pre.dout_stride = p.dout_stride;
  pre.q = p.q;
  pre.k = p.k;
  pre.v = p.v;
  pre.q_stride = p.q_stride;
  pre.k_stride = p.k_stride;
  pre.v_stride = p.v_stride;
  pre.seqlen_k = p.seqlen_k;
  pre.heads_per_kv_head = p.heads_q / p.heads_k;
  bwd_launch::set_scores(p, &pre);
  pre.lse = p.softmax_lse;
  pre.lse_log2 = reinterpret_cast<float*>(ws + w.lse_log2);
  pre.dpsum = reinterpret_cast<float*>(ws + w.dpsum);
  pre.dq_state = reinterpret_cast<int*>(ws + w.dq_state);
  pre.dq_accum = dq_atomic ? reinterpret_cast<float*>(ws + w.dq_accum) : nullptr;
  pre.varlen = varlen;
  pre.sinks = p.sinks;
  pre.sink_partials = dsinks ? reinterpret_cast<float*>(ws + w.sink_partials) : nullptr;
  pre.seqlen_q = p.seqlen_q;
  pre.heads_q = p.heads_q;
  pre.padded_seqlen_q = static_cast<int>(w.padded_seqlen_q);
  // The pre-pass: (head, batch or sequence, query block), the query block
  // slowest (prepass.cuh), in at most 65535 of them (a stride over the rest).
  const dim3 prepass_blocks(p.heads_q, row_batches, std::min(row_blocks.x, 65535u));
  sm90::bwd::prepass_kernel<T><<<prepass_blocks, sm90::bwd::kPrepassThreads, 0, stream>>>(pre);
  if (dsinks) {
    const sm90::bwd::SinksReduceArgs reduce{pre.sink_partials, p.dsinks, p.batch, p.heads_q,
                                            w.num_m_blocks};
    sm90::bwd::sinks_reduce_kernel<T><<<p.heads_q, sm90::bwd::kSinksReduceThreads, 0, stream>>>(
        reduce);
  }

  // Causal alone, the local variants (a window, a chunk, softcap), or
  // neither; deterministic, the kernels of its own configuration where it
  // differs (traits.cuh, ConfigFor).
  const auto main = [&](auto varlen, auto traits) {
    constexpr bool kVarlen = decltype(varlen)::value;
    using TM = typename decltype(traits)::type;
    using bwd_launch::launch_main;
    return !p.masked()          ? launch_main<TM, false, kVarlen, false>(p, w, ws, stream)
           : p.local_kernels() ? launch_main<TM, true, kVarlen, true>(p, w, ws, stream)
                               : launch_main<TM, true, kVarlen, false>(p, w, ws, stream);
  };
  const auto main_of = [&](auto traits) {
    return p.varlen_batch > 0 ? main(std::true_type{}, traits) : main(std::false_type{}, traits);
  };
  Status s;
  if constexpr (TD::Config::kOwnKernels) {
    s = own_deterministic ? main_of(bwd_launch::TraitsTag<TD>{})
                          : main_of(bwd_launch::TraitsTag<T>{});
  } else {
    s = main_of(bwd_launch::TraitsTag<T>{});
  }
  if (!s.ok()) {
    return s;
  }

  sm90::bwd::PostpassArgs post{};
  post.dq_accum = reinterpret_cast<const float*>(ws + w.dq_accum);
  post.dq_state = dq_atomic ? nullptr : reinterpret_cast<const int*>(ws + w.dq_state);
  post.dq = p.dq;
  post.dq_stride = p.dq_stride;
  post.varlen = varlen;
  post.seqlen_q = p.seqlen_q;
  post.heads_q = p.heads_q;
  post.padded_seqlen_q = static_cast<int>(w.padded_seqlen_q);
  post.softmax_scale = p.softmax_scale;
  sm90::bwd::dq_postpass_kernel<T><<<row_blocks, sm90::bwd::kPostpassThreads, 0, stream>>>(post);

  if (w.gqa) {
    sm90::bwd::DkvPostpassArgs kv{};
    kv.dk_accum = reinterpret_cast<const float*>(ws + w.dk_accum);
    kv.dv_accum = reinterpret_cast<const float*>(ws + w.dv_accum);
    kv.dk = p.dk;
    kv.dv = p.dv;
    kv.dk_stride = p.dk_stride;
    kv.dv_stride = p.dv_stride;
    kv.seqlen_k = p.seqlen_k;
    kv.heads_k = p.heads_k;
    kv.rows = static_cast<int64_t>(p.batch) * p.heads_k * p.seqlen_k;
    const int64_t quads = kv.rows * p.headdim / 4;
    const int64_t blocks = (quads + sm90::bwd::kPostpassThreads - 1) / sm90::bwd::kPostpassThreads;
    const int grid = static_cast<int>(blocks < 8 * p.num_sms ? blocks : 8 * p.num_sms);
    if (grid > 0) {
      sm90::bwd::dkv_postpass_kernel<T><<<grid, sm90::bwd::kPostpassThreads, 0, stream>>>(kv);
    }
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return bwd_launch::cuda_failure(p, "launch", err);
  }
  return {};
}

}  // namespace flash3::detail
