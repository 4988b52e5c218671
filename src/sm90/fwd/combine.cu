// combine: split-KV partial results merged (FlashAttention-3's
// flash_attn_combine). Per output row (b, s, h), with l_i the split lses:
//   lse = log(sum_i exp(l_i)),  out = sum_i exp(l_i - lse) * out_partial_i,
// a weight that is inf or NaN counting as 0 (flash3.hpp: combine).
// Memory-bound: num_splits * headdim floats read per row, headdim written.
//
// One warp per row, 8 rows per CTA, heads fastest (neighbouring rows are
// neighbouring memory in the usual layouts):
//   lse:  lane i takes splits i, i + 32, ...; the max and then the sum of
//         exp(l_i - max) by warp shuffles; lane i keeps the weight of split
//         i of each group of 32 splits;
//   out:  each lane owns column chunks (k * 32 + lane) * kVec of the row
//         (kVec = 4: float4; 1: the scalar path for unaligned data or a head
//         dim that is not a multiple of 4), kIters chunks covering headdim;
//         the splits of a group are taken kSplitsAtOnce at a time, their
//         weights broadcast by shuffles and their loads issued together, so
//         each lane has about kLoadsInFlight loads outstanding.
// The first step's splits are loaded with the lses, before their weights
// are known (one memory latency per row, not two); after it, splits of
// weight 0 (lse -inf, or far below the max) are not read: a warp branches on
// the broadcast weight, uniformly. A split of weight 0 never reaches out,
// whatever its values. Any number of splits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "sm90/launch.hpp"

namespace flash3::sm90::combine {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kRowsPerCta = 8;  // one warp each
constexpr int kThreads = kRowsPerCta * kWarpSize;
// Loads a lane keeps outstanding (over splits x column chunks): enough bytes
// in flight per SM to cover the memory latency at any head dim.
constexpr int kLoadsInFlight = 8;

struct CombineKernelArgs {
  const float* out_partial;
  const float* lse_partial;
  void* out;
  float* lse;  // or null
  detail::SplitStrides out_partial_stride, lse_partial_stride;
  detail::Strides3 out_stride, lse_stride;
  int num_splits;
  int seqlen;
  int heads;
  int headdim;
  int rows;
  bool vector_store;  // out's rows take kVec-element stores (aligned): else element stores
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, offset));
  }
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(kFullWarp, x, offset);
  }
  return x;
}

// kVec consecutive floats of a row (16-byte aligned for kVec 4).
template <int kVec>
struct Chunk {
  float v[kVec];
};

template <int kVec>
__device__ __forceinline__ Chunk<kVec> load_chunk(const float* p) {
  Chunk<kVec> c;
  if constexpr (kVec == 4) {
    const float4 x = __ldcs(reinterpret_cast<const float4*>(p));  // read once: streaming
    c.v[0] = x.x;
    c.v[1] = x.y;
    c.v[2] = x.z;
    c.v[3] = x.w;
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      c.v[e] = __ldcs(p + e);
    }
  }
  return c;
}

