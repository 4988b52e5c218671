// Host side of one forward instantiation: tensor maps, grid, launch.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <string>

#include "sm90/launch.hpp"
#include "sm90/common/stream_workspace.hpp"
#include "kernel.cuh"
#include "decode.hpp"
#include "grid.hpp"
#include "sm90/common/launch.hpp"
#include "sm90/common/varlen_prefix.cuh"
#include "sm90/common/tensor_map.hpp"

namespace flash3::detail {

// K and V's batches: a KV cache's own (KvCacheSequences; a paged cache's
// pages), else q's.
inline int kv_batch(const ForwardParams& p) {
  return p.cache_seqlens != nullptr ? p.kv_batch : p.batch;
}
// K and V's rows per batch in their tensor maps: a paged cache's page size,
// else seqlen_k.
inline int kv_rows(const ForwardParams& p) {
  return p.page_table != nullptr ? p.page_size : p.seqlen_k;
}
// K's and V's box rows: a paged cache loads a key block in boxes of
// paged_box_rows (each within one page).
inline int kv_box_rows(const ForwardParams& p, int rows, int block_n) {
  return p.page_table != nullptr ? sm90::fwd::paged_box_rows(p.page_size, block_n) : rows;
}

// The tensor map of V: rows of the head dim as given (16-bit), or for fp8
// the Fp8V layout, whose rows are the head dim and columns the (padded) keys.
template <class T>
TensorMapShape v_map_shape(const ForwardParams& p) {
  if constexpr (T::kFp8) {
    const int pad = fp8_v_padded_seqlen(p.seqlen_k);
    const Strides3 stride{static_cast<int64_t>(p.heads_k) * p.headdim * pad, pad,
                          static_cast<int64_t>(p.headdim) * pad};
    return {p.v, p.dtype, p.batch, p.headdim, p.heads_k, pad, stride};
  } else {
    return {p.v, p.dtype, kv_batch(p), kv_rows(p), p.heads_k, p.headdim_v, p.v_stride};
  }
}

// Varlen: the prefix sums' place (the caller's workspace past the tail
// split's flags, which varlen launches leave alone, else a buffer of the
// stream's own).
inline Status varlen_prefix_buffer(const ForwardParams& p, cudaStream_t stream, int** prefix) {
  const size_t bytes = (static_cast<size_t>(p.varlen_batch) + 1) * sizeof(int);
  if (p.workspace != nullptr) {
    const size_t offset = sm90::fwd::PartialWorkspace::flag_bytes(p.num_sms);
    if (offset + bytes > p.workspace_bytes) {
      return {StatusCode::kInvalidArgument,
              std::string(kForwardVarlenCall) + ": options.workspace_bytes = " +
                  std::to_string(p.workspace_bytes) + " holds no prefix sums for " +
                  std::to_string(p.varlen_batch) + " sequences"};
    }
    *prefix = reinterpret_cast<int*>(static_cast<uint8_t*>(p.workspace) + offset);
  } else {
    *prefix = static_cast<int*>(
        stream_workspace(p.device, stream, bytes, 0, WorkspaceUse::kVarlenPrefix));
    if (*prefix == nullptr) {
      return {StatusCode::kInvalidArgument,
              std::string(kForwardVarlenCall) +
                  ": a varlen forward needs options.workspace while the stream is captured "
                  "into a CUDA graph (or the per-stream buffer could not be allocated)"};
    }
  }
  return {};
}

// A varlen launch (the maps and the rest of args set by launch_variant):
// the pre-pass, then a persistent grid of at most one CTA per SM over the
// dense tile space, whose size only the pre-pass knows: at most
// heads_q x max_query_blocks tiles, so at most that many CTAs. Every
// refusal comes before the pre-pass writes anything.
template <class T, bool kCausal, int kSmemBytes>
Status launch_varlen(const ForwardParams& p, cudaStream_t stream, sm90::fwd::KernelArgs& args) {
  const long long most_tiles =
      static_cast<long long>(p.heads_q) *
      sm90::max_query_blocks(p.seqlen_q, p.varlen_batch, T::kBlockM);
  if (most_tiles > INT_MAX) {
    return {StatusCode::kInvalidArgument,
            std::string(kForwardVarlenCall) + ": heads_q * (total_q / " +
                std::to_string(T::kBlockM) + " + batch) = " + std::to_string(most_tiles) +
                " tiles exceeds 2^31-1"};
  }
  constexpr auto kernel = sm90::fwd::forward_kernel<T, kCausal>;
  const KernelSetup setup = setup_kernel<kernel, 1>(T::kThreads, kSmemBytes, p.device);
  cudaError_t err = setup.err;
  int* prefix = nullptr;
  if (err == cudaSuccess) {
    if (Status s = varlen_prefix_buffer(p, stream, &prefix); !s.ok()) {
      return s;
    }
    sm90::varlen_prefix_kernel<T::kBlockM><<<1, sm90::kVarlenPrefixThreads, 0, stream>>>(
        p.cu_seqlens_q, p.seqused_q, p.varlen_batch, p.seqlen_q, prefix);
    err = cudaGetLastError();
  }
  args.varlen = {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k, prefix,
                 p.varlen_batch, p.seqlen_q, p.seqlen_k};
  args.seqlen_q = p.max_seqlen_q;  // the kernel-wide values: unused by varlen tiles
  args.num_m_blocks = 1;
  args.by_m_blocks = detail::FastDivisor::of(1);
  const unsigned ctas =
      static_cast<unsigned>(std::max(1LL, std::min<long long>(p.num_sms, most_tiles)));
  if (err == cudaSuccess) {
    kernel<<<ctas, T::kThreads, kSmemBytes, stream>>>(args);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string(kForwardVarlenCall) + ": launch failed: " +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
  }
  return {};
}

// One kernel variant: tensor maps, grid, launch.
template <class T, bool kCausal>
Status launch_variant(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kSmemBytes = sm90::fwd::shared_storage_bytes<T>();
  static_assert(kSmemBytes <= sm90::fwd::kMaxSmemPerBlock, "shared memory budget exceeded");

  sm90::fwd::KernelArgs args{};
  const TensorMapShape q{p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, p.headdim, p.q_stride};
  const TensorMapShape k{p.k, p.dtype, kv_batch(p), kv_rows(p), p.heads_k, p.headdim,
                         p.k_stride};
  const TensorMapShape v = v_map_shape<T>(p);
  const TensorMapShape o{p.out, p.out_dtype, p.batch, p.seqlen_q, p.heads_q, p.headdim_v,
                         p.out_stride};
  constexpr int kCols = T::kSwizzleCols;
  for (Status s : {make_tensor_map(q, kCols, T::kBlockM, &args.q),
                   make_tensor_map(k, kCols, kv_box_rows(p, T::kKLoadRows, T::kBlockN), &args.k),
                   make_tensor_map(v, kCols, kv_box_rows(p, T::kVLoadRows, T::kBlockN), &args.v),
                   make_tensor_map(o, sm90::kSwizzleCols16, sm90::kMmaM, &args.o)}) {
    if (!s.ok()) {
      return s;
    }
  }
  args.out = p.out;
  args.out_batch_stride = p.out_stride.batch;
  args.out_seq_stride = p.out_stride.seq;
  args.out_head_stride = p.out_stride.head;
  args.lse = p.softmax_lse;
  args.sinks = p.sinks;
  args.seqlen_q = p.seqlen_q;
  args.seqlen_k = p.seqlen_k;
  args.window_left = p.mask_window_left();
  args.window_right = p.mask_window_right();
  args.chunk = p.mask_chunk();
  args.softcap = p.softcap;
  args.heads_q = p.heads_q;
  args.heads_per_kv_head = p.heads_q / p.heads_k;
  args.num_m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  args.by_m_blocks = detail::FastDivisor::of(args.num_m_blocks);
  args.by_heads_q = detail::FastDivisor::of(args.heads_q);
  args.by_kv_group = detail::FastDivisor::of(args.heads_per_kv_head);
  args.softmax_scale = p.softmax_scale;
  args.q_descale = p.q_descale;
  args.k_descale = p.k_descale;
  args.v_descale = p.v_descale;
  if constexpr (T::kVarlen) {
    return launch_varlen<T, kCausal, kSmemBytes>(p, stream, args);
  }
  if constexpr (T::kKvCache) {
    static_assert(T::kBlockN % sm90::fwd::kPageBoxRows == 0, "key blocks of whole boxes");
    args.cache = {p.cache_seqlens,      p.cache_batch_idx, p.kv_batch,
                  p.seqlen_k,           p.page_table,      p.page_table_rows,
                  p.pages_per_batch,    p.page_size,
                  detail::FastDivisor::of(std::max(p.page_size, 1)),
                  sm90::fwd::paged_box_rows(p.page_size, T::kBlockN),
                  p.cache_leftpad};
  }

  const long long tiles = static_cast<long long>(args.num_m_blocks) * p.heads_q * p.batch;
  // (The local kernels' cursor counts 2 per unit, past the last by a wave.)
  constexpr long long kMaxTiles = T::kLocalUnits ? INT_MAX / 4 : INT_MAX;
  if (tiles > kMaxTiles) {
    return {StatusCode::kInvalidArgument,
            std::string(T::kFp8 ? kForwardFp8Call : kForwardCall) +
                ": batch * heads_q * ceil(seqlen_q / " + std::to_string(T::kBlockM) + ") = " +
                std::to_string(tiles) + " tiles exceeds " + std::to_string(kMaxTiles)};
  }
  args.num_tiles = static_cast<int>(tiles);
  if constexpr (T::kLocalUnits) {  // the scheduler's units (local_units.hpp), fewer than tiles
    const sm90::Mask<T::kBlockM, T::kBlockN, kCausal, true> mask{
        args.seqlen_q, args.seqlen_k, args.window_left, args.window_right, args.chunk};
    args.local_units = sm90::fwd::LocalUnits::of(mask, args.num_m_blocks);
    args.by_local_units = detail::FastDivisor::of(args.local_units.per_head());
    args.num_tiles = args.local_units.per_head() * p.heads_q * p.batch;
  }
  // Persistent, in two-CTA clusters where the kernel shares K and V and the
  // tiles pair up, and with the last wave split in pieces where that pays
  // (grid.hpp) and the stream has a workspace for them.
  constexpr int kTilesPerStep = sm90::fwd::TileScheduler::kTilesPerStep<T::kCausalPairs>;
  constexpr auto kernel = sm90::fwd::forward_kernel<T, kCausal>;
  const KernelSetup setup =
      setup_kernel<kernel, T::kClusterCtas>(T::kThreads, kSmemBytes, p.device);
  cudaError_t err = setup.err;
  const SplitSteps steps = split_steps(T::kTailSplit, kCausal,
                                       p.seqlen_q, p.seqlen_k, T::kBlockM, T::kBlockN);
  GridPlan grid = plan_grid(args.num_tiles, args.num_m_blocks, kTilesPerStep, p.num_sms,
                            T::kClusterKv, setup.max_clusters, steps.split, steps.blocks);
  if (grid.tail.tail_blocks > 0) {
    using Epilogue = sm90::fwd::Epilogue<T>;
    using Workspace = sm90::fwd::PartialWorkspace;
    static_assert(Epilogue::kPartialFlags <= Workspace::kMaxFlagsPerCta &&
                  T::kBlockM <= Workspace::max_block_m(T::kHeadDimV) &&
                  T::kConsumerThreads <= Workspace::kMaxConsumerThreads);
    const size_t flag_bytes = Workspace::flag_bytes(p.num_sms);
    const size_t lse_floats = static_cast<size_t>(grid.ctas) * Epilogue::kPartialLseFloats;
    const size_t o_floats = static_cast<size_t>(grid.ctas) * Epilogue::kPartialOFloats;
    const size_t bytes = flag_bytes + (lse_floats + o_floats) * sizeof(float);
    // The caller's (dispatch checked it holds Workspace::bound), else the stream's.
    uint8_t* ws = static_cast<uint8_t*>(
        p.workspace != nullptr ? p.workspace
                               : stream_workspace(p.device, stream, bytes, flag_bytes));
    if (ws != nullptr && grid.ctas <= static_cast<unsigned>(p.num_sms)) {
      args.partial_flags = reinterpret_cast<uint32_t*>(ws);
      args.partial_lse = reinterpret_cast<float*>(ws + flag_bytes);
      args.partial_o = args.partial_lse + lse_floats;
    } else {
      grid = plan_grid(tiles, args.num_m_blocks, kTilesPerStep, p.num_sms, T::kClusterKv,
                       setup.max_clusters);
    }
  }
  args.split = grid.tail;
  args.group_ctas = grid.clusters ? T::kClusterCtas : 1;
  if (err == cudaSuccess && grid.clusters) {
    const ClusterLaunch launch(grid.ctas, T::kThreads, kSmemBytes, stream, T::kClusterCtas);
    err = cudaLaunchKernelEx(&launch.config, kernel, args);
  } else if (err == cudaSuccess) {
    kernel<<<grid.ctas, T::kThreads, kSmemBytes, stream>>>(args);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string(T::kFp8 ? kForwardFp8Call : kForwardCall) +
                                        ": launch failed: " + cudaGetErrorName(err) + ": " +
                                        cudaGetErrorString(err)};
  }
  return {};
}

