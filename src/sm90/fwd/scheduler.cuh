// Which output tiles a CTA computes. The grid is persistent (at most one CTA
// per SM). The tile sequence keeps all query blocks of one (batch, head)
// together, so the CTAs running at the same time share that head's K and V
// in L2.
//
// Non-causal tiles all cost the same, and CTA c takes tiles c, c + G, ...
// (G = gridDim.x), and in the last wave, if the launch splits it, pieces of
// tiles (tail_split.hpp; causal pairs too, where they all cost the same).
// With two-CTA clusters (Traits::kClusterKv; G even, and launched only
// when every head has an even number of query blocks) the
// CTAs 2i and 2i + 1 of a cluster thus always hold query blocks 2j and
// 2j + 1 of one head, which read the same K and V.
//
// Causal tiles cost in proportion to m_block + 1, so each head's blocks are
// ordered longest, shortest, second longest, second shortest, ... and CTAs
// take them in pairs (2c, 2c + 1), (2c + 2G, ...):
// every pair costs about the same, which keeps the CTAs both balanced and in
// step, and so on the same heads' K and V.
//
// The local kernels (a sliding window, a chunk, softcap) take units of about
// a window each (local_units.hpp): a head's longer query blocks one at a
// time, its first, shorter ones in pairs; CTA c takes units c, c + G, ...
// (Varlen ones take tiles one at a time, each sequence's last block first.)
#pragma once

#include <type_traits>

#include "sm90/problem.hpp"

#include "local_units.hpp"
#include "tail_split.hpp"
#include "kv_cache.hpp"
#include "sm90/common/varlen.hpp"

namespace flash3::sm90::fwd {

struct Tile {
  int m_block;
  int head;
  int batch;
};

// One step of a CTA: key blocks [n_begin, n_end) of a tile, whole or a piece
// of the tail split.
struct Work {
  Tile tile;
  int n_begin;
  int n_end;
  Piece::Kind kind;
  int partners;  // Piece::kFinal: how many later CTAs of the group's rank wrote pieces
};

struct TileScheduler {
  int num_m_blocks;
  int heads;
  // index / num_m_blocks and / heads by multiply-high: two integer divisions
  // (~30 instructions each, on the path from one tile's epilogue to the
  // next tile's first GEMM) in every tile.
  flash3::detail::FastDivisor by_m_blocks;
  flash3::detail::FastDivisor by_heads;
  int num_tiles;  // (kUnits: the units of all heads)
  TailSchedule tail;
  // kUnits (the dense and KV-cache local kernels): a head's units, and
  // division by their count per head.
  LocalUnits units{};
  flash3::detail::FastDivisor by_units{};

  // Tiles per scheduling step of one CTA.
  template <bool kCausal>
  static constexpr int kTilesPerStep = kCausal ? 2 : 1;

  // Where a CTA is in its sequence: the tile index of its whole-tile steps
  // (c, c + G, ...; causal 2c, 2c + 1, 2c + 2G, ...; kUnits, 2 u + the
  // second of a pair, for units u = c, c + G, ...) and the step count.
  struct Cursor {
    int index;
    int step;
  };
  template <bool kCausal, bool kUnits = false>
  __device__ Cursor begin() const {
    return {(kUnits ? 2 : kTilesPerStep<kCausal>) * static_cast<int>(blockIdx.x), 0};
  }
  template <bool kCausal, bool kUnits = false>
  __device__ void advance(Cursor& c) const {
    ++c.step;
    if constexpr (kUnits) {
      const int unit = c.index >> 1;
      const bool second_next =
          (c.index & 1) == 0 && units.is_pair(unit - by_units.divide(unit) * units.per_head());
      c.index = second_next ? c.index + 1 : 2 * (unit + static_cast<int>(gridDim.x));
      return;
    }
    constexpr int kStep = kTilesPerStep<kCausal>;
    c.index = c.index % kStep != kStep - 1
                  ? c.index + 1
                  : c.index + 1 + (static_cast<int>(gridDim.x) - 1) * kStep;
  }

  // The work at the cursor; false past the CTA's last. Whole tiles take the
  // key blocks their rows see (mask.n_block_end). kTailSplit (the kernel's
  // Traits::kTailSplit): past split_tiles, pieces of tiles (tail_split.hpp).
  // Mask::kIsLocal: the cursor walks units (kUnits of begin and advance).
  template <bool kCausal, bool kTailSplit, class Mask>
  __device__ bool work(const Cursor& c, const Mask& mask, Work& w) const {
    Piece piece{c.index, 0, 0, Piece::kWhole, 0};
    if constexpr (Mask::kIsLocal) {
      static_assert(!kTailSplit && !kCausal, "local units are whole tiles");
      const int unit = c.index >> 1;
      if (unit >= num_tiles) {
        return false;
      }
      const int head_batch = by_units.divide(unit);
      w.tile.m_block = units.m_block(unit - head_batch * units.per_head(), c.index & 1);
      w.tile.batch = by_heads.divide(head_batch);
      w.tile.head = head_batch - w.tile.batch * heads;
    } else {
      if constexpr (kTailSplit) {
        if (!tail.piece_of<kCausal>(static_cast<int>(blockIdx.x), c.step, &piece)) {
          return false;
        }
      } else if (c.index >= num_tiles) {
        return false;
      }
      w.tile = tile<kCausal>(piece.tile);
    }
    const bool whole = piece.kind == Piece::kWhole;
    w.n_begin = piece.n_begin;  // whole: 0, or (local kernels) the tile's window's first block
    if constexpr (Mask::kIsLocal) {
      w.n_begin = whole ? mask.n_block_begin(w.tile.m_block) : piece.n_begin;
    }
    w.n_end = whole ? mask.n_block_end(w.tile.m_block) : piece.n_end;
    w.kind = piece.kind;
    w.partners = piece.partners;
    return true;
  }

