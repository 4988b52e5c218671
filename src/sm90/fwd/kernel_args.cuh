// What the forward kernel receives, and its shared-memory layout.
#pragma once

#include <cuda.h>

#include "sm90/problem.hpp"
#include "kv_cache.hpp"
#include "local_units.hpp"
#include "sm90/common/varlen.hpp"
#include "tail_split.hpp"
#include "sm90/common/sync.cuh"
#include "sm90/common/wgmma.cuh"

namespace flash3::sm90::fwd {

// How O leaves the kernel (Traits::kOStore, epilogue.cuh).
enum class OStore { kDirect, kInQTile, kSeparateTile, kInVStages };

// Passed by value as a __grid_constant__ parameter: TMA reads the tensor maps
// from parameter space.
struct KernelArgs {
  CUtensorMap q;  // box (64 cols, kBlockM rows)
  CUtensorMap k;  // box (64 cols, kBlockN rows)
  CUtensorMap v;  // box (64 cols, kBlockN rows); fp8: Fp8V, box (128 keys, kHeadDim rows)
  CUtensorMap o;  // box (64 cols, 64 rows): one consumer warpgroup's rows
  void* out;      // for the direct O store: (batch, seqlen_q, heads_q, headdim), strided
  int64_t out_batch_stride, out_seq_stride, out_head_stride;  // elements
  float* lse;     // (batch, heads_q, seqlen_q) or null
  const float* sinks;  // heads_q, or null (ForwardOptions::sinks; Epilogue::add_sinks)
  int seqlen_q;
  int seqlen_k;
  int heads_q;
  int heads_per_kv_head;  // heads_q / heads_k (GQA group size)
  int num_m_blocks;
  int num_tiles;  // num_m_blocks * heads_q * batch
  // Division by num_m_blocks, heads_q and heads_per_kv_head, per tile.
  flash3::detail::FastDivisor by_m_blocks, by_heads_q, by_kv_group;
  // The tail split (tail_split.hpp; split.tail_blocks 0: none), CTAs per
  // group (2 in K/V clusters) and the workspace (its layout: Epilogue's
  // kPartial* sizes); a flag is 1 from its partial's write to its fold.
  TailSplit split;
  int group_ctas;
  float* partial_o;
  float* partial_lse;
  uint32_t* partial_flags;
  float softmax_scale;
  // FP8 only: one scale per block of rows of one (batch, head), at
  // data[(batch * heads + head) * blocks_per_head + row / block_rows].
  flash3::detail::DescaleParams q_descale, k_descale, v_descale;
  // Varlen (Traits::kVarlen; varlen.hpp): q, k, v and out packed as
  // (1, total, heads, headdim), seqlen_q / seqlen_k the longest sequences',
  // lse (heads_q, total_q); the pre-pass's prefix sums of query blocks.
  VarlenSequences varlen;
  // KV cache (Traits::kKvCache; kv_cache.hpp): each batch's keys.
  KvCacheSequences cache;
  // The masked kernels' window (mask.cuh: causal (kUnbounded, 0), or a
  // sliding window); unused by the others. (Last, so that the fields above
  // keep their parameter offsets, and the other kernels their code.)
  int window_left;
  int window_right;
  int chunk;  // attention_chunk (mask.cuh), 0: none
  float softcap;  // the local kernels' softcap (Mainloop::compute), 0: none
  // The dense and KV-cache local kernels' work units (local_units.hpp;
  // num_tiles counts them) and division by their count per head.
  LocalUnits local_units;
  flash3::detail::FastDivisor by_local_units;
};

// Where O is staged for the TMA store (Traits::kOStore): the Q tile, or a
// tile of its own. (kInVStages: a warpgroup's rows in a V stage, Epilogue.)
template <class T, bool kSeparate = T::kOStore == OStore::kSeparateTile>
struct OStaging {
  __device__ uint8_t* ptr(typename T::Element* q) { return reinterpret_cast<uint8_t*>(q); }
};
template <class T>
struct OStaging<T, true> {
  alignas(kSwizzleAtomBytes) typename T::OutElement o[T::kBlockM * T::kOCols];
  __device__ uint8_t* ptr(typename T::Element*) { return reinterpret_cast<uint8_t*>(o); }
};

template <class T>
struct SharedStorage {
  using Element = typename T::Element;
  alignas(kSwizzleAtomBytes) Element q[T::kBlockM * T::kHeadDimPadded];
  alignas(kSwizzleAtomBytes) Element k[T::kStages][T::kBlockN * T::kHeadDimPadded];
  alignas(kSwizzleAtomBytes) Element v[T::kStages][T::kVTileRows * T::kVTileCols];
  OStaging<T> o_staging;
  __device__ uint8_t* o() { return o_staging.ptr(q); }
  Mbarrier q_full;
  Mbarrier q_empty;  // the tile's Q K^T GEMMs (and O staged in Q) are done with it
  Mbarrier k_full[T::kStages];   // TMA landed K of a stage
  Mbarrier k_empty[T::kStages];  // every consumer thread finished reading it
  Mbarrier v_full[T::kStages];
  Mbarrier v_empty[T::kStages];
  // kInVStages: the O store staged in a V stage has read it (a leader's
  // arrival per step), so the producer may load V there again.
  Mbarrier o_read[T::kOStore == OStore::kInVStages ? T::kStages : 1];
};

// Dynamic shared memory is only guaranteed 16-byte aligned: the launch adds
// this much slack and the kernel rounds the base up to the swizzle atom.
inline constexpr int kSmemAlignSlack = kSwizzleAtomBytes;

template <class T>
constexpr int shared_storage_bytes() {
  return static_cast<int>(sizeof(SharedStorage<T>)) + kSmemAlignSlack;
}

// Hopper: 227 KB of shared memory per block.
inline constexpr int kMaxSmemPerBlock = 227 * 1024;

}  // namespace flash3::sm90::fwd
