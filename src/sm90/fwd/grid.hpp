// The persistent grid of one forward launch (launch.cuh), host-only so that
// the CPU tests check it. At most one CTA per SM, each walking its share of
// the tiles (scheduler.cuh); causal CTAs take tiles in pairs. Kernels that
// share K and V between the two CTAs of a cluster (Traits::kClusterKv) run
// in clusters when every head's query blocks come in whole groups of the
// cluster's tiles per step, so that the pair always holds adjacent query
// blocks of one head; otherwise (and when no cluster fits) in single CTAs.
// Launches may cut their last wave's tiles in pieces (tail_split.hpp) when
// that shortens it by at least kMinTailSaving blocks.
#pragma once

#include <algorithm>

#include "tail_split.hpp"

namespace flash3::detail {

struct GridPlan {
  unsigned ctas;
  bool clusters;  // clusters of two CTAs
  sm90::fwd::TailSplit tail;
};

// A piece costs about a key block more than its blocks (its own Q load and
// pipeline start, the partial O written and read back): the split must
// shorten the last wave by at least this many key blocks.
inline constexpr int kMinTailSaving = 2;
// And the split is for long sequences only: a step of at least this many
// key blocks (H200, same run: at 1k the pieces' costs outweighed the
// shorter wave, bf16 d128 causal 1k 410 -> 399 TFLOP/s; traits.cuh has the
// gains from 4k). 16 rather than 32, three rounds: bf16 d128 non-causal 4k
// (24 blocks of 176 keys) 659-661 -> 671-673, causal 2k (17) 492-496 ->
// 495-519; the cells that split at 32 unchanged.
inline constexpr int kMinSplitStepBlocks = 16;

// A launch's steps (tail_split.hpp): `blocks` key blocks each, a non-causal
// tile's or a causal pair's (M + 1, when every pair costs that: seqlen_q ==
// seqlen_k, square blocks, an even M), and whether its last wave may be
// split: the kernel has the split (Traits::kTailSplit), its steps all cost
// the same and they are long enough.
struct SplitSteps {
  bool split;
  int blocks;
};
inline SplitSteps split_steps(bool kernel_splits, bool causal, int seqlen_q, int seqlen_k,
                              int block_m, int block_n) {
  const int m_blocks = (seqlen_q + block_m - 1) / block_m;
  if (causal) {
    const bool pairs_equal = seqlen_q == seqlen_k && block_m == block_n && m_blocks % 2 == 0;
    return {kernel_splits && pairs_equal && m_blocks + 1 >= kMinSplitStepBlocks, m_blocks + 1};
  }
  const int blocks = (seqlen_k + block_n - 1) / block_n;
  return {kernel_splits && blocks >= kMinSplitStepBlocks, blocks};
}

// The tail split of `tiles` tiles over `ctas` CTAs in groups of group_ctas
// taking tiles_per_step tiles a step of step_blocks key blocks
// (tail_split.hpp), or none.
inline sm90::fwd::TailSplit plan_tail(long long tiles, unsigned ctas, int group_ctas,
                                      int tiles_per_step, int step_blocks) {
  const long long wave = static_cast<long long>(ctas) * tiles_per_step;
  const long long full = tiles / wave * wave;
  const long long groups = ctas / group_ctas;
  const long long units = (tiles - full) / (group_ctas * tiles_per_step) * step_blocks;
  const long long per_group = (units + groups - 1) / groups;
  if (units == 0 || per_group > step_blocks - kMinTailSaving) {
    return {static_cast<int>(tiles), 0};
  }
  return {static_cast<int>(full), static_cast<int>(per_group)};
}

// tiles: batch * heads * num_m_blocks; max_clusters: two-CTA clusters that
// fit on the device at once (cudaOccupancyMaxActiveClusters), 0 if none.
// tail_split: whether the kernel may cut tiles in pieces (tail_split.hpp:
// non-causal, or causal pairs of equal cost; a workspace), a step of a CTA
// being step_blocks key blocks (a tile's; a causal pair's M + 1); then the
// grid fills the device even with fewer tiles than SMs, if a split pays.
inline GridPlan plan_grid(long long tiles, int num_m_blocks, int tiles_per_step, int num_sms,
                          bool cluster_kv, int max_clusters, bool tail_split = false,
                          int step_blocks = 0) {
  const auto whole = [&](unsigned ctas, bool clusters) {
    return GridPlan{ctas, clusters, {static_cast<int>(tiles), 0}};
  };
  const auto with_tail = [&](unsigned full_ctas, unsigned ctas, bool clusters) {
    const sm90::fwd::TailSplit tail =
        plan_tail(tiles, full_ctas, clusters ? 2 : 1, tiles_per_step, step_blocks);
    return tail.tail_blocks > 0 ? GridPlan{full_ctas, clusters, tail} : whole(ctas, clusters);
  };
  const int pair_tiles = 2 * tiles_per_step;
  if (cluster_kv && max_clusters > 0 && num_m_blocks % pair_tiles == 0) {
    const long long clusters = std::min<long long>(tiles / pair_tiles, max_clusters);
    if (clusters > 0) {
      const unsigned ctas = static_cast<unsigned>(2 * clusters);
      return tail_split ? with_tail(2u * max_clusters, ctas, true) : whole(ctas, true);
    }
  }
  const unsigned ctas = static_cast<unsigned>(
      std::min<long long>((tiles + tiles_per_step - 1) / tiles_per_step, num_sms));
  return tail_split ? with_tail(num_sms, ctas, false) : whole(ctas, false);
}

}  // namespace flash3::detail
