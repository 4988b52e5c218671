// The backward's device workspace: what it holds and where, for the host
// (its size, for validation and backward_workspace_size) and the launch.
// Plain C++ (host and device): no CUDA runtime, nothing of src/api/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/varlen.hpp"
#include "../problem.hpp"  // FLASH3_HOST_DEVICE (relative: the CPU tests include this)

namespace flash3::sm90::bwd {

// Query rows per step and key rows per CTA of the backward kernel, per head
// dims of q and of v (traits.cuh checks its tile configs against these): the
// wider one's tiles.
constexpr int block_m(int headdim, int headdim_v) {
  return (headdim > headdim_v ? headdim : headdim_v) <= 64 ? 128 : 64;
}
constexpr int block_n(int headdim, int headdim_v) {
  return (headdim > headdim_v ? headdim : headdim_v) <= 128 ? 128 : 64;
}

// Byte offsets into the workspace, each region 256-byte aligned:
//  - dq_accum: fp32 dQ sums, per (batch, head_q, query block) a block of
//    block_m x headdim floats in the order the kernel's threads hold them
//    (mainloop.cuh: for_each_dq_chunk); its first writer stores it (dq_state),
//    or, for the kernels whose consumers add dQ themselves (kDqAtomic), the
//    pre-pass zeroes it;
//  - lse_log2, dpsum: fp32 (batch, head_q, padded seqlen_q): the forward's
//    log-sum-exp times log2(e) (+inf past seqlen_q) and rowsum(dO * O)
//    (0 past seqlen_q), written by the pre-pass;
//  - dk_accum, dv_accum (GQA only): fp32 (batch, head_k, seqlen_k, headdim),
//    dV's of headdim_v;
//  - dq_state: int32 per (batch, head_q, query block), whether its dQ sums
//    were written yet, or in deterministic mode whose turn it is (the
//    pre-pass zeroes it; mainloop.cuh, write_dq_staged);
//  - dkv_semaphore (deterministic GQA only): int32 per (batch, head_k, key block);
//  - key_prefix (varlen only): the sequences' key-block prefix sums
//    (varlen.hpp: block_prefix), which place the main kernel's CTAs;
//  - sink_partials (with dsinks only): per query block of the per-row
//    regions, its rows' share of dsinks (the pre-pass writes them, zero in
//    the gaps; a reduction sums each head's in order).
// A varlen batch is batch 1 of total_q query rows, whose per-row regions
// hold each head's sequences apart: sequence b's rows start at
// round_down(begin_b + b * block_m, block_m), so every sequence keeps its
// whole blocks (the next one begins at least its length later) and a head
// needs at most total_q + batch * block_m rows (padded_seqlen_q); its
// key blocks number at most total_k / block_n + batch (num_n_blocks).

// The query rows of one (sequence, head): where they are in the tensors
// and where in the per-query-row regions (dq_accum in rows of headdim
// floats, lse_log2, dpsum).
struct QueryRows {
  int batch;        // the tensors' batch (varlen: 0)
  int row0;         // the sequence's first row in them (dense: 0)
  int length;       // its rows
  int64_t ws_row0;  // its first row in the per-row regions, a multiple of block_m
  int64_t lse_row0; // its first row's log-sum-exp in softmax_lse
};

// Sequence b (dense: batch b) of head `head`; varlen.batch == 0: dense.
FLASH3_HOST_DEVICE inline QueryRows query_rows(const VarlenSequences& varlen, int b, int head,
                                               int heads_q, int seqlen_q,
                                               int64_t padded_seqlen_q, int block_m) {
  if (varlen.batch == 0) {
    const int64_t batch_head = static_cast<int64_t>(b) * heads_q + head;
    return {b, 0, seqlen_q, batch_head * padded_seqlen_q, batch_head * seqlen_q};
  }
  const SeqRange q = seq_range(varlen.cu_seqlens_q, varlen.seqused_q, b, varlen.total_q);
  const int64_t start = (static_cast<int64_t>(q.begin) + static_cast<int64_t>(b) * block_m) /
                        block_m * block_m;
  return {0, q.begin, q.length, head * padded_seqlen_q + start,
          static_cast<int64_t>(head) * varlen.total_q + q.begin};
}

// A row whose visible keys are at most this many gets its dpsum (D)
// exactly, sum_j P_j dP_j, rather than from the 16-bit out (prepass.cuh).
inline constexpr int kExactDKeys = 32;

struct WorkspaceLayout {
  int block_m = 0, block_n = 0;
  int num_m_blocks = 0, num_n_blocks = 0;
  int64_t padded_seqlen_q = 0;  // num_m_blocks * block_m
  size_t dq_accum = 0, lse_log2 = 0, dpsum = 0, dk_accum = 0, dv_accum = 0;
  size_t dkv_end = 0;  // GQA: where the dK / dV sums end
  size_t dq_state = 0, dkv_semaphore = 0, key_prefix = 0, sink_partials = 0;
  size_t bytes = 0;  // the whole workspace
  bool gqa = false;

