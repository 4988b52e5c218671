// The backward's device workspace: what it holds and where, for the host
// (its size, for validation and backward_workspace_size) and the launch.
// Plain C++ (host and device): no CUDA runtime, nothing of src/api/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sm90/problem.hpp"  // FLASH3_HOST_DEVICE

namespace flash3::sm90::bwd {

// Query rows per step and key rows per CTA of the backward kernel, per head
// dim (traits.cuh checks its tile configs against these).
constexpr int block_m(int headdim) { return headdim <= 64 ? 128 : 64; }
constexpr int block_n(int headdim) { return headdim <= 128 ? 128 : 64; }

// Byte offsets into the workspace, each region 256-byte aligned:
//  - dq_accum: fp32 dQ sums, per (batch, head_q, query block) a block of
//    block_m x headdim floats in the order the kernel's threads hold them
//    (kernel.cuh: DqLayout); the pre-pass zeroes it;
//  - lse_log2, dpsum: fp32 (batch, head_q, padded seqlen_q): the forward's
//    log-sum-exp times log2(e) (+inf past seqlen_q) and rowsum(dO * O)
//    (0 past seqlen_q), written by the pre-pass;
//  - dk_accum, dv_accum (GQA only): fp32 (batch, head_k, seqlen_k, headdim);
//  - dq_semaphore (deterministic only): int32 per (batch, head_q, query block),
//    dkv_semaphore (deterministic GQA only): int32 per (batch, head_k, key block).
// Rows before (batch, head)'s first in the per-query-row regions (dq_accum
// in rows of headdim floats, lse_log2, dpsum), padded_seqlen_q rows each.
FLASH3_HOST_DEVICE inline int64_t padded_rows_before(int batch, int head, int heads_q,
                                                     int padded_seqlen_q) {
  return (static_cast<int64_t>(batch) * heads_q + head) * padded_seqlen_q;
}

struct WorkspaceLayout {
  int block_m = 0, block_n = 0;
  int num_m_blocks = 0, num_n_blocks = 0;
  int64_t padded_seqlen_q = 0;  // num_m_blocks * block_m
  size_t dq_accum = 0, lse_log2 = 0, dpsum = 0, dk_accum = 0, dv_accum = 0;
  size_t dq_semaphore = 0, dkv_semaphore = 0;
  size_t bytes = 0;  // the whole workspace
  bool gqa = false;

  static constexpr size_t kAlign = 256;

  static WorkspaceLayout of(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_k,
                            int headdim, bool deterministic) {
    WorkspaceLayout w;
    w.block_m = bwd::block_m(headdim);
    w.block_n = bwd::block_n(headdim);
    w.num_m_blocks = (seqlen_q + w.block_m - 1) / w.block_m;
    w.num_n_blocks = (seqlen_k + w.block_n - 1) / w.block_n;
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
      const size_t kv = static_cast<size_t>(batch) * heads_k * seqlen_k * headdim;
      w.dk_accum = take(kv * sizeof(float));
      w.dv_accum = take(kv * sizeof(float));
    }
    if (deterministic) {
      w.dq_semaphore =
          take(static_cast<size_t>(batch) * heads_q * w.num_m_blocks * sizeof(int32_t));
      if (w.gqa) {
        w.dkv_semaphore =
            take(static_cast<size_t>(batch) * heads_k * w.num_n_blocks * sizeof(int32_t));
      }
    }
    w.bytes = at;
    return w;
  }
};

}  // namespace flash3::sm90::bwd
