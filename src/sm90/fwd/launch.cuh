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
#include "grid.hpp"
#include "sm90/common/launch.hpp"
#include "sm90/common/tensor_map.hpp"

namespace flash3::detail {

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
    return {p.v, p.dtype, p.batch, p.seqlen_k, p.heads_k, p.headdim, p.v_stride};
  }
}

// One kernel variant: tensor maps, grid, launch.
template <class T, bool kCausal>
Status launch_variant(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kSmemBytes = sm90::fwd::shared_storage_bytes<T>();
  static_assert(kSmemBytes <= sm90::fwd::kMaxSmemPerBlock, "shared memory budget exceeded");

  sm90::fwd::KernelArgs args{};
  const TensorMapShape q{p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, p.headdim, p.q_stride};
  const TensorMapShape k{p.k, p.dtype, p.batch, p.seqlen_k, p.heads_k, p.headdim, p.k_stride};
  const TensorMapShape v = v_map_shape<T>(p);
  const TensorMapShape o{p.out, p.out_dtype, p.batch, p.seqlen_q, p.heads_q, p.headdim,
                         p.out_stride};
  constexpr int kCols = T::kSwizzleCols;
  for (Status s : {make_tensor_map(q, kCols, T::kBlockM, &args.q),
                   make_tensor_map(k, kCols, T::kKLoadRows, &args.k),
                   make_tensor_map(v, kCols, T::kVLoadRows, &args.v),
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
  args.seqlen_q = p.seqlen_q;
  args.seqlen_k = p.seqlen_k;
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

  const long long tiles = static_cast<long long>(args.num_m_blocks) * p.heads_q * p.batch;
  if (tiles > INT_MAX) {
    return {StatusCode::kInvalidArgument,
            std::string(T::kFp8 ? kForwardFp8Call : kForwardCall) +
                ": batch * heads_q * ceil(seqlen_q / " + std::to_string(T::kBlockM) + ") = " +
                std::to_string(tiles) + " tiles exceeds 2^31-1"};
  }
  args.num_tiles = static_cast<int>(tiles);
  // Persistent, in two-CTA clusters where the kernel shares K and V and the
  // tiles pair up, and with the last wave split in pieces where that pays
  // (grid.hpp) and the stream has a workspace for them.
  constexpr int kTilesPerStep = sm90::fwd::TileScheduler::kTilesPerStep<kCausal>;
  constexpr auto kernel = sm90::fwd::forward_kernel<T, kCausal>;
  const KernelSetup setup =
      setup_kernel<kernel, T::kClusterCtas>(T::kThreads, kSmemBytes, p.device);
  cudaError_t err = setup.err;
  const SplitSteps steps = split_steps(T::kTailSplit, kCausal, p.seqlen_q, p.seqlen_k, T::kBlockM,
                                       T::kBlockN);
  GridPlan grid = plan_grid(tiles, args.num_m_blocks, kTilesPerStep, p.num_sms, T::kClusterKv,
                            setup.max_clusters, steps.split, steps.blocks);
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

// The kernel of one causality: its short-sequence variant (traits.cuh) up
// to kShortMaxSeqlen, where the head dim has one.
template <DType kDType, int kHeadDim, bool kCausal, DType kOutDType>
Status launch_causality(const ForwardParams& p, cudaStream_t stream) {
  using sm90::fwd::Traits;
  constexpr int kShortMaxSeqlen =
      sm90::fwd::kShortMaxSeqlen<kDType == DType::kFloat8E4M3, kHeadDim, kCausal>;
  if constexpr (kShortMaxSeqlen > 0) {
    if (p.seqlen_q <= kShortMaxSeqlen) {
      return launch_variant<Traits<kDType, kHeadDim, kCausal, kOutDType, true>, kCausal>(p,
                                                                                      stream);
    }
  }
  return launch_variant<Traits<kDType, kHeadDim, kCausal, kOutDType>, kCausal>(p, stream);
}

template <DType kDType, int kHeadDim>
Status launch_forward_sm90(const ForwardParams& p, cudaStream_t stream) {
  return p.causal ? launch_causality<kDType, kHeadDim, true, kDType>(p, stream)
                  : launch_causality<kDType, kHeadDim, false, kDType>(p, stream);
}

template <DType kOutDType, int kHeadDim>
Status launch_forward_fp8_sm90(const ForwardParams& p, cudaStream_t stream) {
  constexpr DType kFp8 = DType::kFloat8E4M3;
  return p.causal ? launch_causality<kFp8, kHeadDim, true, kOutDType>(p, stream)
                  : launch_causality<kFp8, kHeadDim, false, kOutDType>(p, stream);
}

}  // namespace flash3::detail
