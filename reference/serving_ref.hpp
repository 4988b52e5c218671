// CPU references for the serving features (issue 24), in float64, for the
// kernels to come:
//  - attention_forward_varlen: FlashAttention's packed variable-length batch;
//  - gather_pages: a paged KV cache read back into a contiguous one;
//  - apply_rotary: rotary position embedding as flash_attn's apply_rotary_emb;
//  - attention_combine: the merge of split-KV partial results
//    (FlashAttention-3's flash_attn_combine).
// Malformed inputs throw std::invalid_argument.
#pragma once

#include <vector>

#include "reference/attention_ref.hpp"

namespace flash3::ref {

// Sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of
// the packed q, its keys rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k
// and v; both arrays hold batch + 1 offsets from 0, non-decreasing.
struct VarlenShape {
  std::vector<int> cu_seqlens_q{0};
  std::vector<int> cu_seqlens_k{0};
  int heads_q = 1;
  int heads_k = 1;
  int headdim = 1;

  int batch() const;
  int total_q() const;
  int total_k() const;
};

// attention_forward on each sequence on its own (causal: bottom-right per
// sequence). q and out (total_q, heads_q, headdim); k, v (total_k, heads_k,
// headdim); lse (heads_q, total_q), as FlashAttention-3's varlen returns it.
// Empty sequences are allowed; a query row with no key gets zeros and +inf.
Reference attention_forward_varlen(const VarlenShape& shape, const std::vector<float>& q,
                                   const std::vector<float>& k, const std::vector<float>& v,
                                   double softmax_scale, bool causal);

// attention_forward_plain (fp16/bf16 arithmetic) on each sequence on its own,
// packed like q: the same-dtype computation of the tolerance rule. Rows of a
// sequence without keys are zero.
std::vector<float> attention_forward_varlen_plain(HalfType type, const VarlenShape& shape,
                                                  const std::vector<float>& q,
                                                  const std::vector<float>& k,
                                                  const std::vector<float>& v,
                                                  float softmax_scale, bool causal);

// attention_backward and attention_backward_plain on each sequence on its
// own, packed like q (dq) and k, v (dk, dv); a sequence without queries or
// keys gets zero gradients.
Gradients attention_backward_varlen(const VarlenShape& shape, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<float>& dout, double softmax_scale,
                                    bool causal);
PlainGradients attention_backward_varlen_plain(HalfType type, const VarlenShape& shape,
                                               const std::vector<float>& q,
                                               const std::vector<float>& k,
                                               const std::vector<float>& v,
                                               const std::vector<float>& dout,
                                               float softmax_scale, bool causal);

// The contiguous cache (batch, max_seqlen, heads_k, headdim) of a paged one:
// pool (num_pages, page_size, heads_k, headdim); page_table (batch,
// max_pages) row-major; batch = seqlens.size(). Key j of sequence b is row
// j % page_size of page page_table[b * max_pages + j / page_size]; rows at
// and past seqlens[b] are zero (table entries past the length are not read).
std::vector<float> gather_pages(const std::vector<float>& pool, int page_size, int heads_k,
                                int headdim, const std::vector<int>& page_table, int max_pages,
                                const std::vector<int>& seqlens, int max_seqlen);

// x (batch, seqlen, heads, headdim); tables cos, sin (max_positions,
// rotary_dim / 2); rotary_dim even, 2 <= rotary_dim <= headdim.
struct RotaryShape {
  int batch = 1;
  int seqlen = 1;
  int heads = 1;
  int headdim = 2;
  int rotary_dim = 2;
};

// The standard tables: angle(pos, i) = pos * base^(-2i / rotary_dim).
struct RotaryTables {
  std::vector<double> cos, sin;
};
RotaryTables rotary_tables(int max_positions, int rotary_dim, double base = 10000.0);

// Row s of batch b sits at position position_offsets[b] + s. Each pair
// (x1, x2) with angle index i < rotary_dim / 2 becomes (x1 cos - x2 sin,
// x1 sin + x2 cos): pairs (i, i + rotary_dim / 2) (GPT-NeoX), or with
// `interleaved` (2i, 2i + 1) (GPT-J). Dimensions from rotary_dim on are
// copied. The float overload takes the tables the kernels read.
std::vector<double> apply_rotary(const RotaryShape& shape, const std::vector<float>& x,
                                 const std::vector<double>& cos, const std::vector<double>& sin,
                                 const std::vector<int>& position_offsets, bool interleaved);
std::vector<double> apply_rotary(const RotaryShape& shape, const std::vector<float>& x,
                                 const std::vector<float>& cos, const std::vector<float>& sin,
                                 const std::vector<int>& position_offsets, bool interleaved);

struct CombineShape {
  int num_splits = 1;
  int batch = 1;
  int seqlen = 1;
  int heads = 1;
  int headdim = 1;
};

// out_partial (num_splits, batch, seqlen, heads, headdim), lse_partial
// (num_splits, batch, heads, seqlen) to out (batch, seqlen, heads, headdim)
// and lse (batch, heads, seqlen): lse = log sum_s exp(lse_s), out = sum_s
// exp(lse_s - lse) out_s, the exponents taken relative to the largest lse_s
// for stability. A split with an infinite lse (it saw no key) adds nothing; a row no split saw a
// key for gets zeros and +inf. The float overload takes the kernels' partials.
Reference attention_combine(const CombineShape& shape, const std::vector<double>& out_partial,
                            const std::vector<double>& lse_partial);
Reference attention_combine(const CombineShape& shape, const std::vector<float>& out_partial,
                            const std::vector<float>& lse_partial);

}  // namespace flash3::ref
