// CPU attention forward for testing the kernels:
//  - attention_forward: float64 reference with log-sum-exp;
//  - attention_forward_plain: a plain fp16/bf16 implementation, unfused, as
//    PyTorch runs one (it sets the error the kernels are allowed, see below);
//  - check_output / check_lse: ARCHITECTURE.md's tolerance rule.
// Tensors are contiguous: q, k, v, out (batch, seqlen, heads, headdim); lse
// (batch, heads_q, seqlen_q). Work is spread over all hardware threads.
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

  size_t q_size() const;    // elements of q and of out
  size_t kv_size() const;   // elements of k and of v
  size_t lse_size() const;  // rows: batch * heads_q * seqlen_q
};

// How many keys query row `row` sees: all of them, or with `causal` those
// j <= row + seqlen_k - seqlen_q (the mask's bottom-right alignment).
int visible_keys(const Shape& shape, bool causal, int row);

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

// The same in `type` arithmetic, step by step: S = q k^T accumulated in fp32
// and rounded to `type`; scale and softmax in fp32, P rounded to `type`;
// out = P v accumulated in fp32 and rounded to `type`. Rows that see no key
// give zeros.
std::vector<float> attention_forward_plain(HalfType type, const Shape& shape,
                                           const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, float softmax_scale,
                                           bool causal);

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
Verdict check_lse(const std::vector<float>& kernel, const std::vector<double>& ref);

}  // namespace flash3::ref
