// Which key blocks a query tile visits (forward), which query blocks a key
// block meets (backward), which blocks need element masking, and the masking
// itself, of scores laid out rows = queries (forward) or rows = keys
// (backward's transposed scores): the causal limit (aligned to the
// bottom-right corner) and the ends of the sequences, as one policy.
#pragma once

#include <climits>
#include <cmath>

#include "sm90/common/wgmma.cuh"

namespace flash3::sm90 {

template <int kBlockM, int kBlockN, bool kCausal>
struct Mask {
  int seqlen_q;
  int seqlen_k;

  // Query row i sees keys j <= i + causal_offset().
  __device__ int causal_offset() const { return seqlen_k - seqlen_q; }

  // Key blocks [0, n_block_end) hold every key any row of the tile sees.
  __device__ int n_block_end(int m_block) const {
    const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    if (!kCausal) {
      return n_blocks;
    }
    const int last_row = min((m_block + 1) * kBlockM, seqlen_q) - 1;
    const int last_key = last_row + causal_offset();
    if (last_key < 0) {
      return 0;
    }
    return min(n_blocks, last_key / kBlockN + 1);
  }

  // True if some element of key block n_block is hidden from some row of the tile.
  __device__ bool needs_mask(int m_block, int n_block) const {
    const int block_last_key = (n_block + 1) * kBlockN - 1;
    if (block_last_key >= seqlen_k) {
      return true;
    }
    return kCausal && block_last_key > m_block * kBlockM + causal_offset();
  }

  // Query row `row` sees keys [0, keys_seen(row)).
  __device__ int keys_seen(int row) const {
    return kCausal ? min(seqlen_k, row + causal_offset() + 1) : seqlen_k;
  }

  // How many leading keys of block n_block some row of [first_row,
  // first_row + rows) sees (the rest of the block is hidden from all of
  // them): under kBlockN on a causal diagonal or the last key block.
  __device__ int visible_keys(int first_row, int rows, int n_block) const {
    const int last_row = min(first_row + rows, seqlen_q) - 1;
    return max(0, min(kBlockN, keys_seen(last_row) - n_block * kBlockN));
  }

  // Sets hidden scores of one thread's accumulator to -inf. The accumulator
  // follows the wgmma layout: s[4j + e] is row `row0` (e < 2) or `row0 + 8`
  // (e >= 2), key column `col0 + 8j + (e & 1)`.
  // Each row's limit is taken relative to col0 once, so that every element
  // compares its constant column offset against it (one ISETP with an
  // immediate and one FSEL, no per-element address arithmetic).
  template <int kRegs>
  __device__ void apply(float (&s)[kRegs], int row0, int col0) const {
    int visible[2];  // keys of the block from col0 on that rows row0, row0 + 8 see
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      visible[r] = keys_seen(row0 + 8 * r) - col0;
    }
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      if ((i / 4) * 8 + (i & 1) >= visible[acc_row(i)]) {
        s[i] = -INFINITY;
      }
    }
  }
  // ---------------------------------------------------------------- backward
  // Query blocks [m_block_begin(n_block), num_m_blocks()) hold every row that
  // sees a key of key block n_block (none when begin >= end).
  __device__ int num_m_blocks() const { return (seqlen_q + kBlockM - 1) / kBlockM; }
  __device__ int m_block_begin(int n_block) const {
    if (!kCausal) {
      return 0;
    }
    const int first_row =
        n_block * kBlockN - causal_offset();  // the first row seeing its first key
    return first_row <= 0 ? 0 : first_row / kBlockM;
  }

  // Sets hidden scores of one thread's transposed accumulator (rows = keys)
  // to -inf: s[4j + e] is key `key0` (e < 2) or `key0 + 8` (e >= 2), query
  // column `col0 + 8j + (e & 1)`. Keys past seqlen_k are hidden from every
  // query (their K rows read as zero, so their scores would be 0, not -inf).
  template <int kRegs>
  __device__ void apply_transposed(float (&s)[kRegs], int key0, int col0) const {
    int first_visible[2];  // the first query column (from col0) that keys key0, key0 + 8 meet
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + 8 * r;
      first_visible[r] = key >= seqlen_k ? INT_MAX
                         : kCausal        ? key - causal_offset() - col0
                                          : INT_MIN;
    }
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      if ((i / 4) * 8 + (i & 1) < first_visible[acc_row(i)]) {
        s[i] = -INFINITY;
      }
    }
  }
};

}  // namespace flash3::sm90
