#include "reference/attention_ref.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace flash3::ref {
namespace {

// Query rows per unit of parallel work: enough tasks to fill every thread
// even for one long head.
constexpr int kRowsPerTask = 16;
// Independent partial sums in a dot product: faster than one chain, and an
// order as legitimate as a GEMM's blocked one.
constexpr int kDotLanes = 4;

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_sizes(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v) {
  if (s.heads_k < 1 || s.heads_q % s.heads_k != 0) {
    throw std::invalid_argument("flash3::ref: heads_q must be a multiple of heads_k");
  }
  if (q.size() != s.q_size() || k.size() != s.kv_size() || v.size() != s.kv_size()) {
    throw std::invalid_argument("flash3::ref: q, k or v does not match the shape");
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

// Calls row(b, h, i) for every query row i of every (batch b, query head h).
template <class RowFn>
void for_each_row(const Shape& s, const RowFn& row) {
  const size_t blocks = (s.seqlen_q + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(static_cast<size_t>(s.batch) * s.heads_q * blocks, [&](size_t t) {
    const int b = static_cast<int>(t / blocks / s.heads_q);
    const int h = static_cast<int>(t / blocks % s.heads_q);
    const int begin = static_cast<int>(t % blocks) * kRowsPerTask;
    const int end = std::min(begin + kRowsPerTask, s.seqlen_q);
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
};

// One query row in Acc arithmetic, with `round` applied where a plain
// implementation stores S, P and out in its own dtype. Writes out_row (zero
// beforehand) and returns the row's log-sum-exp.
template <class Acc, class Round>
Acc attend_row(const Problem& p, int b, int h, int i, Acc scale, const Round& round, Acc* out_row) {
  const Shape& s = p.shape;
  const int keys = visible_keys(s, p.causal, i);
  if (keys == 0) {
    return std::numeric_limits<Acc>::infinity();
  }
  const int kv_head = h / (s.heads_q / s.heads_k);
  const float* q_row = p.q + offset(b, i, h, s.seqlen_q, s.heads_q, s.headdim);
  std::vector<Acc> probs(keys);
  for (int j = 0; j < keys; ++j) {
    const float* k_row = p.k + offset(b, j, kv_head, s.seqlen_k, s.heads_k, s.headdim);
    probs[j] = scale * round(dot<Acc>(q_row, k_row, s.headdim));
  }
  const Acc row_max = *std::max_element(probs.begin(), probs.end());
  Acc sum = 0;
  for (Acc& x : probs) {
    x = std::exp(x - row_max);
    sum += x;
  }
  for (int j = 0; j < keys; ++j) {
    const Acc weight = round(probs[j] / sum);
    const float* v_row = p.v + offset(b, j, kv_head, s.seqlen_k, s.heads_k, s.headdim);
    for (int x = 0; x < s.headdim; ++x) {
      out_row[x] += weight * static_cast<Acc>(v_row[x]);
    }
  }
  for (int x = 0; x < s.headdim; ++x) {
    out_row[x] = round(out_row[x]);
  }
  return row_max + std::log(sum);
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

size_t Shape::lse_size() const { return static_cast<size_t>(batch) * heads_q * seqlen_q; }

int visible_keys(const Shape& shape, bool causal, int row) {
  if (!causal) {
    return shape.seqlen_k;
  }
  const int64_t last = int64_t{row} + shape.seqlen_k - shape.seqlen_q;
  return static_cast<int>(std::clamp<int64_t>(last + 1, 0, shape.seqlen_k));
}

Reference attention_forward(const Shape& shape, const std::vector<float>& q,
                            const std::vector<float>& k, const std::vector<float>& v,
                            double softmax_scale, bool causal) {
  check_sizes(shape, q, k, v);
  Reference r{std::vector<double>(shape.q_size()), std::vector<double>(shape.lse_size())};
  const Problem p{shape, q.data(), k.data(), v.data(), causal};
  const auto exact = [](double x) { return x; };
  for_each_row(shape, [&](int b, int h, int i) {
    double* out_row = &r.out[offset(b, i, h, shape.seqlen_q, shape.heads_q, shape.headdim)];
    const size_t lse_row = (static_cast<size_t>(b) * shape.heads_q + h) * shape.seqlen_q + i;
    r.lse[lse_row] = attend_row<double>(p, b, h, i, softmax_scale, exact, out_row);
  });
  return r;
}

std::vector<float> attention_forward_plain(HalfType type, const Shape& shape,
                                           const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, float softmax_scale,
                                           bool causal) {
  check_sizes(shape, q, k, v);
  std::vector<float> out(shape.q_size());
  const Problem p{shape, q.data(), k.data(), v.data(), causal};
  const auto to_type = [type](float x) { return round_to(type, x); };
  for_each_row(shape, [&](int b, int h, int i) {
    float* out_row = &out[offset(b, i, h, shape.seqlen_q, shape.heads_q, shape.headdim)];
    attend_row<float>(p, b, h, i, softmax_scale, to_type, out_row);
  });
  return out;
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
  const ErrorStats k = error_stats(kernel, ref);
  const ErrorStats p = error_stats(plain, ref);
  const double bound = kErrorFactor * p.max_abs + kOutAtol;
  std::ostringstream os;
  os << "out: |kernel - ref64| " << format_error_stats(k) << " (kernel " << kernel[k.worst]
     << ", ref64 " << ref[k.worst] << "); |plain - ref64| " << format_error_stats(p) << "; bound "
     << kErrorFactor << " * " << p.max_abs << " + " << kOutAtol << " = " << bound;
  return Verdict{k.non_finite == 0 && p.non_finite == 0 && k.max_abs <= bound, os.str()};
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
