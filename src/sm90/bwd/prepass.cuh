// The backward's pre-pass, per (query block, head, batch or sequence): each
// row's D = rowsum(dO * O) in fp32 and its log-sum-exp times log2(e) into
// the workspace's padded row arrays, and the block's dQ state zeroed (its
// fp32 dQ sums too for the kernels that add dQ from registers).
//
// D from the 16-bit out carries out's rounding, and a row that sees few keys
// has P near 1 at some key, where dS = P (dP - D) subtracts D from a dP of
// about its size: FlashAttention-3's suite missed its bounds there (seqlen_k
// 3; design.md, 'Accuracy with few keys'). Such a row's D is taken exactly
// instead, sum_j P_j dP_j = dO . (out before rounding), from its keys'
// scores as the main kernel computes them (kExactDKeys, workspace.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "sm90/common/fragment.cuh"
#include "sm90/common/mask.cuh"
#include "sm90/common/math.cuh"
#include "sm90/problem.hpp"
#include "traits.cuh"
#include "workspace.hpp"

namespace flash3::sm90::bwd {

struct PrepassArgs {
  const void* out;
  const void* dout;
  flash3::detail::Strides3 out_stride, dout_stride;  // elements
  // For the rows that see few keys: q, k, v and the mask and scores as the
  // main kernel's (KernelArgs).
  const void* q;
  const void* k;
  const void* v;
  flash3::detail::Strides3 q_stride, k_stride, v_stride;
  int seqlen_k;
  int heads_per_kv_head;
  float softmax_scale, scale_log2, softcap;
  int window_left, window_right, chunk;  // mask.cuh's (causal: kUnbounded, 0)
  const float* lse;  // (batch, heads_q, seqlen_q), varlen (heads_q, total_q)
  float* lse_log2;   // per query row of the workspace (workspace.hpp)
  float* dpsum;
  int* dq_state;     // zeroed per query block (workspace.hpp)
  float* dq_accum;   // zeroed too where the main kernel's consumers add dQ (kDqAtomic), or null
  VarlenSequences varlen;  // batch 0: dense
  const float* sinks;      // with sink_partials: heads_q
  float* sink_partials;    // or null: per query block of the per-row regions (workspace.hpp)
  int seqlen_q;
  int heads_q;
  int padded_seqlen_q;
};

inline constexpr int kPrepassThreads = 256;
// At most 128 registers a thread (two blocks an SM): room for each thread's
// loads in flight (kRowsInFlight rows of out and dO) without spills.
inline constexpr int kPrepassBlocksPerSm = 2;

// acc + the dot product of two 16-byte pieces of 16-bit elements.
template <class Element>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 u = unpack2<Element>(x[i]), v = unpack2<Element>(y[i]);
    acc = fmaf(u.x, v.x, fmaf(u.y, v.y, acc));
  }
  return acc;
}

// 16-byte piece `part` of a row of a (batch, seq, head, dim) tensor.
template <class Element>
__device__ __forceinline__ uint4 load_piece(const void* base,
                                            const flash3::detail::Strides3& stride, int batch,
                                            int64_t row, int head, int part) {
  return *reinterpret_cast<const uint4*>(static_cast<const Element*>(base) +
                                         stride.offset(batch, row, head) + part * 8);
}

// A row's exact D over its `count` visible keys from `first` (0 for the rows
// that take D from out): every lane of the warp runs the same steps (the
// most keys among its rows) for the butterflies; a lane holds its row's
// 16-byte pieces `part` of q and dO (zeros past their head dims) and reads
// those of each key's k and v, and returns its part of sum_j P_j dP_j (the
// caller's butterfly adds them up).
template <class T, int kThreadsPerRow>
__device__ __forceinline__ float exact_dpsum_part(const PrepassArgs& args, const QueryRows& q,
                                                  int row, int head, int k_row0, int first,
                                                  int count, float lse_log2, const uint4& dout,
                                                  int part) {
  using Element = typename T::Element;
  constexpr int kQPieces = T::kHeadDim / 8, kVPieces = T::kHeadDimV / 8;
  const int steps = __reduce_max_sync(0xffffffffu, count);
  if (steps == 0) {
    return 0.0f;
  }
  uint4 qx = {};
  if (count > 0 && part < kQPieces) {
    qx = load_piece<Element>(args.q, args.q_stride, q.batch, q.row0 + row, head, part);
  }
  const int head_kv = head / args.heads_per_kv_head;
  const bool capped = args.softcap > 0.0f;
  const float to_tanh = capped ? args.softmax_scale / args.softcap : 0.0f;
  const float scale_log2 = capped ? args.softcap * kLog2e : args.scale_log2;
  // The keys in rounds of kKeysPerRound, each round's k and v pieces loaded
  // before any is used (one memory latency a round, not one a key).
  constexpr int kKeysPerRound = 4;
  float dpsum = 0.0f;
  for (int j0 = 0; j0 < steps; j0 += kKeysPerRound) {
    uint4 kx[kKeysPerRound], vx[kKeysPerRound];
#pragma unroll
    for (int u = 0; u < kKeysPerRound; ++u) {
      kx[u] = {};
      vx[u] = {};
      const int64_t key = k_row0 + first + j0 + u;
      if (j0 + u < count && part < kQPieces) {
        kx[u] = load_piece<Element>(args.k, args.k_stride, q.batch, key, head_kv, part);
      }
      if (j0 + u < count && part < kVPieces) {
        vx[u] = load_piece<Element>(args.v, args.v_stride, q.batch, key, head_kv, part);
      }
    }
#pragma unroll
    for (int u = 0; u < kKeysPerRound; ++u) {
      float s = dot8<Element>(qx, kx[u], 0.0f);
      const float dp = dot8<Element>(dout, vx[u], 0.0f);
#pragma unroll
      for (int lanes = kThreadsPerRow / 2; lanes > 0; lanes /= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, lanes);
      }
      if (j0 + u < count) {
        if (capped) {
          s = fast_tanh(s * to_tanh);
        }
        dpsum = fmaf(fast_exp2(fmaf(s, scale_log2, -lse_log2)), dp, dpsum);
      }
    }
  }
  return dpsum;
}