  // The query block at place m of a head's m_blocks: kCausal, causal pairs
  // (longest, shortest, ...); kLongestFirst, the last first (the varlen
  // local kernels', whose first blocks cost less); else in order.
  template <bool kCausal, bool kLongestFirst>
  __device__ static int ordered_m_block(int m, int m_blocks) {
    return kCausal        ? (m % 2 == 0 ? m_blocks - 1 - m / 2 : m / 2)
           : kLongestFirst ? m_blocks - 1 - m
                           : m;
  }
  template <bool kCausal>
  __device__ Tile tile(int index) const {
    const int head_batch = by_m_blocks.divide(index);
    const int m = index - head_batch * num_m_blocks;
    Tile t;
    t.m_block = ordered_m_block<kCausal, false>(m, num_m_blocks);
    t.batch = by_heads.divide(head_batch);
    t.head = head_batch - t.batch * heads;
    return t;
  }
};

// Varlen (Traits::kVarlen; varlen.hpp): a work also carries its sequence's
// rows in the packed tensors. (Types of their own, so that the other
// kernels' code is exactly as it was.)
struct VarlenWork : Work {
  SeqRange q{};
  SeqRange k{};
};

// The dense tile space of varlen.hpp, whole tiles only, in the persistent
// order of TileScheduler (CTA c takes tiles c, c + G, ...; causal pairs).
// Within a causal head the sequence's own query-block count orders the
// blocks longest first, and the mask is the sequence's.
struct VarlenTileScheduler : TileScheduler {
  VarlenSequences varlen;

  template <bool kCausal, bool kTailSplit, class Mask>
  __device__ bool work(const Cursor& c, const Mask& mask, VarlenWork& w) const {
    static_assert(!kTailSplit, "varlen launches are not tail-split");
    const VarlenTiles tiles{varlen.block_prefix, varlen.batch, heads};
    if (c.index >= tiles.num_tiles()) {
      return false;
    }
    const VarlenTile t = tiles.tile(c.index);
    w.tile.batch = t.batch;
    w.tile.head = t.head;
    w.tile.m_block = ordered_m_block<kCausal, Mask::kIsLocal>(t.m_block, t.m_blocks);
    w.q = seq_range(varlen.cu_seqlens_q, varlen.seqused_q, t.batch, varlen.total_q);
    w.k = seq_range(varlen.cu_seqlens_k, varlen.seqused_k, t.batch, varlen.total_k);
    const Mask sequence = mask.with_lengths(w.q.length, w.k.length);
    w.n_begin = sequence.n_block_begin(w.tile.m_block);
    w.n_end = sequence.n_block_end(w.tile.m_block);
    w.kind = Piece::kWhole;
    w.partners = 0;
    return true;
  }
};

// KV cache (Traits::kKvCache; kv_cache.hpp): a work also carries its
// batch's keys.
struct KvCacheWork : Work {
  CacheKeys k{};
};

// The tiles and pieces of TileScheduler over the cache's key slots, each
// work's key blocks then cut to those its batch uses (a piece past them has
// none: its partial weighs nothing in the fold).
struct KvCacheTileScheduler : TileScheduler {
  KvCacheSequences cache;

  template <bool kCausal, bool kTailSplit, class Mask>
  __device__ bool work(const Cursor& c, const Mask& mask, KvCacheWork& w) const {
    if (!TileScheduler::work<kCausal, kTailSplit>(c, mask, w)) {
      return false;
    }
    w.k = cache.keys(w.tile.batch);
    const Mask batch = mask.with_lengths(mask.seqlen_q, w.k.length);
    w.n_end = min(w.n_end, batch.n_block_end(w.tile.m_block));
    if constexpr (Mask::kIsLocal) {
      if (w.kind == Piece::kWhole) {
        w.n_begin = batch.n_block_begin(w.tile.m_block);
      }
    }
    w.n_begin = min(w.n_begin, w.n_end);
    return true;
  }
};

template <class T>
using SchedulerOf =
    std::conditional_t<T::kVarlen, VarlenTileScheduler,
                       std::conditional_t<T::kKvCache, KvCacheTileScheduler, TileScheduler>>;
template <class T>
using WorkOf = std::conditional_t<T::kVarlen, VarlenWork,
                                  std::conditional_t<T::kKvCache, KvCacheWork, Work>>;

}  // namespace flash3::sm90::fwd
