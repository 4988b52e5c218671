#include "reference/attention_ref.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

namespace flash3::ref {
namespace {

// Query rows per unit of parallel work: enough tasks to fill every thread
// even for one long head.
constexpr int kRowsPerTask = 16;
// Independent partial sums in a dot product: faster than one chain, and an
// order as legitimate as a GEMM's blocked one.
constexpr int kDotLanes = 4;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The float64 reference's `round`: none.
double exact(double x) { return x; }

void check_sizes(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v) {
  if (s.heads_k < 1 || s.heads_q % s.heads_k != 0) {
    throw std::invalid_argument("flash3::ref: heads_q must be a multiple of heads_k");
  }
  if (q.size() != s.q_size() || k.size() != s.kv_size() || v.size() != s.v_size()) {
    throw std::invalid_argument("flash3::ref: q, k or v does not match the shape");
  }
}

// ... and the variant's: sinks empty or one per query head, windows from -1.
void check_sizes(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v, const Variant& variant) {
  check_sizes(s, q, k, v);
  if (!variant.sinks.empty() && variant.sinks.size() != static_cast<size_t>(s.heads_q)) {
    throw std::invalid_argument("flash3::ref: sinks must hold heads_q values");
  }
  if (variant.window_left < -1 || variant.window_right < -1) {
    throw std::invalid_argument("flash3::ref: window sizes are -1 (unbounded) or more");
  }
  if (variant.attention_chunk < 0) {
    throw std::invalid_argument("flash3::ref: attention_chunk is 0 (none) or more");
  }
}

void check_sizes(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v, const std::vector<float>& dout) {
  check_sizes(s, q, k, v);
  if (dout.size() != s.out_size()) {
    throw std::invalid_argument("flash3::ref: dout does not match the shape");
  }
}

// Runs task(0) ... task(tasks - 1) on all hardware threads.
void parallel_for(size_t tasks, const std::function<void(size_t)>& task) {
  const size_t threads = std::min<size_t>(tasks, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t t = next++; t < tasks; t = next++) {
      task(t);
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) {
    pool.emplace_back(work);
  }
  work();
  for (std::thread& thread : pool) {
    thread.join();
  }
}

// Calls row(b, h, i) for every row i < rows of every (batch b < batch, head h < heads).
template <class RowFn>
void for_each_row(int batch, int heads, int rows, const RowFn& row) {
  const size_t blocks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(static_cast<size_t>(batch) * heads * blocks, [&](size_t t) {
    const int b = static_cast<int>(t / blocks / heads);
    const int h = static_cast<int>(t / blocks % heads);
    const int begin = static_cast<int>(t % blocks) * kRowsPerTask;
    const int end = std::min(begin + kRowsPerTask, rows);
    for (int i = begin; i < end; ++i) {
      row(b, h, i);
    }
  });
}

// Element offset of (b, i, h, 0) in a contiguous (batch, seqlen, heads, headdim) tensor.
size_t offset(int b, int i, int h, int seqlen, int heads, int headdim) {
  return ((static_cast<size_t>(b) * seqlen + i) * heads + h) * headdim;
}

template <class Acc>
Acc dot(const float* a, const float* b, int n) {
  Acc lanes[kDotLanes] = {};
  int x = 0;
  for (; x + kDotLanes <= n; x += kDotLanes) {
    for (int l = 0; l < kDotLanes; ++l) {
      lanes[l] += static_cast<Acc>(a[x + l]) * static_cast<Acc>(b[x + l]);
    }
  }
  for (; x < n; ++x) {
    lanes[0] += static_cast<Acc>(a[x]) * static_cast<Acc>(b[x]);
  }
  Acc total = 0;
  for (const Acc lane : lanes) {
    total += lane;
  }
  return total;
}

struct Problem {
  const Shape& shape;
  const float* q;
  const float* k;
  const float* v;
  bool causal;
  const Variant& variant;

