#include "reference/fp8.hpp"

#include "flash3/flash3.hpp"  // kFp8VKeyGroup, kFp8VKeyOrder
#include "src/sm90/fp8/prob_offset.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <thread>

namespace flash3::ref {
namespace {

constexpr float kLog2e = 1.4426950408889634f;  // the kernels' softmax constant
constexpr float kUnitScale = 1.0f;             // the scale of an all-zero group

// Calls row(b, i, h, at) for every row of a tensor in memory order, `at`
// the element offset of (b, i, h, 0).
template <class RowFn>
void for_each_tensor_row(const TensorDims& d, const RowFn& row) {
  size_t at = 0;
  for (int b = 0; b < d.batch; ++b) {
    for (int i = 0; i < d.seqlen; ++i) {
      for (int h = 0; h < d.heads; ++h) {
        row(b, i, h, at);
        at += d.headdim;
      }
    }
  }
}

size_t row_offset(const TensorDims& d, int b, int i, int h) {
  return ((static_cast<size_t>(b) * d.seqlen + i) * d.heads + h) * d.headdim;
}

int blocks_per_head(const TensorDims& d, int block_rows) {
  return (d.seqlen + block_rows - 1) / block_rows;
}

size_t scale_count(const TensorDims& d, int block_rows) {
  return block_rows == kPerTensor
             ? 1
             : static_cast<size_t>(d.batch) * d.heads * blocks_per_head(d, block_rows);
}

// The butterflies of walsh_hadamard, without its 1 / sqrt(d).
template <class T>
void butterflies(T* row, int d) {
  for (int h = 1; h < d; h *= 2) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const T a = row[j];
        const T b = row[j + h];
        row[j] = a + b;
        row[j + h] = a - b;
      }
    }
  }
}

// walsh_hadamard's normalisation, 1 / sqrt(d) rounded to T (quantize_e4m3
// applies it with the scale instead).
template <class T>
T hadamard_norm(int d) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
}

template <class T>
void normalise(T* row, int d) {
  const T norm = hadamard_norm<T>(d);
  for (int j = 0; j < d; ++j) {
    row[j] *= norm;
  }
}

// randomized_hadamard without its normalisation: the sign flips, then the
// butterflies.
template <class T>
void randomized_butterflies(T* row, int d, uint64_t seed) {
  for (int j = 0; j < d; ++j) {
    row[j] *= hadamard_sign(seed, j);
  }
  butterflies(row, d);
}

template <class T>
bool walsh_hadamard_impl(T* row, int d) {
  if (!is_hadamard_dim(d)) {
    return false;
  }
  butterflies(row, d);
  normalise(row, d);
  return true;
}

template <class T>
bool randomized_hadamard_impl(T* row, int d, uint64_t seed) {
  if (!is_hadamard_dim(d)) {
    return false;
  }
  randomized_butterflies(row, d, seed);
  normalise(row, d);
  return true;
}

bool matches(const Fp8Tensor& t, const TensorDims& dims) {
  return t.dims == dims && t.data.size() == dims.size() &&
         t.descale.size() == scale_count(dims, t.block_rows);
}

void check_fp8_inputs(const Shape& s, const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v) {
  if (s.heads_k < 1 || s.heads_q % s.heads_k != 0) {
    throw std::invalid_argument("flash3::ref: heads_q must be a multiple of heads_k");
  }
  const TensorDims kv_dims{s.batch, s.seqlen_k, s.heads_k, s.headdim};
  if (!matches(q, {s.batch, s.seqlen_q, s.heads_q, s.headdim}) || !matches(k, kv_dims) ||
      !matches(v, kv_dims)) {
    throw std::invalid_argument("flash3::ref: q, k or v does not match the shape");
  }
}

std::vector<float> code_values(const Fp8Tensor& t) {
  std::vector<float> values(t.data.size());
  std::transform(t.data.begin(), t.data.end(), values.begin(), e4m3_to_float);
  return values;
}

double dot(const float* a, const float* b, int n) {
  double total = 0;
  for (int x = 0; x < n; ++x) {
    total += static_cast<double>(a[x]) * b[x];
  }
  return total;
}

constexpr float kFp8ProbOffsetLog2 = static_cast<float>(fp8::kFp8ProbOffsetLog2);

struct Fp8Problem {
  const Shape& shape;
  const Fp8Tensor& q;
  const Fp8Tensor& k;
  const Fp8Tensor& v;
  std::vector<float> q_codes, k_codes, v_codes;  // e4m3 values before the descales
  float scale_log2;
  bool causal;
};