template <class Out>
__device__ __forceinline__ Out to_out(float x);
template <>
__device__ __forceinline__ float to_out<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half to_out<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_out<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Stores kVec values at p: one vector store when `vector` (p aligned to
// kVec elements), else one store per element.
template <class Out, int kVec>
__device__ __forceinline__ void store_chunk(Out* p, const float (&x)[kVec], bool vector) {
  Out y[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    y[e] = to_out<Out>(x[e]);
  }
  if constexpr (kVec == 4 && sizeof(Out) == 4) {
    if (vector) {
      *reinterpret_cast<float4*>(p) = make_float4(y[0], y[1], y[2], y[3]);
      return;
    }
  } else if constexpr (kVec == 4 && sizeof(Out) == 2) {
    if (vector) {
      uint2 bits;
      static_assert(sizeof(bits) == sizeof(y));
      memcpy(&bits, y, sizeof(bits));
      *reinterpret_cast<uint2*>(p) = bits;
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    p[e] = y[e];
  }
}

// The statistics of a row's split lses l_i.
struct RowLse {
  float lse;      // log(sum_i exp(l_i))
  float max;      // max_i l_i
  float inv_sum;  // 1 / sum_i exp(l_i - max); 0 when lse is not finite (no weights)
};

// From every lane's splits: lanes hold l_i of splits lane, lane + 32, ...
// (the first in `first`, read again for the rest). lse is NaN if any l_i
// is, +-inf if the max is (all -inf, or some +inf), else
// max + log(sum exp(l_i - max)).
__device__ __forceinline__ RowLse row_lse(const float* lse_row, int64_t split_stride,
                                          int num_splits, int lane, float first) {
  float max = first;
  bool nan = first != first;
  for (int64_t i = lane + kWarpSize; i < num_splits; i += kWarpSize) {
    const float l = __ldg(lse_row + i * split_stride);
    max = fmaxf(max, l);  // fmaxf drops NaNs: counted apart
    nan |= l != l;
  }
  max = warp_max(max);
  if (__any_sync(kFullWarp, nan)) {
    return {__int_as_float(0x7FC00000), max, 0.0f};  // a quiet NaN
  }
  if (isinf(max)) {
    return {max, max, 0.0f};
  }
  float sum = expf(first - max);  // 0 for -inf (and for lanes past the splits)
  for (int64_t i = lane + kWarpSize; i < num_splits; i += kWarpSize) {
    sum += expf(__ldg(lse_row + i * split_stride) - max);
  }
  sum = warp_sum(sum);  // at least 1: exp(0) of the max
  return {max + logf(sum), max, 1.0f / sum};
}

template <class Out, int kVec, int kIters>
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ CombineKernelArgs a) {
  constexpr int kSplitsAtOnce = kIters >= kLoadsInFlight ? 1 : kLoadsInFlight / kIters;
  static_assert(kWarpSize % kSplitsAtOnce == 0, "a group of 32 splits is taken whole steps");
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerCta + threadIdx.x / kWarpSize;
  if (row >= a.rows) {
    return;  // the whole warp: no shuffle is left waiting
  }
  const int head = row % a.heads;
  const int seq = row / a.heads % a.seqlen;
  const int batch = row / a.heads / a.seqlen;
  const float* lse_row = a.lse_partial + a.lse_partial_stride.row.offset(batch, seq, head);
  const float* partial_row = a.out_partial + a.out_partial_stride.row.offset(batch, seq, head);
  const int64_t lse_split = a.lse_partial_stride.split;
  const int64_t partial_split = a.out_partial_stride.split;

  // The chunks of splits first_split + u (u < kSplitsAtOnce) for which
  // wanted(u) holds; zeros for the others.
  Chunk<kVec> x[kSplitsAtOnce][kIters];
  const auto load_step = [&](int64_t first_split, auto wanted) {
#pragma unroll
    for (int u = 0; u < kSplitsAtOnce; ++u) {
      const float* split_row = partial_row + (first_split + u) * partial_split;
#pragma unroll
      for (int k = 0; k < kIters; ++k) {
        const int column = (k * kWarpSize + lane) * kVec;
        if (wanted(u) && column < a.headdim) {
          x[u][k] = load_chunk<kVec>(split_row + column);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            x[u][k].v[e] = 0.0f;
          }
        }
      }
    }
  };
  // The first step's splits are loaded before their weights are known, so
  // that they and the lses are in flight together: a row of a few splits
  // costs one memory latency, not two (2 splits of head dim 128 on an H100:
  // 66% of copy bandwidth, where many splits reach 99%).
  load_step(0, [&](int u) { return u < a.num_splits; });

  // The first 32 splits' lses stay in registers (most calls have no more).
  const float first = lane < a.num_splits ? __ldg(lse_row + lane * lse_split) : -INFINITY;
  const RowLse stats = row_lse(lse_row, lse_split, a.num_splits, lane, first);

  float acc[kIters][kVec];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      acc[k][e] = 0.0f;
    }
  }
  // An inf or NaN lse makes every weight exp(l_i - lse) inf - inf, NaN or
  // 0: all count as 0, and out is zero.
  if (isfinite(stats.lse)) {
    for (int64_t group = 0; group < a.num_splits; group += kWarpSize) {
      // This lane's split of the group: its weight exp(l_i - lse), taken as
      // exp(l_i - max) / sum: l_i - max is exact where lse would be rounded
      // (an lse of 1000 is a float64 lse +- 3e-5, every weight off by 3e-5).
      // 0 for l_i = -inf and past the last split.
      const int64_t mine = group + lane;
      float weight = 0.0f;
      if (mine < a.num_splits) {
        const float l = group == 0 ? first : __ldg(lse_row + mine * lse_split);
        weight = expf(l - stats.max) * stats.inv_sum;
      }
      const int64_t left = a.num_splits - group;
      const int in_group = left < kWarpSize ? static_cast<int>(left) : kWarpSize;
      for (int j = 0; j < in_group; j += kSplitsAtOnce) {
        // Lanes j + u < 32 always (in_group <= 32, j a multiple of
        // kSplitsAtOnce, which divides 32); past the last split they hold 0.
        float w[kSplitsAtOnce];
#pragma unroll
        for (int u = 0; u < kSplitsAtOnce; ++u) {
          w[u] = __shfl_sync(kFullWarp, weight, j + u);
        }
        if (group != 0 || j != 0) {  // else loaded above
          load_step(group + j, [&](int u) { return w[u] != 0.0f; });
        }
#pragma unroll
        for (int u = 0; u < kSplitsAtOnce; ++u) {
          // A split of weight 0 takes no part: the first step loaded it
          // anyway, and its values (NaN, say) must not reach out.
          if (w[u] != 0.0f) {
#pragma unroll
            for (int k = 0; k < kIters; ++k) {
#pragma unroll
              for (int e = 0; e < kVec; ++e) {
                acc[k][e] = fmaf(w[u], x[u][k].v[e], acc[k][e]);
              }
            }
          }
        }
      }
    }
  }

  Out* out_row = static_cast<Out*>(a.out) + a.out_stride.offset(batch, seq, head);
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int column = (k * kWarpSize + lane) * kVec;
    if (column < a.headdim) {
      store_chunk<Out, kVec>(out_row + column, acc[k], a.vector_store);
    }
  }
  if (a.lse != nullptr && lane == 0) {
    a.lse[a.lse_stride.offset(batch, seq, head)] = stats.lse;
  }
}