  int kv_head(int h) const { return h / (shape.heads_q / shape.heads_k); }
  KeyRange keys(int i) const { return visible_key_range(shape, causal, variant, i); }
  bool has_sinks() const { return !variant.sinks.empty(); }
  // Row i of query head h (q, dout; out) and row j of kv head `kv` (k; v) in batch b.
  size_t q_offset(int b, int i, int h) const {
    return offset(b, i, h, shape.seqlen_q, shape.heads_q, shape.headdim);
  }
  size_t kv_offset(int b, int j, int kv) const {
    return offset(b, j, kv, shape.seqlen_k, shape.heads_k, shape.headdim);
  }
  size_t out_offset(int b, int i, int h) const {
    return offset(b, i, h, shape.seqlen_q, shape.heads_q, shape.dv());
  }
  size_t v_offset(int b, int j, int kv) const {
    return offset(b, j, kv, shape.seqlen_k, shape.heads_k, shape.dv());
  }
};

// A query row's softmax, P_j = exp(score_j - max) / sum; the backward keeps
// it to recompute the very P of the forward.
template <class Acc>
struct RowSoftmax {
  Acc max = 0;
  Acc sum = 0;  // zero for a row that sees no key

  Acc lse() const { return sum == 0 ? std::numeric_limits<Acc>::infinity() : max + std::log(sum); }
};

// scale * q_i . k_j, rounded where a plain implementation stores S; with
// softcap c, c * tanh(that / c) (rounded again), and the tanh for the
// backward's 1 - tanh^2 (0 without softcap).
template <class Acc>
struct Score {
  Acc value;
  Acc tanh;
};
template <class Acc, class Round>
Score<Acc> score(const Problem& p, int b, int h, int i, int j, Acc scale, const Round& round) {
  const Acc s = scale * round(dot<Acc>(p.q + p.q_offset(b, i, h),
                                       p.k + p.kv_offset(b, j, p.kv_head(h)), p.shape.headdim));
  if (p.variant.softcap <= 0) {
    return {s, 0};
  }
  const Acc cap = static_cast<Acc>(p.variant.softcap);
  const Acc t = std::tanh(s / cap);
  return {round(cap * t), t};
}

// One query row in Acc arithmetic, with `round` applied where a plain
// implementation stores S, P and out in its own dtype. Writes out_row (zero
// beforehand) and returns the row's softmax.
template <class Acc, class Round>
RowSoftmax<Acc> attend_row(const Problem& p, int b, int h, int i, Acc scale, const Round& round,
                           Acc* out_row) {
  const KeyRange keys = p.keys(i);
  if (keys.first == keys.end && !p.has_sinks()) {
    return {};
  }
  std::vector<Acc> probs(keys.end - keys.first);
  for (int j = keys.first; j < keys.end; ++j) {
    probs[j - keys.first] = score(p, b, h, i, j, scale, round).value;
  }
  // The sink's logit joins the softmax (its exp in the sum) but adds no value.
  const Acc sink = p.has_sinks() ? static_cast<Acc>(p.variant.sinks[h])
                                 : -std::numeric_limits<Acc>::infinity();
  RowSoftmax<Acc> softmax{sink};
  for (const Acc x : probs) {
    softmax.max = std::max(softmax.max, x);
  }
  for (Acc& x : probs) {
    x = std::exp(x - softmax.max);
    softmax.sum += x;
  }
  if (p.has_sinks()) {
    softmax.sum += std::exp(sink - softmax.max);
  }
  for (int j = keys.first; j < keys.end; ++j) {
    const Acc weight = round(probs[j - keys.first] / softmax.sum);
    const float* v_row = p.v + p.v_offset(b, j, p.kv_head(h));
    for (int x = 0; x < p.shape.dv(); ++x) {
      out_row[x] += weight * static_cast<Acc>(v_row[x]);
    }
  }
  for (int x = 0; x < p.shape.dv(); ++x) {
    out_row[x] = round(out_row[x]);
  }
  return softmax;
}

// The backward in Acc arithmetic, rounded as attend_row is, plus dP and dS
// stored in the plain dtype, and dq, dk, dv at the end. Two passes that
// each write rows of their own: per query row (the forward again, for its
// softmax and D = dout . out; then dq), and per key row of each kv head (dk
// and dv, summed over the query rows that see the key in every query head
// of the group).
template <class Grads, class Acc, class Round>
Grads backward(const Problem& p, const std::vector<float>& dout, Acc scale, const Round& round) {
  const Shape& s = p.shape;
  const int d = s.headdim, dv_dim = s.dv();  // q, k, dq, dk; v, out, dout, dv
  Grads g{std::vector<Acc>(s.q_size()), std::vector<Acc>(s.kv_size()),
          std::vector<Acc>(s.v_size())};
  std::vector<RowSoftmax<Acc>> softmax(s.lse_size());
  std::vector<Acc> delta(s.lse_size());
  const auto row = [&s](int b, int h, int i) {
    return (static_cast<size_t>(b) * s.heads_q + h) * s.seqlen_q + i;
  };
  // P_ij and scale * dS_ij = scale * P_ij (dP_ij - D_i), dP_ij = dout_i . v_j
  // (with softcap times 1 - tanh^2, the capped score's derivative).
  const auto p_and_ds = [&](int b, int h, int i, int j) {
    const RowSoftmax<Acc>& sm = softmax[row(b, h, i)];
    const Score<Acc> sc = score(p, b, h, i, j, scale, round);
    const Acc prob = round(std::exp(sc.value - sm.max) / sm.sum);
    const float* v_row = p.v + p.v_offset(b, j, p.kv_head(h));
    const Acc dp = round(dot<Acc>(&dout[p.out_offset(b, i, h)], v_row, dv_dim));
    Acc ds = scale * prob * (dp - delta[row(b, h, i)]);
    if (p.variant.softcap > 0) {
      ds *= 1 - sc.tanh * sc.tanh;
    }
    return std::pair<Acc, Acc>{prob, round(ds)};
  };
  // Each row's share of its head's dsinks: -P_sink D (sinks only).
  std::vector<Acc> sink_share(p.has_sinks() ? s.lse_size() : 0);
  for_each_row(s.batch, s.heads_q, s.seqlen_q, [&](int b, int h, int i) {
    std::vector<Acc> out(dv_dim);
    softmax[row(b, h, i)] = attend_row<Acc>(p, b, h, i, scale, round, out.data());
    const float* dout_row = &dout[p.out_offset(b, i, h)];
    Acc& row_delta = delta[row(b, h, i)];
    for (int x = 0; x < dv_dim; ++x) {
      row_delta += static_cast<Acc>(dout_row[x]) * out[x];
    }
    if (p.has_sinks()) {
      const RowSoftmax<Acc>& sm = softmax[row(b, h, i)];
      sink_share[row(b, h, i)] =
          -std::exp(static_cast<Acc>(p.variant.sinks[h]) - sm.max) / sm.sum * row_delta;
    }
    Acc* dq = &g.dq[p.q_offset(b, i, h)];
    const KeyRange keys = p.keys(i);
    for (int j = keys.first; j < keys.end; ++j) {
      const Acc ds = p_and_ds(b, h, i, j).second;
      const float* k_row = p.k + p.kv_offset(b, j, p.kv_head(h));
      for (int x = 0; x < d; ++x) {
        dq[x] += ds * static_cast<Acc>(k_row[x]);
      }
    }
    for (int x = 0; x < d; ++x) {
      dq[x] = round(dq[x]);
    }
  });
  const int group = s.heads_q / s.heads_k;
  for_each_row(s.batch, s.heads_k, s.seqlen_k, [&](int b, int kv, int j) {
    Acc* dk = &g.dk[p.kv_offset(b, j, kv)];
    Acc* dv = &g.dv[p.v_offset(b, j, kv)];
    for (int h = kv * group; h < (kv + 1) * group; ++h) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        const KeyRange keys = p.keys(i);
        if (j < keys.first || j >= keys.end) {
          continue;
        }
        const auto [prob, ds] = p_and_ds(b, h, i, j);
        const float* q_row = p.q + p.q_offset(b, i, h);
        const float* dout_row = &dout[p.out_offset(b, i, h)];
        for (int x = 0; x < dv_dim; ++x) {
          dv[x] += prob * static_cast<Acc>(dout_row[x]);
        }
        for (int x = 0; x < d; ++x) {
          dk[x] += ds * static_cast<Acc>(q_row[x]);
        }
      }
    }
    for (int x = 0; x < d; ++x) {
      dk[x] = round(dk[x]);
    }
    for (int x = 0; x < dv_dim; ++x) {
      dv[x] = round(dv[x]);
    }
  });
  if (p.has_sinks()) {
    g.dsinks.assign(s.heads_q, 0);
    for (int b = 0; b < s.batch; ++b) {
      for (int h = 0; h < s.heads_q; ++h) {
        for (int i = 0; i < s.seqlen_q; ++i) {
          g.dsinks[h] += sink_share[row(b, h, i)];
        }
      }
    }
    for (Acc& x : g.dsinks) {
      x = round(x);
    }
  }
  return g;
}

