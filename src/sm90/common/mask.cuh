// Which key blocks a query tile visits (forward), which query blocks a key
// block meets (backward), which blocks need element masking, and the masking
// itself, of scores laid out rows = queries (forward) or rows = keys
// (backward's transposed scores): the ends of the sequences and, in the
// masked kernels (kMasked), a window of keys per query row aligned to the
// bottom-right corner, as one policy. Host and device: the CPU tests check
// it against the reference's visible keys.
//
// Query row i's diagonal key is d = i + seqlen_k - seqlen_q; the masked
// kernels' row sees keys [d - window_left, d + window_right] (within the
// sequence). Causal is the window (unbounded, 0), the default; a sliding
// window (FlashAttention's window_size, with or without causal) bounds
// either side (kUnbounded: not that side); an attention chunk keeps them
// within d's chunk of keys as well.
#pragma once

#include <climits>
#include <cmath>

#include "accumulator.hpp"

namespace flash3::sm90 {

// kLocal: the local kernels' mask (a window, a chunk), read from the
// members; otherwise a masked kernel's window is causal's, (kUnbounded, 0)
// without a chunk, as constants: the causal kernels' code is the causal
// mask's alone, whatever the members hold.
template <int kBlockM, int kBlockN, bool kMasked, bool kLocal = kMasked>
struct Mask {
  static_assert(kMasked || !kLocal, "a local mask is a masked one");
  static constexpr int kUnbounded = INT_MAX;
  static constexpr bool kIsMasked = kMasked;
  static constexpr bool kIsLocal = kLocal;
  int seqlen_q;
  int seqlen_k;
  int window_left = kUnbounded;
  int window_right = 0;
  int chunk = 0;  // attention_chunk: a row sees only its diagonal's chunk of keys (0: none)

  // The window's sides and chunk as the mask reads them.
  FLASH3_HOST_DEVICE int left() const { return kLocal ? window_left : kUnbounded; }
  FLASH3_HOST_DEVICE int right() const { return kLocal ? window_right : 0; }
  FLASH3_HOST_DEVICE int chunk_keys() const { return kLocal ? chunk : 0; }

  // The same window over other lengths (a varlen sequence's, a cache batch's;
  // the unmasked kernels' own, unread, are left out).
  FLASH3_HOST_DEVICE Mask with_lengths(int q, int k) const {
    if constexpr (kMasked) {
      return {q, k, window_left, window_right, chunk};
    } else {
      return {q, k};
    }
  }

  FLASH3_HOST_DEVICE int diagonal(int row) const { return row + seqlen_k - seqlen_q; }
  // The first key of position x's chunk (floor division).
  FLASH3_HOST_DEVICE int chunk_start(int x) const {
    return (x >= 0 ? x / chunk_keys() : -((chunk_keys() - 1 - x) / chunk_keys())) * chunk_keys();
  }
  FLASH3_HOST_DEVICE bool chunked() const { return kMasked && chunk_keys() > 0; }
  // Whether some row's keys start after key 0 / end before the last key
  // for a reason other than the sequence's ends.
  FLASH3_HOST_DEVICE bool has_left() const {
    return kMasked && (left() != kUnbounded || chunk_keys() > 0);
  }
  FLASH3_HOST_DEVICE bool has_right() const {
    return kMasked && (right() != kUnbounded || chunk_keys() > 0);
  }