// One query row of attention_forward_fp8 (see fp8.hpp) into out_row (zero beforehand).
void attend_row_fp8(const Fp8Problem& p, HalfType out_type, int b, int h, int i, float* out_row) {
  const Shape& s = p.shape;
  const int keys = visible_keys(s, p.causal, i);
  if (keys == 0) {
    return;
  }
  const int kv_head = h / (s.heads_q / s.heads_k);
  const float* q_row = &p.q_codes[row_offset(p.q.dims, b, i, h)];
  const float dq = p.q.descale_at(b, i, h);
  std::vector<float> scores(keys);
  for (int j = 0; j < keys; ++j) {
    const float* k_row = &p.k_codes[row_offset(p.k.dims, b, j, kv_head)];
    const float descale = dq * p.k.descale_at(b, j, kv_head);
    scores[j] = static_cast<float>(dot(q_row, k_row, s.headdim)) * descale;
  }
  const float max_scaled = *std::max_element(scores.begin(), scores.end()) * p.scale_log2;
  double sum = 0;
  std::vector<double> acc(s.headdim, 0.0);
  for (int j = 0; j < keys; ++j) {
    const float prob = std::exp2(std::fma(scores[j], p.scale_log2, kFp8ProbOffsetLog2 - max_scaled));
    sum += prob;
    const double weight = static_cast<double>(round_to_e4m3(prob)) * p.v.descale_at(b, j, kv_head);
    const float* v_row = &p.v_codes[row_offset(p.v.dims, b, j, kv_head)];
    for (int x = 0; x < s.headdim; ++x) {
      acc[x] += weight * v_row[x];
    }
  }
  const float inv_sum = 1.0f / static_cast<float>(sum);
  for (int x = 0; x < s.headdim; ++x) {
    out_row[x] = round_to(out_type, static_cast<float>(acc[x]) * inv_sum);
  }
}

// N(0, 1) plus, with probability kOutlierProbability, N(0, kOutlierStd^2); rounded to bf16.
std::vector<float> outlier_normal(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::normal_distribution<double> outlier_term(0.0, kOutlierStd);
  std::bernoulli_distribution outlier(kOutlierProbability);
  std::vector<float> x(n);
  for (float& value : x) {
    const double sample = normal(rng);
    const double extra = outlier(rng) ? outlier_term(rng) : 0.0;
    value = round_to(HalfType::kBFloat16, static_cast<float>(sample + extra));
  }
  return x;
}

}  // namespace

bool is_hadamard_dim(int d) {
  return d >= kHadamardMinDim && d <= kHadamardMaxDim && (d & (d - 1)) == 0;
}

bool walsh_hadamard(float* row, int d) { return walsh_hadamard_impl(row, d); }
bool walsh_hadamard(double* row, int d) { return walsh_hadamard_impl(row, d); }

bool randomized_hadamard(float* row, int d, uint64_t seed) {
  return randomized_hadamard_impl(row, d, seed);
}
bool randomized_hadamard(double* row, int d, uint64_t seed) {
  return randomized_hadamard_impl(row, d, seed);
}

size_t TensorDims::size() const { return static_cast<size_t>(batch) * seqlen * heads * headdim; }

bool TensorDims::operator==(const TensorDims& o) const {
  return batch == o.batch && seqlen == o.seqlen && heads == o.heads && headdim == o.headdim;
}

size_t Fp8Tensor::scale_index(int b, int row, int h) const {
  if (block_rows == kPerTensor) {
    return 0;
  }
  return (static_cast<size_t>(b) * dims.heads + h) * blocks_per_head(dims, block_rows) +
         row / block_rows;
}

float Fp8Tensor::descale_at(int b, int row, int h) const { return descale[scale_index(b, row, h)]; }

Fp8Tensor quantize_e4m3(const TensorDims& dims, const std::vector<float>& x,
                        const QuantOptions& options) {
  if (x.size() != dims.size() || options.block_rows < 0) {
    throw std::invalid_argument(
        "flash3::ref::quantize_e4m3: x does not match dims, or block_rows < 0");
  }
  if (options.hadamard && !is_hadamard_dim(dims.headdim)) {
    throw std::invalid_argument(
        "flash3::ref::quantize_e4m3: the Hadamard transform needs a power-of-two head dim in [16, "
        "256]");
  }
  std::vector<float> rows = x;
  Fp8Tensor t{dims, options.block_rows, std::vector<uint8_t>(x.size()),
              std::vector<float>(scale_count(dims, options.block_rows), 0.0f)};
  // walsh_hadamard's normalisation, applied with the scale.
  const float norm = options.hadamard ? hadamard_norm<float>(dims.headdim) : 1.0f;
  for_each_tensor_row(dims, [&](int b, int i, int h, size_t at) {
    if (options.hadamard) {
      randomized_butterflies(&rows[at], dims.headdim, options.seed);
    }
    float& amax = t.descale[t.scale_index(b, i, h)];
    for (int c = 0; c < dims.headdim; ++c) {
      amax = std::max(amax, std::fabs(rows[at + c]));
    }
  });
  for (float& scale : t.descale) {
    const float normalised = scale * norm;
    scale = normalised / kE4m3Max;
    scale = scale == 0.0f ? kUnitScale : std::max(scale, kMinScale);
  }
  for_each_tensor_row(dims, [&](int b, int i, int h, size_t at) {
    const float factor = norm / t.descale_at(b, i, h);
    for (int c = 0; c < dims.headdim; ++c) {
      t.data[at + c] = float_to_e4m3(rows[at + c] * factor);
    }
  });
  return t;
}