// The traits of one forward launch (traits.cuh).
template <DType kDType, int kHeadDim, int kHeadDimV, DType kOutDType>
struct ForwardKernels {
  template <bool kCausal, bool kShort, sm90::fwd::Sequences kSequences, bool kLocal>
  using Traits = sm90::fwd::Traits<kDType, kHeadDim, kHeadDimV, kCausal, kOutDType, kShort,
                                   kSequences, kLocal>;
};

// The kernel of one causality (kLocal: the masked kernels' local variants,
// traits.cuh): KV-cache launches their one variant; decode-shaped
// non-causal launches (decode.hpp) a variant with the tail split (the long
// one where it has it); else the short-sequence variant (traits.cuh) up to
// kShortMaxSeqlen, where the head dim has one.
template <DType kDType, int kHeadDim, int kHeadDimV, bool kCausal, DType kOutDType,
          sm90::fwd::Sequences kSequences = sm90::fwd::Sequences::kDense, bool kLocal = false>
Status launch_causality(const ForwardParams& p, cudaStream_t stream) {
  using sm90::fwd::Sequences;
  using Kernels = ForwardKernels<kDType, kHeadDim, kHeadDimV, kOutDType>;
  using Own = typename Kernels::template Traits<kCausal, false, kSequences, kLocal>;
  constexpr bool kVarlen = kSequences == Sequences::kVarlen;
  if constexpr (kSequences == Sequences::kKvCache) {
    return launch_variant<Own, kCausal>(p, stream);
  } else {
    if constexpr (!kCausal && !kVarlen) {
      using Long = typename Kernels::template Traits<false, false, Sequences::kDense, false>;
      if (wants_split_kv(p.seqlen_q, p.seqlen_k, Long::kBlockM, Long::kBlockN)) {
        // 16-bit: the kSplitKv kernel (its idle warpgroups drain, traits.cuh);
        // FP8 keeps the long kernel where that has the tail split.
        using Split = std::conditional_t<
            kDType == DType::kFloat8E4M3 && Long::kTailSplit, Long,
            typename Kernels::template Traits<false, false, Sequences::kSplitKv, false>>;
        return launch_variant<Split, false>(p, stream);
      }
    }
    constexpr int kShortMaxSeqlen =
        sm90::fwd::kShortMaxSeqlen<kDType == DType::kFloat8E4M3, kHeadDim, kCausal>;
    if constexpr (kShortMaxSeqlen > 0) {
      if ((kVarlen ? p.max_seqlen_q : p.seqlen_q) <= kShortMaxSeqlen) {
        using Short = typename Kernels::template Traits<kCausal, true, kSequences, kLocal>;
        return launch_variant<Short, kCausal>(p, stream);
      }
    }
    return launch_variant<Own, kCausal>(p, stream);
  }
}