  static constexpr size_t kAlign = 256;

  // Varlen (varlen_batch sequences): batch 1, seqlen_q and seqlen_k the totals.
  // sinks: room for the sinks' gradient's partial sums (one per query block
  // of the per-row regions: sink_partials, batch x heads_q x num_m_blocks floats).
  static WorkspaceLayout of(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_k,
                            int headdim, int headdim_v, bool deterministic,
                            int varlen_batch = 0, bool sinks = false) {
    WorkspaceLayout w;
    w.block_m = bwd::block_m(headdim, headdim_v);
    w.block_n = bwd::block_n(headdim, headdim_v);
    if (varlen_batch > 0) {
      w.num_m_blocks = static_cast<int>(
          (static_cast<int64_t>(seqlen_q) + static_cast<int64_t>(varlen_batch + 1) * w.block_m -
           1) / w.block_m);
      w.num_n_blocks = max_query_blocks(seqlen_k, varlen_batch, w.block_n);
    } else {
      w.num_m_blocks = (seqlen_q + w.block_m - 1) / w.block_m;
      w.num_n_blocks = (seqlen_k + w.block_n - 1) / w.block_n;
    }
    w.padded_seqlen_q = static_cast<int64_t>(w.num_m_blocks) * w.block_m;
    w.gqa = heads_q != heads_k;
    const size_t rows_q = static_cast<size_t>(batch) * heads_q * w.padded_seqlen_q;
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t offset = at;
      at += (bytes + kAlign - 1) / kAlign * kAlign;
      return offset;
    };
    w.dq_accum = take(rows_q * headdim * sizeof(float));
    w.lse_log2 = take(rows_q * sizeof(float));
    w.dpsum = take(rows_q * sizeof(float));
    if (w.gqa) {
      const size_t rows_k = static_cast<size_t>(batch) * heads_k * seqlen_k;
      w.dk_accum = take(rows_k * headdim * sizeof(float));
      w.dv_accum = take(rows_k * headdim_v * sizeof(float));
      w.dkv_end = at;
    }
    w.dq_state = take(static_cast<size_t>(batch) * heads_q * w.num_m_blocks * sizeof(int32_t));
    if (deterministic && w.gqa) {
      w.dkv_semaphore =
          take(static_cast<size_t>(batch) * heads_k * w.num_n_blocks * sizeof(int32_t));
    }
    if (varlen_batch > 0) {
      w.key_prefix = take((static_cast<size_t>(varlen_batch) + 1) * sizeof(int32_t));
    }
    if (sinks) {
      w.sink_partials =
          take(static_cast<size_t>(batch) * heads_q * w.num_m_blocks * sizeof(float));
    }
    w.bytes = at;
    return w;
  }
};

}  // namespace flash3::sm90::bwd
