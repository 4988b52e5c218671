// The tail split of a launch (host and device, so that the CPU tests check
// it); causal launches only where their tile pairs all cost the same
// (TailSchedule below).
//
// Non-causal tiles all cost the same, so a persistent grid of G CTAs runs
// ceil(tiles / G) waves, the last one partly empty: on the H200's 132 SMs
// the grid's 2048 tiles (d128) are 15.5 waves, and half the SMs idle
// through the 16th. The tail split cuts the tiles of that last wave into
// pieces of key blocks shared out evenly: tiles [0, split_tiles) run whole
// (CTA c takes c, c + G, ...), then the remaining tiles' key blocks, as
// units in tile order, go to the groups of CTAs (one CTA, or the two of a
// K/V cluster, which take the two query blocks of a pair-tile) in ranges
// of tail_blocks units. A tile cut in pieces is finished by the group whose
// range holds its first unit (its last piece, its key blocks from the end):
// the later groups write their piece first (a partial O and its
// log-sum-exp, in fp32, to their CTA's slot of the workspace), and it
// waits for them, folds their pieces into its own and stores O.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../problem.hpp"  // FLASH3_HOST_DEVICE

namespace flash3::sm90::fwd {

struct TailSplit {
  int split_tiles = 0;  // tiles before the tail; the launch's tile count if no split
  int tail_blocks = 0;  // key blocks per group in the tail (0: no split)
};

// One CTA's work item: key blocks [n_begin, n_end) of one tile.
struct Piece {
  enum Kind { kWhole, kPartial, kFinal };
  int tile;
  int n_begin;
  int n_end;
  Kind kind;      // kPartial: written to this CTA's slot; kFinal: folds in partners' slots
  int partners;   // kFinal: pieces written by the CTAs cta + group_ctas * (1 .. partners)
};

// Everything the decomposition needs, fixed for a launch.
//
// Causal launches take tiles in pairs of equal cost (scheduler.cuh: query
// blocks M-1-j and j of a head, M + 1 key blocks together); they are split
// only where every pair costs exactly that (seqlen_q == seqlen_k, as many
// keys per block as rows per tile, M even: grid.hpp), and the units of a
// tail pair are its long tile's key blocks, then its short tile's.
struct TailSchedule {
  bool causal;
  int num_tiles;
  int ctas;
  int group_ctas;  // CTAs that take the same pieces (of a pair-tile's two query blocks)
  int n_blocks;    // non-causal: key blocks of every tile; causal: query blocks per head (M)
  TailSplit split;

  // The piece CTA `cta` works on at its step `step` (0, 1, ...); false past
  // its last. Whole tiles say n_end = n_blocks (non-causal) or 0 (causal:
  // the tile's mask knows).
  FLASH3_HOST_DEVICE bool piece(int cta, int step, Piece* out) const {
    return causal ? piece_of<true>(cta, step, out) : piece_of<false>(cta, step, out);
  }
  template <bool kCausal>
  FLASH3_HOST_DEVICE bool piece_of(int cta, int step, Piece* out) const {
    constexpr int kPerStep = kCausal ? 2 : 1;
    const int index = step / kPerStep * kPerStep * ctas + kPerStep * cta + step % kPerStep;
    if (index < split.split_tiles) {
      *out = {index, 0, kCausal ? 0 : n_blocks, Piece::kWhole, 0};
      return true;
    }
    if (split.tail_blocks == 0) {
      return false;
    }
    const int k = step - split.split_tiles / ctas;  // causal: 2 tiles a step, 2 per CTA a wave
    const int group = cta / group_ctas;
    const int units = tail_units<kCausal>();
    const int lo = group * split.tail_blocks;
    const int hi = lo + split.tail_blocks < units ? lo + split.tail_blocks : units;
    if (lo >= hi) {
      return false;
    }
    const int seg = segment_of<kCausal>(lo) + k;  // a tile (causal) or pair-tile of the tail
    int start, len;
    span<kCausal>(seg, &start, &len);
    if (start >= hi) {
      return false;
    }
    const int o_lo = lo > start ? lo - start : 0;  // the piece's units within the segment
    const int o_hi = hi - start < len ? hi - start : len;
    const int tile = split.split_tiles + seg * group_ctas + cta % group_ctas;
    if (o_lo == 0 && o_hi == len) {
      *out = {tile, 0, kCausal ? 0 : n_blocks, Piece::kWhole, 0};
    } else if (o_lo > 0) {
      *out = {tile, len - o_hi, len - o_lo, Piece::kPartial, 0};  // unit o: key block len - 1 - o
    } else {
      // The groups whose ranges start inside this segment, after this one.
      const int end = start + len < units ? start + len : units;
      const int partners = (end + split.tail_blocks - 1) / split.tail_blocks - (group + 1);
      *out = {tile, len - o_hi, len, Piece::kFinal, partners};
    }
    return true;
  }