std::string format_error_stats(const ErrorStats& e) {
  std::ostringstream os;
  os << "max " << e.max_abs << " at element " << e.worst << ", mean " << e.mean_abs << ", rms "
     << e.rms;
  if (e.non_finite != 0) {
    os << ", " << e.non_finite << " values not finite";
  }
  return os.str();
}

// The tolerance rule for tensor `name`: max|kernel - ref64| <= kErrorFactor
// * max|plain - ref64| + atol, every value finite.
Verdict check_against_plain(const char* name, double atol, const std::vector<float>& kernel,
                            const std::vector<float>& plain, const std::vector<double>& ref) {
  const ErrorStats k = error_stats(kernel, ref);
  const ErrorStats p = error_stats(plain, ref);
  const double bound = kErrorFactor * p.max_abs + atol;
  std::ostringstream os;
  os << name << ": |kernel - ref64| " << format_error_stats(k) << " (kernel " << kernel[k.worst]
     << ", ref64 " << ref[k.worst] << "); |plain - ref64| " << format_error_stats(p) << "; bound "
     << kErrorFactor << " * " << p.max_abs << " + " << atol << " = " << bound;
  return Verdict{k.non_finite == 0 && p.non_finite == 0 && k.max_abs <= bound, os.str()};
}

// How far a kernel LSE lies beyond its tolerance (> 0: fails). A fully
// masked row must be +inf exactly; a NaN always fails.
double lse_excess(float kernel, double ref) {
  if (std::isinf(ref)) {
    return static_cast<double>(kernel) == ref ? 0.0 : kInf;
  }
  const double excess = std::fabs(kernel - ref) - (kLseAtol + kLseRtol * std::fabs(ref));
  return std::isnan(excess) ? kInf : excess;
}

}  // namespace

