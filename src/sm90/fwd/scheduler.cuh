// Which output tiles a CTA computes. The grid is persistent (at most one CTA
// per SM). The tile sequence keeps all query blocks of one (batch, head)
// together, so the CTAs running at the same time share that head's K and V
// in L2.
//
// Non-causal tiles all cost the same, and CTA c takes tiles c, c + G, ...
// (G = gridDim.x). With two-CTA clusters (Traits::kClusterKv; G even, and
// launched only when every head has an even number of query blocks) the
// CTAs 2i and 2i + 1 of a cluster thus always hold query blocks 2j and
// 2j + 1 of one head, which read the same K and V.
//
// Causal tiles cost in proportion to m_block + 1, so each head's blocks are
// ordered longest, shortest, second longest, second shortest, ... and CTAs
// take them in pairs (2c, 2c + 1), (2c + 2G, ...):
// every pair costs about the same, which keeps the CTAs both balanced and in
// step, and so on the same heads' K and V.
#pragma once

namespace flash3::sm90::fwd {

struct Tile {
  int m_block;
  int head;
  int batch;
};

struct TileScheduler {
  int num_m_blocks;
  int heads;
  int num_tiles;

  // Tiles per scheduling step of one CTA.
  template <bool kCausal>
  static constexpr int kTilesPerStep = kCausal ? 2 : 1;

  template <bool kCausal>
  __device__ int first() const {
    return kTilesPerStep<kCausal> * static_cast<int>(blockIdx.x);
  }
  template <bool kCausal>
  __device__ int next(int index) const {
    constexpr int kStep = kTilesPerStep<kCausal>;
    return index % kStep != kStep - 1 ? index + 1
                                       : index + 1 + (static_cast<int>(gridDim.x) - 1) * kStep;
  }
  __device__ bool valid(int index) const { return index < num_tiles; }

  template <bool kCausal>
  __device__ Tile tile(int index) const {
    const int m = index % num_m_blocks;
    const int head_batch = index / num_m_blocks;
    Tile t;
    t.m_block = !kCausal ? m : (m % 2 == 0 ? num_m_blocks - 1 - m / 2 : m / 2);
    t.head = head_batch % heads;
    t.batch = head_batch / heads;
    return t;
  }
};

}  // namespace flash3::sm90::fwd