 private:
  // Causal: the key blocks of tail pair q's long tile (query block M - 1 - j
  // of its head, tile index split_tiles + 2q), M - j.
  FLASH3_HOST_DEVICE int long_blocks(int q) const {
    return n_blocks - (split.split_tiles + 2 * q) % n_blocks / 2;
  }
  template <bool kCausal>
  FLASH3_HOST_DEVICE int tail_units() const {
    return kCausal ? (num_tiles - split.split_tiles) / 2 * (n_blocks + 1)
                   : (num_tiles - split.split_tiles) / group_ctas * n_blocks;
  }
  template <bool kCausal>
  FLASH3_HOST_DEVICE int segment_of(int unit) const {
    if (!kCausal) {
      return unit / n_blocks;
    }
    const int q = unit / (n_blocks + 1);
    return 2 * q + (unit % (n_blocks + 1) >= long_blocks(q) ? 1 : 0);
  }
  template <bool kCausal>
  FLASH3_HOST_DEVICE void span(int seg, int* start, int* len) const {
    if (!kCausal) {
      *start = seg * n_blocks;
      *len = n_blocks;
      return;
    }
    const int q = seg / 2, c_long = long_blocks(q);
    *start = q * (n_blocks + 1) + (seg % 2 ? c_long : 0);
    *len = seg % 2 ? n_blocks + 1 - c_long : c_long;
  }
};

// The tail split's workspace (epilogue.cuh): a flag for each consumer
// warpgroup of every CTA the device can hold (a grid never has more CTAs
// than SMs: grid.hpp), then each CTA's partial log-sum-exps and O, fp32. The
// flags' region depends on the SM count alone, so one buffer, zeroed once,
// serves every kernel whichever used it before: each leaves its flags zero.
struct PartialWorkspace {
  static constexpr int kMaxFlagsPerCta = 3;           // consumer warpgroups
  static constexpr int kMaxConsumerThreads = 3 * 128;
  static constexpr size_t kAlign = 256;
  static constexpr int kMaxSms = 144;  // GH100's full die: no Hopper GPU has more

  static size_t flag_bytes(int num_sms) {
    return (static_cast<size_t>(num_sms) * kMaxFlagsPerCta * sizeof(uint32_t) + kAlign - 1) /
           kAlign * kAlign;
  }
  // The most query rows of a CTA's tile at this head dim (traits.cuh).
  static constexpr int max_block_m(int headdim) { return headdim <= 64 ? 192 : 128; }
  // At least what any forward kernel of this head dim needs on this device.
  static size_t bound(int num_sms, int headdim) {
    const size_t partial_floats =
        static_cast<size_t>(max_block_m(headdim)) * headdim + 2 * kMaxConsumerThreads;
    return flag_bytes(num_sms) + static_cast<size_t>(num_sms) * partial_floats * sizeof(float);
  }
};

}  // namespace flash3::sm90::fwd