size_t Shape::q_size() const { return static_cast<size_t>(batch) * seqlen_q * heads_q * headdim; }

size_t Shape::kv_size() const { return static_cast<size_t>(batch) * seqlen_k * heads_k * headdim; }

size_t Shape::out_size() const { return static_cast<size_t>(batch) * seqlen_q * heads_q * dv(); }

size_t Shape::v_size() const { return static_cast<size_t>(batch) * seqlen_k * heads_k * dv(); }

size_t Shape::lse_size() const { return static_cast<size_t>(batch) * heads_q * seqlen_q; }

int visible_keys(const Shape& shape, bool causal, int row) {
  return visible_key_range(shape, causal, Variant{}, row).end;
}

KeyRange visible_key_range(const Shape& shape, bool causal, const Variant& variant, int row) {
  const int64_t diagonal = int64_t{row} + shape.seqlen_k - shape.seqlen_q;
  int64_t first = 0, last = shape.seqlen_k - 1;
  if (variant.window_left >= 0) {
    first = std::max(first, diagonal - variant.window_left);
  }
  if (causal) {
    last = std::min(last, diagonal);
  }
  if (variant.window_right >= 0) {
    last = std::min(last, diagonal + variant.window_right);
  }
  if (variant.attention_chunk > 0) {
    const int64_t chunk = variant.attention_chunk;
    const int64_t start = (diagonal >= 0 ? diagonal / chunk : -((-diagonal + chunk - 1) / chunk)) * chunk;
    first = std::max(first, start);
    last = std::min(last, start + chunk - 1);
  }
  const int64_t end = std::clamp<int64_t>(last + 1, 0, shape.seqlen_k);
  return {static_cast<int>(std::clamp<int64_t>(first, 0, end)), static_cast<int>(end)};
}

Reference attention_forward(const Shape& shape, const std::vector<float>& q,
                            const std::vector<float>& k, const std::vector<float>& v,
                            double softmax_scale, bool causal) {
  return attention_forward(shape, q, k, v, softmax_scale, causal, Variant{});
}

Reference attention_forward(const Shape& shape, const std::vector<float>& q,
                            const std::vector<float>& k, const std::vector<float>& v,
                            double softmax_scale, bool causal, const Variant& variant) {
  check_sizes(shape, q, k, v, variant);
  Reference r{std::vector<double>(shape.out_size()), std::vector<double>(shape.lse_size())};
  const Problem p{shape, q.data(), k.data(), v.data(), causal, variant};
  for_each_row(shape.batch, shape.heads_q, shape.seqlen_q, [&](int b, int h, int i) {
    const size_t lse_row = (static_cast<size_t>(b) * shape.heads_q + h) * shape.seqlen_q + i;
    r.lse[lse_row] =
        attend_row<double>(p, b, h, i, softmax_scale, exact, &r.out[p.out_offset(b, i, h)]).lse();
  });
  return r;
}