template <DType kDType, int kHeadDim, int kHeadDimV, sm90::fwd::Sequences kSequences>
Status launch_sequences(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kV = kHeadDimV;
  if (!p.masked()) {
    return launch_causality<kDType, kHeadDim, kV, false, kDType, kSequences>(p, stream);
  }
  return p.local_kernels()
             ? launch_causality<kDType, kHeadDim, kV, true, kDType, kSequences, true>(p, stream)
             : launch_causality<kDType, kHeadDim, kV, true, kDType, kSequences>(p, stream);
}

// kHeadDimV: V's and O's head dim (head_dims.hpp: ForwardValueDims).
template <DType kDType, int kHeadDim, int kHeadDimV>
Status launch_forward_sm90(const ForwardParams& params, cudaStream_t stream) {
  using sm90::fwd::Sequences;
  constexpr int kV = kHeadDimV;
  if (params.varlen_batch > 0) {
    return launch_sequences<kDType, kHeadDim, kV, Sequences::kVarlen>(params, stream);
  }
  ForwardParams packed = params;  // GQA decoding as MHA over a view (decode.hpp)
  const ForwardParams& p = pack_gqa(&packed) ? packed : params;
  return p.cache_seqlens != nullptr
             ? launch_sequences<kDType, kHeadDim, kV, Sequences::kKvCache>(p, stream)
             : launch_sequences<kDType, kHeadDim, kV, Sequences::kDense>(p, stream);
}

// (FP8 has no local variants: validate_fp8.cpp refuses them; one head dim.)
template <DType kOutDType, int kHeadDim>
Status launch_forward_fp8_sm90(const ForwardParams& p, cudaStream_t stream) {
  constexpr DType kFp8 = DType::kFloat8E4M3;
  return p.causal ? launch_causality<kFp8, kHeadDim, kHeadDim, true, kOutDType>(p, stream)
                  : launch_causality<kFp8, kHeadDim, kHeadDim, false, kOutDType>(p, stream);
}

}  // namespace flash3::detail