// Grid (heads_q, batch or sequences, z): block z takes query blocks z,
// z + gridDim.z, ... of its sequence (dense: z alone). The query block is
// the slowest index so that the blocks of every sequence's first rows, which
// see few keys in causal and local masks (an exact D, kExactDKeys), start
// first (H100, 16k tokens, causal 1k: head dim 256's pass 116 -> 102 us,
// 64's and 128's unchanged).
template <class T>
__global__ void __launch_bounds__(kPrepassThreads, kPrepassBlocksPerSm)
    prepass_kernel(const PrepassArgs args) {
  using Element = typename T::Element;
  // A row's lanes read 16 bytes each of out and dO (head dim kHeadDimV) and,
  // for an exact D, of q and k (kHeadDim): a power of two of lanes (their
  // sums are butterflies over them); head dim 96's 12 pieces take 16 lanes,
  // 4 idle.
  constexpr int kPieces = T::kHeadDimV / 8;
  constexpr int kAllPieces = (T::kHeadDim > T::kHeadDimV ? T::kHeadDim : T::kHeadDimV) / 8;
  constexpr int kThreadsPerRow = kAllPieces <= 8 ? 8 : kAllPieces <= 16 ? 16 : 32;
  static_assert(kPieces * 8 == T::kHeadDimV && T::kHeadDim % 8 == 0 && kAllPieces <= 32,
                "16-byte pieces of a row");
  constexpr int kRowsPerPass = kPrepassThreads / kThreadsPerRow;
  const int head = static_cast<int>(blockIdx.x);
  const QueryRows q = query_rows(args.varlen, static_cast<int>(blockIdx.y), head, args.heads_q,
                                 args.seqlen_q, args.padded_seqlen_q, T::kBlockM);
  const SeqRange keys = args.varlen.batch == 0
                            ? SeqRange{0, args.seqlen_k}
                            : seq_range(args.varlen.cu_seqlens_k, args.varlen.seqused_k,
                                        static_cast<int>(blockIdx.y), args.varlen.total_k);
  const Mask<T::kBlockM, T::kBlockN, true, true> mask{q.length, keys.length, args.window_left,
                                                      args.window_right, args.chunk};
  const int part = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int m_blocks = (q.length + T::kBlockM - 1) / T::kBlockM;
  // The sinks' gradient: each row's -exp(sink - lse) D, summed per block in order.
  __shared__ float sink_share[T::kBlockM];
  const float sink = args.sink_partials != nullptr ? args.sinks[head] : 0.0f;
  // A thread's rows of a block: r0, r0 + kRowsPerPass, ..., kRowsInFlight
  // at a time with all their loads (log-sum-exp, out, dO) issued before any
  // sum, so that a block waits for a memory latency per kRowsInFlight rows
  // rather than per row (and once for two: out's load waited for the
  // log-sum-exp's test). The few rows of an exact D follow, dO read again
  // (from the cache), so that no row's out and dO stay live beside their
  // keys' loads.
  constexpr int kRowIters = T::kBlockM / kRowsPerPass;
  constexpr int kRowsInFlight = kRowIters < 4 ? kRowIters : 4;
  static_assert(T::kBlockM % kRowsPerPass == 0 && kRowIters % kRowsInFlight == 0,
                "whole passes over a block");
  const int r0 = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  for (int m_block = static_cast<int>(blockIdx.z); m_block < m_blocks;
       m_block += static_cast<int>(gridDim.z)) {
#pragma unroll 1
    for (int g = 0; g < kRowIters; g += kRowsInFlight) {
      float lse[kRowsInFlight], sum[kRowsInFlight];
      {
        uint4 o[kRowsInFlight], d[kRowsInFlight];
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          const int row = m_block * T::kBlockM + r0 + (g + i) * kRowsPerPass;
          lse[i] = row < q.length ? args.lse[q.lse_row0 + row] : -INFINITY;
          o[i] = {};
          d[i] = {};
          if (row < q.length && part < kPieces) {
            o[i] = load_piece<Element>(args.out, args.out_stride, q.batch, q.row0 + row, head,
                                       part);
            d[i] = load_piece<Element>(args.dout, args.dout_stride, q.batch, q.row0 + row, head,
                                       part);
          }
        }
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          sum[i] = dot8<Element>(o[i], d[i], 0.0f);
        }
      }
#pragma unroll
      for (int i = 0; i < kRowsInFlight; ++i) {
        const int r = r0 + (g + i) * kRowsPerPass;
        const int row = m_block * T::kBlockM + r;
        // P = 0: padding, and rows that see no key (+inf)
        const float lse_log2 = lse[i] == -INFINITY ? INFINITY : lse[i] * kLog2e;
        int first = 0, count = 0;  // the visible keys, where few enough for an exact D
        if (row < q.length && lse[i] != -INFINITY) {
          first = max(mask.keys_begin(row), 0);
          count = min(mask.keys_end(row), keys.length) - first;
          count = count <= kExactDKeys ? max(count, 0) : 0;
        }
        if (__any_sync(0xffffffffu, count > 0)) {
          uint4 d = {};
          if (row < q.length && part < kPieces) {
            d = load_piece<Element>(args.dout, args.dout_stride, q.batch, q.row0 + row, head,
                                    part);
          }
          const float exact = exact_dpsum_part<T, kThreadsPerRow>(
              args, q, row, head, keys.begin, first, count, lse_log2, d, part);
          sum[i] = count > 0 ? exact : sum[i];
        }
#pragma unroll
        for (int lanes = kThreadsPerRow / 2; lanes > 0; lanes /= 2) {
          sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], lanes);
        }
        if (part == 0) {
          args.lse_log2[q.ws_row0 + row] = lse_log2;
          args.dpsum[q.ws_row0 + row] = sum[i];
          if (args.sink_partials != nullptr) {
            sink_share[r] = row < q.length ? -expf(sink - lse[i]) * sum[i] : 0.0f;
          }
        }
      }
    }
    if (args.sink_partials != nullptr) {
      __syncthreads();
      if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int r = 0; r < T::kBlockM; ++r) {
          total += sink_share[r];
        }
        args.sink_partials[q.ws_row0 / T::kBlockM + m_block] = total;
      }
      __syncthreads();  // sink_share is free for the next block
    }
    if (threadIdx.x == 0) {
      args.dq_state[q.ws_row0 / T::kBlockM + m_block] = 0;
    }
    if (args.dq_accum != nullptr) {
      float4* dq = reinterpret_cast<float4*>(args.dq_accum +
                                             (q.ws_row0 + m_block * T::kBlockM) * T::kHeadDim);
      for (int i = static_cast<int>(threadIdx.x); i < T::kDqTileFloats / 4;
           i += kPrepassThreads) {
        dq[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  }
}

// dsinks[h] from the pre-pass's partial sums: per head (a block), its
// batches' query blocks, in a fixed order (the same bits every run).
struct SinksReduceArgs {
  const float* sink_partials;  // (batch, heads_q, num_m_blocks)
  float* dsinks;               // heads_q
  int batch;
  int heads_q;
  int num_m_blocks;
};

inline constexpr int kSinksReduceThreads = 256;

// (A template of the traits, as the other passes: one kernel per
// instantiation file rather than one symbol defined in each.)
template <class T>
__global__ void __launch_bounds__(kSinksReduceThreads)
    sinks_reduce_kernel(const SinksReduceArgs args) {
  __shared__ float partial[kSinksReduceThreads];
  const int head = static_cast<int>(blockIdx.x);
  const int64_t count = static_cast<int64_t>(args.batch) * args.num_m_blocks;
  float total = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kSinksReduceThreads) {
    const int64_t b = i / args.num_m_blocks, m = i % args.num_m_blocks;
    total += args.sink_partials[(b * args.heads_q + head) * args.num_m_blocks + m];
  }
  partial[threadIdx.x] = total;
  __syncthreads();
  for (int half = kSinksReduceThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      partial[threadIdx.x] += partial[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    args.dsinks[head] = partial[0];
  }
}

}  // namespace flash3::sm90::bwd
