// Decoding: a few queries per sequence against a long K/V cache, where the
// work is bound by reading K and V from memory. Two host-side plans fit the
// forward kernels to it (docs/design.md, serving); host-only, so that the
// CPU tests check them.
//
// GQA packing. With heads_q = g x heads_k and one query per sequence, the g
// query heads that share a K/V head are g rows of one tile: q (batch, 1,
// heads_q, d) is the same memory as (batch, g, heads_k, d) whose rows are
// q's head stride apart and whose heads are g of them apart. Attention over
// that view is MHA with seqlen_q = g, so each K/V block is read and
// multiplied once per group instead of once per query head (GQA 32/8
// decoding spent 4x the tensor-core work per byte of K/V, and ran at 1.3
// TB/s). out takes the same view, and the log-sum-exp's (batch, heads_q, 1)
// is (batch, heads_k, g) in memory. A single query's bottom-right causal
// mask hides no key, so the view runs non-causal.
//
// Split-KV. A decoding call has few tiles (batch x heads_k once packed),
// often fewer than the SMs, each with many key blocks: the tail split
// (tail_split.hpp) cuts them into pieces of key blocks over every SM and
// folds the pieces' partial outputs by their log-sum-exps. So a launch with
// one query block per head and long keys takes a kernel with the tail split
// (Traits' kSplitKv where the tile config has none), and plan_grid splits
// what pays.
#pragma once

#include "grid.hpp"
#include "../problem.hpp"

namespace flash3::detail {

// Rewrites p as the packed view above where it applies (one query, GQA,
// 16-bit, not varlen, no sinks, no window); false, p unchanged, elsewhere.
inline bool pack_gqa(ForwardParams* p) {
  const int group = p->heads_k > 0 ? p->heads_q / p->heads_k : 1;
  // (Sinks are per query head: a packed tile's rows would need one each; a
  // window's rows would need the one query's position.)
  if (p->seqlen_q != 1 || group <= 1 || p->varlen_batch > 0 ||
      p->dtype == DType::kFloat8E4M3 || p->sinks != nullptr || p->local()) {
    return false;
  }
  p->seqlen_q = group;
  p->heads_q = p->heads_k;
  p->q_stride = {p->q_stride.batch, p->q_stride.head, p->q_stride.head * group};
  p->out_stride = {p->out_stride.batch, p->out_stride.head, p->out_stride.head * group};
  p->causal = false;
  return true;
}

// Whether a non-causal launch is decode-shaped: one query block of block_m
// rows per head, and enough key blocks of block_n keys that pieces of them
// pay (grid.hpp: kMinSplitStepBlocks).
inline bool wants_split_kv(int seqlen_q, int seqlen_k, int block_m, int block_n) {
  return seqlen_q <= block_m &&
         split_steps(true, false, seqlen_q, seqlen_k, block_m, block_n).split;
}

}  // namespace flash3::detail
