// Which output tiles a CTA computes. The grid is persistent (one CTA per SM)
// and each CTA walks the tile sequence with a stride of gridDim.x. The
// sequence keeps all query blocks of one (batch, head) together, so the CTAs
// running at the same time share that head's K and V in L2; for causal
// attention each head's query blocks come longest first (the last blocks
// see the most keys), which spreads long and short tiles over the CTAs.
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

  __device__ int first() const { return static_cast<int>(blockIdx.x); }
  __device__ int next(int index) const { return index + static_cast<int>(gridDim.x); }
  __device__ bool valid(int index) const { return index < num_tiles; }

  template <bool kCausal>
  __device__ Tile tile(int index) const {
    const int m = index % num_m_blocks;
    const int head_batch = index / num_m_blocks;
    Tile t;
    t.m_block = kCausal ? num_m_blocks - 1 - m : m;
    t.head = head_batch % heads;
    t.batch = head_batch / heads;
    return t;
  }
};

}  // namespace flash3::sm90::fwd
