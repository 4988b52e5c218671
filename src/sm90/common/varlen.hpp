// The tiles of a packed variable-length batch (FlashAttention's varlen
// layout: sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
// of q), host and device so that the CPU tests check them.
//
// The tile space is dense: sequence b contributes heads x m_blocks(b) tiles
// (m_blocks(b) = ceil(seqlen_q(b) / kBlockM)), in batch order, each head's
// query blocks together (its K and V stay in L2 while its blocks run). A
// pre-pass writes the prefix sums of m_blocks over the batch; a tile index
// finds its sequence by binary search in them. (A grid of max m-blocks x
// heads x batch with empty tiles skipped would spend most of its steps
// skipping in a ragged batch: docs/design.md, next steps 0b.)
//
// cu_seqlens live on the device, so the host cannot check them: every
// sequence is clamped to [0, total] here, so a malformed array gives wrong
// rows, never an access outside the tensors.
#pragma once

#include "../problem.hpp"  // FLASH3_HOST_DEVICE

namespace flash3::sm90 {

// Sequence b's rows [begin, begin + length) of a packed tensor of `total`
// rows, from cu_seqlens (batch + 1 offsets), clamped into [0, total], and
// its first seqused[b] rows only when seqused (batch counts) is given.
struct SeqRange {
  int begin;
  int length;
};
FLASH3_HOST_DEVICE inline SeqRange seq_range(const int* cu_seqlens, const int* seqused, int b,
                                             int total) {
  const int lo = cu_seqlens[b], hi = cu_seqlens[b + 1];
  const int begin = lo < 0 ? 0 : (lo > total ? total : lo);
  const int end = hi < begin ? begin : (hi > total ? total : hi);
  int length = end - begin;
  if (seqused != nullptr) {
    const int used = seqused[b] < 0 ? 0 : seqused[b];
    length = used < length ? used : length;
  }
  return {begin, length};
}

// The most query blocks of a batch whose sequences do not overlap, which
// the host checks against the grid's limits: total_q / block_m + batch.
// Malformed offsets can make sequences overlap (each is clamped into the
// tensor, not apart from the others) and sum past it, so the prefix sums
// saturate there: they stay non-decreasing and small, and every tile still
// lands inside its sequence.
FLASH3_HOST_DEVICE inline int max_query_blocks(int total_q, int batch, int block_m) {
  return total_q / block_m + batch;
}

// The pre-pass's arithmetic: prefix[b] = sum over i < b of m_blocks(i),
// saturated at max_query_blocks, batch + 1 entries.
FLASH3_HOST_DEVICE inline void block_prefix(const int* cu_seqlens_q, const int* seqused_q,
                                            int batch, int total_q, int block_m, int* prefix) {
  const long long cap = max_query_blocks(total_q, batch, block_m);
  long long sum = 0;
  for (int b = 0; b < batch; ++b) {
    prefix[b] = static_cast<int>(sum < cap ? sum : cap);
    sum += (seq_range(cu_seqlens_q, seqused_q, b, total_q).length + block_m - 1) / block_m;
  }
  prefix[batch] = static_cast<int>(sum < cap ? sum : cap);
}

struct VarlenTile {
  int batch;
  int head;
  int m_block;
  int m_blocks;  // of this sequence
};

struct VarlenTiles {
  const int* prefix;  // block_prefix's output
  int batch;
  int heads;

  FLASH3_HOST_DEVICE int num_tiles() const { return prefix[batch] * heads; }

  // Tile `index` < num_tiles(): the last sequence whose first tile is at or
  // before it (empty sequences share their successor's start and are
  // passed over), then the head and the query block within it.
  FLASH3_HOST_DEVICE VarlenTile tile(int index) const {
    int lo = 0, hi = batch - 1;  // the answer is in [lo, hi]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix[mid] * heads <= index) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int m_blocks = prefix[lo + 1] - prefix[lo];
    const int local = index - prefix[lo] * heads;
    return {lo, local / m_blocks, local % m_blocks, m_blocks};
  }
};

// What a varlen kernel reads (KernelArgs::varlen).
struct VarlenSequences {
  const int* cu_seqlens_q = nullptr;  // batch + 1, device
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;  // batch, device, or null
  const int* seqused_k = nullptr;
  const int* block_prefix = nullptr;  // batch + 1, written by the pre-pass
  int batch = 0;
  int total_q = 0;
  int total_k = 0;
};

}  // namespace flash3::sm90