std::vector<float> dequantize(const Fp8Tensor& t) {
  std::vector<float> x = code_values(t);
  for_each_tensor_row(t.dims, [&](int b, int i, int h, size_t at) {
    const float descale = t.descale_at(b, i, h);
    for (int c = 0; c < t.dims.headdim; ++c) {
      x[at + c] *= descale;
    }
  });
  return x;
}

std::vector<uint8_t> fp8_v_layout(const TensorDims& dims, const std::vector<uint8_t>& v_codes) {
  if (v_codes.size() != dims.size()) {
    throw std::invalid_argument("flash3::ref::fp8_v_layout: v_codes does not match dims");
  }
  const size_t padded = (static_cast<size_t>(dims.seqlen) + kFp8VKeyGroup - 1) / kFp8VKeyGroup *
                        kFp8VKeyGroup;
  std::vector<uint8_t> out(static_cast<size_t>(dims.batch) * dims.heads * dims.headdim * padded);
  size_t at = 0;
  for (int b = 0; b < dims.batch; ++b) {
    for (int h = 0; h < dims.heads; ++h) {
      for (int d = 0; d < dims.headdim; ++d) {
        for (size_t slot = 0; slot < padded; ++slot, ++at) {
          const size_t key = slot / kFp8VKeyGroup * kFp8VKeyGroup + kFp8VKeyOrder[slot % kFp8VKeyGroup];
          out[at] = key < static_cast<size_t>(dims.seqlen)
                        ? v_codes[row_offset(dims, b, static_cast<int>(key), h) + d]
                        : 0;
        }
      }
    }
  }
  return out;
}

std::vector<float> attention_forward_fp8(HalfType out_type, const Shape& shape, const Fp8Tensor& q,
                                         const Fp8Tensor& k, const Fp8Tensor& v,
                                         float softmax_scale, bool causal) {
  check_fp8_inputs(shape, q, k, v);
  const Fp8Problem p{
      shape, q, k, v, code_values(q), code_values(k), code_values(v), softmax_scale * kLog2e,
      causal};
  std::vector<float> out(shape.q_size(), 0.0f);
  const size_t rows = static_cast<size_t>(shape.batch) * shape.seqlen_q * shape.heads_q;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  // Row r is (b, i, h) in memory order; threads take every threads-th row,
  // which spreads the long and short rows of a causal mask evenly.
  const auto work = [&](unsigned first) {
    for (size_t r = first; r < rows; r += threads) {
      const int h = static_cast<int>(r % shape.heads_q);
      const int i = static_cast<int>(r / shape.heads_q % shape.seqlen_q);
      const int b = static_cast<int>(r / shape.heads_q / shape.seqlen_q);
      attend_row_fp8(p, out_type, b, h, i, &out[r * shape.headdim]);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) {
    pool.emplace_back(work, t);
  }
  work(0);
  for (std::thread& thread : pool) {
    thread.join();
  }
  return out;
}

Fp8Accuracy fp8_accuracy(const Shape& shape, int block_rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<float> q = outlier_normal(shape.q_size(), rng);
  const std::vector<float> k = outlier_normal(shape.kv_size(), rng);
  const std::vector<float> v = outlier_normal(shape.kv_size(), rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.headdim));
  const Reference ref = attention_forward(shape, q, k, v, scale, false);
  const auto rmse = [&](const std::vector<float>& out) { return error_stats(out, ref.out).rms; };
  const TensorDims q_dims{shape.batch, shape.seqlen_q, shape.heads_q, shape.headdim};
  const TensorDims kv_dims{shape.batch, shape.seqlen_k, shape.heads_k, shape.headdim};
  const auto fp8 = [&](int rows, bool hadamard) {
    const QuantOptions qk{rows, hadamard, seed};
    const QuantOptions values{rows, false, seed};
    return rmse(attention_forward_fp8(
        HalfType::kBFloat16, shape, quantize_e4m3(q_dims, q, qk), quantize_e4m3(kv_dims, k, qk),
        quantize_e4m3(kv_dims, v, values), static_cast<float>(scale), false));
  };
  return {rmse(attention_forward_plain(HalfType::kBFloat16, shape, q, k, v,
                                       static_cast<float>(scale), false)),
          fp8(kPerTensor, false), fp8(block_rows, false), fp8(block_rows, true)};
}

}  // namespace flash3::ref
