// Which output tile a CTA computes. One CTA per tile for now (issue 3 makes
// this persistent); the order keeps all query blocks of one head together so
// that its K and V stay in L2, and for causal attention starts with the
// longest tiles (the last query blocks), which evens out the tail.
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
