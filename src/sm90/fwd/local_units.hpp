// The local kernels' work units (scheduler.cuh), host and device, so that
// the CPU tests check them.
//
// A sliding window's query blocks cost the window, but for a head's first
// ones, whose windows grow block by block from the first key (a causal
// softcap's grow all the way). Taken one at a time in round robin, CTA c
// getting tiles c, c + G, ..., those short tiles fell on the same CTAs
// wave after wave: the simulated imbalance was 17% for window 4096 over 16k
// keys (b1 h16 d128, 132 SMs) and 36% for window 8192, which the H100
// measured (TFLOP/s on visible scores 0.80x and 0.73x of the causal
// kernel's). So each head's work comes in units of about one window: its
// query blocks from the last down to `short_blocks` one at a time, then
// its first `short_blocks` ones in pairs (short_blocks - 1 - p, p), whose
// costs add up to about one window (for causal ones, the causal kernels'
// pairs). Heads stay whole in the unit sequence, so the CTAs running at
// once share their K and V in L2.
#pragma once

#include "../problem.hpp"  // FLASH3_HOST_DEVICE

namespace flash3::sm90::fwd {

struct LocalUnits {
  int m_blocks = 0;      // query blocks per head
  int short_blocks = 0;  // the head's first blocks, taken in pairs (0: none)

  FLASH3_HOST_DEVICE int singles() const { return m_blocks - short_blocks; }
  FLASH3_HOST_DEVICE int per_head() const { return singles() + (short_blocks + 1) / 2; }
  // Whether a head's unit k holds two query blocks.
  FLASH3_HOST_DEVICE bool is_pair(int k) const {
    const int p = k - singles();
    return p >= 0 && 2 * p + 1 < short_blocks;
  }
  // The query block of a head's unit k (`second`: a pair's second one).
  FLASH3_HOST_DEVICE int m_block(int k, bool second) const {
    const int p = k - singles();
    return p < 0 ? m_blocks - 1 - k : second ? p : short_blocks - 1 - p;
  }

  // The short blocks of a mask (mask.cuh): of the leading query blocks whose
  // windows start at key block 0 (where their costs grow), as many as pair
  // up in units of at most a window: a pair (s - 1 - p, p)
  // costs about cost(0) + cost(s - 1), the window being the first later
  // block's cost (a causal softcap's blocks all start at 0: all of them, the
  // causal pairs). None where the costs do not grow (a window whose right
  // side is unbounded, rows that all see a whole window).
  template <class Mask>
  static LocalUnits of(const Mask& mask, int m_blocks) {
    const auto cost = [&](int m) { return mask.n_block_end(m) - mask.n_block_begin(m); };
    // The first block whose window starts past key block 0 (n_block_begin
    // is non-decreasing); then the most short blocks whose pairs fit the
    // window (cost is non-decreasing below it).
    const auto last_true = [](int lo, int hi, auto&& holds) {  // holds(lo), monotone
      while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (holds(mid)) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      return lo;
    };
    const int grown = last_true(0, m_blocks, [&](int s) { return s == 0 || mask.n_block_begin(s - 1) == 0; });
    if (grown < 2 || cost(0) >= cost(grown - 1)) {
      return {m_blocks, 0};
    }
    if (grown == m_blocks) {
      return {m_blocks, m_blocks};
    }
    const int window = cost(grown);
    const int pairs = last_true(1, grown, [&](int s) { return cost(0) + cost(s - 1) <= window; });
    return {m_blocks, pairs >= 2 ? pairs : 0};
  }
};

}  // namespace flash3::sm90::fwd
