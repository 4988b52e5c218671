// The persistent grid of one forward launch (launch.cuh), host-only so that
// the CPU tests check it. At most one CTA per SM, each walking its share of
// the tiles (scheduler.cuh); causal CTAs take tiles in pairs. Kernels that
// share K and V between the two CTAs of a cluster (Traits::kClusterKv) run
// in clusters when every head's query blocks come in whole groups of the
// cluster's tiles per step, so that the pair always holds adjacent query
// blocks of one head; otherwise (and when no cluster fits) in single CTAs.
#pragma once

#include <algorithm>

namespace flash3::detail {

struct GridPlan {
  unsigned ctas;
  bool clusters;  // clusters of two CTAs
};

// tiles: batch * heads * num_m_blocks; max_clusters: two-CTA clusters that
// fit on the device at once (cudaOccupancyMaxActiveClusters), 0 if none.
inline GridPlan plan_grid(long long tiles, int num_m_blocks, int tiles_per_step, int num_sms,
                          bool cluster_kv, int max_clusters) {
  const int pair_tiles = 2 * tiles_per_step;
  if (cluster_kv && max_clusters > 0 && num_m_blocks % pair_tiles == 0) {
    const long long clusters = std::min<long long>(tiles / pair_tiles, max_clusters);
    if (clusters > 0) {
      return {static_cast<unsigned>(2 * clusters), true};
    }
  }
  const long long ctas =
      std::min<long long>((tiles + tiles_per_step - 1) / tiles_per_step, num_sms);
  return {static_cast<unsigned>(ctas), false};
}

}  // namespace flash3::detail
