// CPU attention forward and backward for testing the kernels:
//  - attention_forward / attention_backward: float64 references (the forward
//    with log-sum-exp);
//  - attention_forward_plain / attention_backward_plain: a plain fp16/bf16
//    implementation, unfused, as PyTorch runs one (it sets the error the
//    kernels are allowed, see below);
//  - check_output / check_lse / check_gradient: ARCHITECTURE.md's tolerance rule.
// Tensors are contiguous: q, k, v, out, dout and the gradients (batch,
// seqlen, heads, headdim); lse (batch, heads_q, seqlen_q). Work is spread
// over all hardware threads.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "reference/half.hpp"

namespace flash3::ref {

struct Shape {
  int batch = 1;
  int seqlen_q = 1;
  int seqlen_k = 1;
  int heads_q = 1;
  int heads_k = 1;
  int headdim = 1;
  int headdim_v = 0;  // of v, out, dout and dv; 0: headdim

  int dv() const { return headdim_v > 0 ? headdim_v : headdim; }
  size_t q_size() const;    // elements of q (and of out, dout with dv() == headdim)
  size_t kv_size() const;   // elements of k (and of v with dv() == headdim)
  size_t out_size() const;  // elements of out: q's rows of dv()
  size_t v_size() const;    // elements of v: k's rows of dv()
  size_t lse_size() const;  // rows: batch * heads_q * seqlen_q
};

// How many keys query row `row` sees: all of them, or with `causal` those
// j <= row + seqlen_k - seqlen_q (the mask's bottom-right alignment).
int visible_keys(const Shape& shape, bool causal, int row);

// The attention variants of issue 25, with FlashAttention's semantics, for
// the overloads below that take one (the others: Variant{}):
//  - window_left / window_right: query row i sees keys j with
//    i + o - window_left <= j <= i + o + window_right, o = seqlen_k -
//    seqlen_q (bottom-right aligned, as the causal mask); -1 leaves that
//    side unbounded. With causal the tighter right limit holds.
//  - softcap > 0: every scaled score s becomes softcap * tanh(s / softcap).
//  - sinks (empty, or heads_q values): a row of query head h has one more
//    logit, sinks[h], that takes probability but adds no value (gpt-oss's
//    learnable sinks); the log-sum-exp includes it, so a row that sees no
//    key has lse sinks[h] and a zero out row.
//  - attention_chunk > 0 (Llama 4's chunked attention, FlashAttention-3's
//    attention_chunk): a row sees only the keys of its diagonal's chunk,
//    [c, c + attention_chunk) with c = floor(d / attention_chunk) *
//    attention_chunk, d = i + o; with the window and causal limits too.
struct Variant {
  int window_left = -1;
  int window_right = -1;
  double softcap = 0.0;
  std::vector<float> sinks;
  int attention_chunk = 0;
};

// The keys [first, end) query row `row` sees (first == end: none).
struct KeyRange {
  int first = 0;
  int end = 0;
};
KeyRange visible_key_range(const Shape& shape, bool causal, const Variant& variant, int row);

struct Reference {
  std::vector<double> out;
  // Natural log; +inf for a row that sees no key (its out row is zero).
  std::vector<double> lse;
};

// softmax(scale * q k^T [causal]) v in float64, per head; query head h reads
// kv head h / (heads_q / heads_k). Inputs are the kernels' fp16/bf16 values.
Reference attention_forward(const Shape& shape, const std::vector<float>& q,
                            const std::vector<float>& k, const std::vector<float>& v,
                            double softmax_scale, bool causal);
Reference attention_forward(const Shape& shape, const std::vector<float>& q,
                            const std::vector<float>& k, const std::vector<float>& v,
                            double softmax_scale, bool causal, const Variant& variant);

// The same in `type` arithmetic, step by step: S = q k^T accumulated in fp32
// and rounded to `type`; scale and softmax in fp32, P rounded to `type`;
// out = P v accumulated in fp32 and rounded to `type`. Rows that see no key
// give zeros.
std::vector<float> attention_forward_plain(HalfType type, const Shape& shape,
                                           const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, float softmax_scale,
                                           bool causal);
std::vector<float> attention_forward_plain(HalfType type, const Shape& shape,
                                           const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, float softmax_scale,
                                           bool causal, const Variant& variant);

// Gradients of out = softmax(scale * q k^T [causal]) v, given dout (shaped
// like out), in float64: with P the softmax and D_i = dout_i . out_i,
// dv = P^T dout, dS = P * (dout v^T - D), dq = scale * dS k,
// dk = scale * dS^T q. A kv head's dk and dv sum over the query heads that
// read it. Rows that see no key get zero dq and give nothing to dk, dv.
// Variants: softcap multiplies dS by 1 - tanh^2 of the capped score; with
// sinks, dsinks[h] = -sum over the rows of head h of P_sink D (the sink's
// probability times D_i), heads_q values (empty without sinks).
struct Gradients {
  std::vector<double> dq, dk, dv, dsinks;
};

Gradients attention_backward(const Shape& shape, const std::vector<float>& q,
                             const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& dout, double softmax_scale, bool causal);
Gradients attention_backward(const Shape& shape, const std::vector<float>& q,
                             const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& dout, double softmax_scale, bool causal,
                             const Variant& variant);

// The same as autograd through attention_forward_plain would give it in
// `type`: P and out recomputed as there; dv = P^T dout and dP = dout v^T
// accumulated in fp32 and rounded to `type`; dS = scale * P * (dP - D) in
// fp32 (D = dout . out, from the rounded out) and rounded; dq = dS k and
// dk = dS^T q accumulated in fp32 (dk, dv over the whole group of query
// heads) and rounded.
struct PlainGradients {
  std::vector<float> dq, dk, dv, dsinks;
};

PlainGradients attention_backward_plain(HalfType type, const Shape& shape,
                                        const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const std::vector<float>& dout,
                                        float softmax_scale, bool causal);
PlainGradients attention_backward_plain(HalfType type, const Shape& shape,
                                        const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const std::vector<float>& dout,
                                        float softmax_scale, bool causal, const Variant& variant);

struct ErrorStats {
  double max_abs = 0.0;   // +inf when any value is not finite
  double mean_abs = 0.0;  // over the finite values
  double rms = 0.0;       // over the finite values
  size_t worst = 0;       // index of the largest error
  size_t non_finite = 0;
};

ErrorStats error_stats(const std::vector<float>& got, const std::vector<double>& want);

// The tolerance rule: max|kernel - ref64| <= kErrorFactor * max|plain - ref64|
// + kOutAtol, every kernel value finite.
inline constexpr double kErrorFactor = 2.0;
inline constexpr double kOutAtol = 1e-5;
// Gradients, unlike out, are not bounded by |v|: of N(0, 1) inputs they are
// about 0.4 to 7 at 64-1024 rows (larger causal, where early keys collect
// many rows). fp32 accumulation of such sums (the kernels' dq across key
// blocks, dk and dv across a GQA group) errs by ~1e-5, ten times less than
// kGradAtol; a plain implementation errs by 4e-4 (fp16) to 3e-2 (bf16)
// there, so the atol only counts where the plain result is exact (e.g.
// all-zero dout).
inline constexpr double kGradAtol = 1e-4;
// LSE: the kernels keep scores and row sums in fp32 (error ~1e-6), so a row
// passes within kLseAtol + kLseRtol * |lse|; a fully masked row must be +inf.
// A plain fp16/bf16 implementation has no LSE to compare with.
inline constexpr double kLseAtol = 1e-4;
inline constexpr double kLseRtol = 1e-5;

struct Verdict {
  bool ok = false;
  std::string message;  // the figures behind the verdict, pass or fail
};

Verdict check_output(const std::vector<float>& kernel, const std::vector<float>& plain,
                     const std::vector<double>& ref);
// The rule of check_output for one gradient tensor, `name` (dq, dk or dv),
// with kGradAtol for kOutAtol.
Verdict check_gradient(const char* name, const std::vector<float>& kernel,
                       const std::vector<float>& plain, const std::vector<double>& ref);
Verdict check_lse(const std::vector<float>& kernel, const std::vector<double>& ref);

}  // namespace flash3::ref
