// What the backward kernels receive, and the main kernel's shared memory.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/common/sync.cuh"
#include "sm90/common/varlen.hpp"
#include "sm90/problem.hpp"
#include "sm90/common/wgmma.cuh"
#include "workspace.hpp"

namespace flash3::sm90::bwd {

// The main kernel's parameters (a __grid_constant__: TMA reads the maps
// from parameter space). Grid: (key block, query head, batch); varlen:
// (key block among all the sequences', query head) over tensors of batch 1
// (kernel.cuh: block_of).
struct KernelArgs {
  CUtensorMap q;     // box (64 cols, kBlockM rows)
  CUtensorMap dout;  // box (64 cols, kBlockM rows)
  CUtensorMap k;     // box (64 cols, kBlockN rows)
  CUtensorMap v;     // box (64 cols, kBlockN rows)
  // dK and dV for the TMA store (dkv_tma), box (64 cols, kBlockN rows).
  CUtensorMap dk_map;
  CUtensorMap dv_map;
  // dK, dV straight from registers (heads_q == heads_k), strided in elements;
  // or with GQA, fp32 sums into dk_accum / dv_accum (workspace.hpp).
  void* dk;
  void* dv;
  flash3::detail::Strides3 dk_stride, dv_stride;
  float* dk_accum;
  float* dv_accum;
  // Workspace (workspace.hpp): per (batch, head_q) padded rows.
  float* dq_accum;
  const float* lse_log2;
  const float* dpsum;
  int* dq_state;       // per (batch, head_q, query block): its dQ sums' writers
                       // (the staged kernels; mainloop.cuh, write_dq_staged)
  int* dkv_semaphore;  // deterministic GQA: per (batch, head_k, key block)
  VarlenSequences varlen;  // block_prefix: the key blocks' (workspace.hpp: key_prefix)
  int seqlen_q;  // varlen: the totals
  int seqlen_k;
  int heads_q;
  int heads_per_kv_head;
  int num_m_blocks;  // per (batch, head); varlen: unused (per sequence)
  int num_n_blocks;  // per (batch, head); varlen: of all the sequences, at most
  int padded_seqlen_q;
  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
  bool deterministic;
  bool dkv_tma;  // dK and dV leave through the K and V tiles (kernel.cuh: store_dkv_tma)
  // The masked kernels' window (mask.cuh: causal (kUnbounded, 0), or a
  // sliding window); last, so that the fields above keep their offsets.
  int window_left;
  int window_right;
  int chunk;  // attention_chunk (mask.cuh), 0: none
  float softcap;  // the local kernels' softcap (mainloop.cuh: probabilities), 0: none
};

// What one CTA works on (kernel.cuh: block_of): a key block of one query
// head, and its sequence's rows (dense: its batch's).
struct KeyBlock {
  int n_block;  // in the sequence
  int head, head_kv;
  QueryRows q;  // the sequence's queries; q.batch is the tensors' batch for k and v too
  int k_row0;   // the sequence's first key row in k and v (dense: 0)
  int seqlen_k;
};

// T::kDimSplit: P^T handed from warpgroup 0 to the other (mainloop.cuh:
// compute_split), two steps deep; nothing otherwise.
template <class T, bool = T::kDimSplit>
struct PTiles {};
template <class T>
struct PTiles<T, true> {
  alignas(kSwizzleAtomBytes) typename T::Element tile[2][T::kBlockN * T::kBlockM];
};

// The dQ tile staged for the dQ writer, in the workspace's thread order;
// nothing where the consumers add dQ from registers (T::kDqAtomic).
template <class T, bool = T::kDqAtomic>
struct DqStaging {
  alignas(128) float dq[T::kDqTileFloats];
};
template <class T>
struct DqStaging<T, true> {};

template <class T>
struct SharedStorage {
  using Element = typename T::Element;
  alignas(kSwizzleAtomBytes) Element k[T::kBlockN * T::kHeadDimPadded];
  alignas(kSwizzleAtomBytes) Element v[T::kBlockN * T::kHeadDimVPadded];
  alignas(kSwizzleAtomBytes) Element q[T::kStages][T::kBlockM * T::kHeadDimPadded];
  alignas(kSwizzleAtomBytes) Element dout[T::kStages][T::kBlockM * T::kHeadDimVPadded];
  // dS^T (rows: the CTA's keys; columns: the step's queries), two steps deep
  // so that a warpgroup writes step i's while the other may still read step
  // i - 1's in its dQ GEMM.
  alignas(kSwizzleAtomBytes) Element ds[2][T::kBlockN * T::kBlockM];
  [[no_unique_address]] DqStaging<T> dq_staging;
  PTiles<T> p;
  alignas(16) float lse_log2[T::kStages][T::kBlockM];
  alignas(16) float dpsum[T::kStages][T::kBlockM];
  Mbarrier k_full;  // K landed (loaded first, then the first Q, then V and the first dO)
  Mbarrier v_full;
  Mbarrier q_full[T::kStages];  // Q and its rows' log-sum-exps landed
  Mbarrier q_empty[T::kStages];
  Mbarrier do_full[T::kStages];  // dO and its rows' sums landed
  Mbarrier do_empty[T::kStages];
};

inline constexpr int kSmemAlignSlack = kSwizzleAtomBytes;
inline constexpr int kMaxSmemPerBlock = 227 * 1024;

template <class T>
constexpr int shared_storage_bytes() {
  return static_cast<int>(sizeof(SharedStorage<T>)) + kSmemAlignSlack;
}

}  // namespace flash3::sm90::bwd