  // Query row `row` sees keys [keys_begin(row), keys_end(row)) (either may
  // lie outside [0, seqlen_k]; the range is empty when end <= begin). Both
  // are non-decreasing in the row. No sum can overflow, whatever the
  // compiler evaluates first: a side is clamped before it is added or
  // subtracted. (The form `w < d ? d - w : 0` became max(d - w, 0) on the
  // GPU, which wraps for w = kUnbounded and d < 0: tiles whose first row saw
  // no key were skipped whole.)
  FLASH3_HOST_DEVICE int keys_begin(int row) const {
    const int d = diagonal(row);
    const int right_of_zero = max_of(d, 0);
    const int begin = kMasked ? right_of_zero - min_of(left(), right_of_zero) : 0;
    return chunked() ? max_of(begin, chunk_start(d)) : begin;
  }
  FLASH3_HOST_DEVICE int keys_end(int row) const {
    // seqlen_k - 1 - d = seqlen_q - 1 - row: the keys right of the diagonal.
    const int end = kMasked ? diagonal(row) + 1 + min_of(right(), seqlen_q - 1 - row)
                            : seqlen_k;
    return chunked() ? min_of(end, chunk_start(diagonal(row)) + chunk_keys()) : end;
  }
  // The diagonals of the rows that see key `key`: [first_diagonal(key),
  // last_diagonal(key)] (only where has_right() / has_left()).
  FLASH3_HOST_DEVICE int first_diagonal(int key) const {
    const int first = right() != kUnbounded ? key - right() : INT_MIN;
    return chunked() ? max_of(first, chunk_start(key)) : first;
  }
  FLASH3_HOST_DEVICE int last_diagonal(int key) const {
    const int last = left() != kUnbounded ? key + left() : INT_MAX;
    return chunked() ? min_of(last, chunk_start(key) + chunk_keys() - 1) : last;
  }

  // Key blocks [n_block_begin, n_block_end) hold every key any row of the
  // tile sees (none when begin >= end).
  FLASH3_HOST_DEVICE int n_block_end(int m_block) const {
    const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    if (!kMasked) {
      return n_blocks;
    }
    const int last_row = min_of((m_block + 1) * kBlockM, seqlen_q) - 1;
    const int end = keys_end(last_row);
    return end <= 0 ? 0 : min_of(n_blocks, (end - 1) / kBlockN + 1);
  }
  FLASH3_HOST_DEVICE int n_block_begin(int m_block) const {
    return kMasked ? max_of(0, keys_begin(m_block * kBlockM)) / kBlockN : 0;
  }

  // True if some element of key block n_block is hidden from some row of the
  // tile (rows past seqlen_q count too: they are never stored).
  FLASH3_HOST_DEVICE bool needs_mask(int m_block, int n_block) const {
    const int block_last_key = (n_block + 1) * kBlockN - 1;
    if (block_last_key >= seqlen_k) {
      return true;
    }
    return kMasked && (block_last_key >= keys_end(m_block * kBlockM) ||
                       n_block * kBlockN < keys_begin((m_block + 1) * kBlockM - 1));
  }

  // How many leading keys of block n_block some row of [first_row,
  // first_row + rows) may see (the rest of the block is hidden from all of
  // them): under kBlockN on a diagonal or the last key block.
  FLASH3_HOST_DEVICE int visible_keys(int first_row, int rows, int n_block) const {
    const int last_row = min_of(first_row + rows, seqlen_q) - 1;
    return max_of(0, min_of(kBlockN, keys_end(last_row) - n_block * kBlockN));
  }

  // Sets hidden scores of one thread's accumulator to -inf. The accumulator
  // follows the wgmma layout: s[4j + e] is row `row0` (e < 2) or `row0 + 8`
  // (e >= 2), key column `col0 + 8j + (e & 1)`.
  // Each row's limits are taken relative to col0 once, so that every element
  // compares its constant column offset against them (an ISETP with an
  // immediate per side and one FSEL, no per-element address arithmetic).
  // The window's left side is a loop of its own behind a uniform branch, so
  // causal blocks compare once per element, as before windows.
  template <int kRegs>
  FLASH3_HOST_DEVICE void apply(float (&s)[kRegs], int row0, int col0) const {
    int begin[2], end[2];  // keys of the block from col0 on that rows row0, row0 + 8 see
FLASH3_UNROLL
    for (int r = 0; r < 2; ++r) {
      begin[r] = keys_begin(row0 + 8 * r) - col0;
      end[r] = (kMasked ? keys_end(row0 + 8 * r) : seqlen_k) - col0;
    }
    if (has_left()) {
FLASH3_UNROLL
      for (int i = 0; i < kRegs; ++i) {
        const int offset = (i / 4) * 8 + (i & 1);
        if (offset >= end[acc_row(i)] || offset < begin[acc_row(i)]) {
          s[i] = -INFINITY;
        }
      }
      return;
    }
FLASH3_UNROLL
    for (int i = 0; i < kRegs; ++i) {
      if ((i / 4) * 8 + (i & 1) >= end[acc_row(i)]) {
        s[i] = -INFINITY;
      }
    }
  }