std::vector<float> attention_forward_plain(HalfType type, const Shape& shape,
                                           const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, float softmax_scale,
                                           bool causal) {
  return attention_forward_plain(type, shape, q, k, v, softmax_scale, causal, Variant{});
}

std::vector<float> attention_forward_plain(HalfType type, const Shape& shape,
                                           const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, float softmax_scale,
                                           bool causal, const Variant& variant) {
  check_sizes(shape, q, k, v, variant);
  std::vector<float> out(shape.out_size());
  const Problem p{shape, q.data(), k.data(), v.data(), causal, variant};
  const auto to_type = [type](float x) { return round_to(type, x); };
  for_each_row(shape.batch, shape.heads_q, shape.seqlen_q, [&](int b, int h, int i) {
    attend_row<float>(p, b, h, i, softmax_scale, to_type, &out[p.out_offset(b, i, h)]);
  });
  return out;
}

Gradients attention_backward(const Shape& shape, const std::vector<float>& q,
                             const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& dout, double softmax_scale, bool causal) {
  return attention_backward(shape, q, k, v, dout, softmax_scale, causal, Variant{});
}

Gradients attention_backward(const Shape& shape, const std::vector<float>& q,
                             const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& dout, double softmax_scale, bool causal,
                             const Variant& variant) {
  check_sizes(shape, q, k, v, dout);
  check_sizes(shape, q, k, v, variant);
  const Problem p{shape, q.data(), k.data(), v.data(), causal, variant};
  return backward<Gradients>(p, dout, softmax_scale, exact);
}

PlainGradients attention_backward_plain(HalfType type, const Shape& shape,
                                        const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const std::vector<float>& dout,
                                        float softmax_scale, bool causal) {
  return attention_backward_plain(type, shape, q, k, v, dout, softmax_scale, causal, Variant{});
}

PlainGradients attention_backward_plain(HalfType type, const Shape& shape,
                                        const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, const std::vector<float>& dout,
                                        float softmax_scale, bool causal, const Variant& variant) {
  check_sizes(shape, q, k, v, dout);
  check_sizes(shape, q, k, v, variant);
  const Problem p{shape, q.data(), k.data(), v.data(), causal, variant};
  const auto to_type = [type](float x) { return round_to(type, x); };
  return backward<PlainGradients>(p, dout, softmax_scale, to_type);
}

ErrorStats error_stats(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) {
    throw std::invalid_argument("flash3::ref::error_stats: sizes differ");
  }
  ErrorStats e;
  double sum = 0.0, sum_squares = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isfinite(err)) {
      ++e.non_finite;
      err = kInf;
    } else {
      sum += err;
      sum_squares += err * err;
    }
    if (err > e.max_abs) {
      e.max_abs = err;
      e.worst = i;
    }
  }
  const size_t finite = got.size() - e.non_finite;
  if (finite != 0) {
    e.mean_abs = sum / finite;
    e.rms = std::sqrt(sum_squares / finite);
  }
  return e;
}

Verdict check_output(const std::vector<float>& kernel, const std::vector<float>& plain,
                     const std::vector<double>& ref) {
  return check_against_plain("out", kOutAtol, kernel, plain, ref);
}

Verdict check_gradient(const char* name, const std::vector<float>& kernel,
                       const std::vector<float>& plain, const std::vector<double>& ref) {
  return check_against_plain(name, kGradAtol, kernel, plain, ref);
}

Verdict check_lse(const std::vector<float>& kernel, const std::vector<double>& ref) {
  if (kernel.size() != ref.size()) {
    throw std::invalid_argument("flash3::ref::check_lse: sizes differ");
  }
  size_t bad = 0, worst = 0;
  double worst_excess = -kInf;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double excess = lse_excess(kernel[i], ref[i]);
    if (excess > 0.0) {
      ++bad;
    }
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream os;
  os << "lse: " << bad << " of " << ref.size() << " rows off by more than " << kLseAtol << " + "
     << kLseRtol << " * |ref64|; worst row " << worst << ": kernel " << kernel[worst] << ", ref64 "
     << ref[worst];
  return Verdict{bad == 0, os.str()};
}

}  // namespace flash3::ref