// Whether every address the kernel forms from `base` and these element
// strides is a multiple of `bytes`.
bool aligned(const void* base, int64_t element_bytes, int bytes,
             std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(base) % bytes != 0) {
    return false;
  }
  for (const int64_t stride : strides) {
    if ((stride * element_bytes) % bytes != 0) {
      return false;
    }
  }
  return true;
}

template <class Out, int kVec, int kIters>
void launch(const CombineKernelArgs& args, cudaStream_t stream) {
  const unsigned ctas = static_cast<unsigned>((int64_t{args.rows} + kRowsPerCta - 1) / kRowsPerCta);
  combine_kernel<Out, kVec, kIters><<<ctas, kThreads, 0, stream>>>(args);
}

// The chunk count for this head dim: the fewest of the instantiated ones
// that cover it (vector: 128 columns a chunk; scalar: 32).
template <class Out>
bool launch_for_out(const CombineKernelArgs& args, bool vector_load, cudaStream_t stream) {
  const int d = args.headdim;
  if (vector_load) {
    if (d <= 128) {
      launch<Out, 4, 1>(args, stream);
    } else if (d <= 256) {
      launch<Out, 4, 2>(args, stream);
    } else if (d <= 512) {
      launch<Out, 4, 4>(args, stream);
    } else if (d <= 1024) {
      launch<Out, 4, 8>(args, stream);
    } else {
      return false;
    }
    return true;
  }
  if (d <= 64) {
    launch<Out, 1, 2>(args, stream);
  } else if (d <= 256) {
    launch<Out, 1, 8>(args, stream);
  } else if (d <= 1024) {
    launch<Out, 1, 32>(args, stream);
  } else {
    return false;
  }
  return true;
}

static_assert(kMaxCombineHeadDim <= 1024, "launch_for_out covers head dims up to 1024");

}  // namespace flash3::sm90::combine

namespace flash3::detail {

Status launch_combine_sm90(const CombineParams& p, cudaStream_t stream) {
  using namespace sm90::combine;
  CombineKernelArgs args{};
  args.out_partial = p.out_partial;
  args.lse_partial = p.lse_partial;
  args.out = p.out;
  args.lse = p.lse;
  args.out_partial_stride = p.out_partial_stride;
  args.lse_partial_stride = p.lse_partial_stride;
  args.out_stride = p.out_stride;
  args.lse_stride = p.lse_stride;
  args.num_splits = p.num_splits;
  args.seqlen = p.seqlen;
  args.heads = p.heads;
  args.headdim = p.headdim;
  args.rows = p.rows;
  constexpr int kVectorBytes = 16;
  const int64_t out_bytes = p.out_dtype == DType::kFloat32 ? 4 : 2;
  const SplitStrides& in = p.out_partial_stride;
  const bool vector_load =
      p.headdim % 4 == 0 &&
      aligned(p.out_partial, 4, kVectorBytes, {in.split, in.row.batch, in.row.seq, in.row.head});
  // Four outputs per store: 16 bytes of float32, 8 of float16/bfloat16.
  const Strides3& o = p.out_stride;
  args.vector_store = aligned(p.out, out_bytes, static_cast<int>(4 * out_bytes),
                              {o.batch, o.seq, o.head});
  bool launched = false;
  switch (p.out_dtype) {
    case DType::kFloat32:
      launched = launch_for_out<float>(args, vector_load, stream);
      break;
    case DType::kFloat16:
      launched = launch_for_out<__half>(args, vector_load, stream);
      break;
    case DType::kBFloat16:
      launched = launch_for_out<__nv_bfloat16>(args, vector_load, stream);
      break;
    default:
      break;
  }
  if (!launched) {
    return {StatusCode::kInternal,
            std::string(kCombineCall) + ": no kernel for out dtype " +
                std::to_string(static_cast<int>(p.out_dtype)) + ", headdim " +
                std::to_string(p.headdim)};
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string(kCombineCall) + ": launch failed: " +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
  }
  return {};
}

}  // namespace flash3::detail