  // ---------------------------------------------------------------- backward
  // Query blocks [m_block_begin(n_block), m_block_end(n_block)) hold every
  // row that sees a key of key block n_block (none when begin >= end): key
  // j is seen by the rows i with j - right() <= d(i) <= j + left().
  // (So key block n adds into query block m exactly when n is in
  // [n_block_begin(m), n_block_end(m)): Mainloop::dq_turn counts on it.)
  FLASH3_HOST_DEVICE int num_m_blocks() const { return (seqlen_q + kBlockM - 1) / kBlockM; }
  FLASH3_HOST_DEVICE int m_block_begin(int n_block) const {
    if (!has_right()) {
      return 0;
    }
    // The first row seeing the block's first key. (A bounded side is under
    // seqlen_q + seqlen_k, a chunk at most that: problem.hpp.)
    const int first_row = first_diagonal(n_block * kBlockN) - diagonal(0);
    return first_row <= 0 ? 0 : first_row / kBlockM;
  }
  FLASH3_HOST_DEVICE int m_block_end(int n_block) const {
    if (!has_left()) {
      return num_m_blocks();
    }
    // The last row seeing the block's last key.
    const int last_row = last_diagonal((n_block + 1) * kBlockN - 1) - diagonal(0);
    return last_row < 0 ? 0 : min_of(num_m_blocks(), last_row / kBlockM + 1);
  }

  // Sets hidden scores of one thread's transposed accumulator (rows = keys)
  // to -inf: s[4j + e] is key `key0` (e < 2) or `key0 + 8` (e >= 2), query
  // column `col0 + 8j + (e & 1)`. Keys past seqlen_k are hidden from every
  // query (their K rows read as zero, so their scores would be 0, not -inf).
  // The window's left side (a last query column per key) is a loop of its
  // own, as in apply.
  template <int kRegs>
  FLASH3_HOST_DEVICE void apply_transposed(float (&s)[kRegs], int key0, int col0) const {
    int first_visible[2];  // the first query column (from col0) that keys key0, key0 + 8 meet
FLASH3_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + 8 * r;
      first_visible[r] = key >= seqlen_k ? INT_MAX
                         : !has_right()   ? INT_MIN
                                          : first_diagonal(key) - diagonal(0) - col0;
    }
    if (has_left()) {
      int last_visible[2];  // and the last (the window's left side)
FLASH3_UNROLL
      for (int r = 0; r < 2; ++r) {
        last_visible[r] = last_diagonal(key0 + 8 * r) - diagonal(0) - col0;
      }
FLASH3_UNROLL
      for (int i = 0; i < kRegs; ++i) {
        const int offset = (i / 4) * 8 + (i & 1);
        if (offset < first_visible[acc_row(i)] || offset > last_visible[acc_row(i)]) {
          s[i] = -INFINITY;
        }
      }
      return;
    }
FLASH3_UNROLL
    for (int i = 0; i < kRegs; ++i) {
      if ((i / 4) * 8 + (i & 1) < first_visible[acc_row(i)]) {
        s[i] = -INFINITY;
      }
    }
  }

 private:
  FLASH3_HOST_DEVICE static int min_of(int a, int b) { return a < b ? a : b; }
  FLASH3_HOST_DEVICE static int max_of(int a, int b) { return a > b ? a : b; }

};

}  // namespace flash3::sm90
