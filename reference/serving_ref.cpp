#include "reference/serving_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace flash3::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void require(bool ok, const char* what) {
  if (!ok) {
    throw std::invalid_argument(std::string("flash3::ref: ") + what);
  }
}

// batch + 1 offsets from 0, non-decreasing.
void check_cu_seqlens(const std::vector<int>& cu) {
  require(!cu.empty() && cu[0] == 0, "cu_seqlens must start at 0");
  require(std::is_sorted(cu.begin(), cu.end()), "cu_seqlens must not decrease");
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// The offsets, and q, k, v of the shape's sizes.
void check_varlen(const VarlenShape& shape, size_t q_size, size_t k_size, size_t v_size) {
  check_cu_seqlens(shape.cu_seqlens_q);
  check_cu_seqlens(shape.cu_seqlens_k);
  require(shape.cu_seqlens_q.size() == shape.cu_seqlens_k.size(),
          "cu_seqlens_q and cu_seqlens_k must have the same length");
  const size_t q_row = static_cast<size_t>(shape.heads_q) * shape.headdim;
  const size_t kv_row = static_cast<size_t>(shape.heads_k) * shape.headdim;
  require(q_size == shape.total_q() * q_row, "q does not match the varlen shape");
  require(k_size == shape.total_k() * kv_row && v_size == k_size,
          "k or v does not match the varlen shape");
}

}  // namespace

int VarlenShape::batch() const { return static_cast<int>(cu_seqlens_q.size()) - 1; }

int VarlenShape::total_q() const { return cu_seqlens_q.back(); }

int VarlenShape::total_k() const { return cu_seqlens_k.back(); }

Reference attention_forward_varlen(const VarlenShape& shape, const std::vector<float>& q,
                                   const std::vector<float>& k, const std::vector<float>& v,
                                   double softmax_scale, bool causal) {
  check_varlen(shape, q.size(), k.size(), v.size());
  const size_t q_row = static_cast<size_t>(shape.heads_q) * shape.headdim;
  const size_t kv_row = static_cast<size_t>(shape.heads_k) * shape.headdim;
  const int total_q = shape.total_q();
  Reference r{std::vector<double>(q.size()),
              std::vector<double>(static_cast<size_t>(shape.heads_q) * total_q)};
  // Each sequence is a batch of one for the padded reference; its rows are
  // contiguous in the packed tensors.
  for (int b = 0; b < shape.batch(); ++b) {
    const int q0 = shape.cu_seqlens_q[b], k0 = shape.cu_seqlens_k[b];
    const int lq = shape.cu_seqlens_q[b + 1] - q0, lk = shape.cu_seqlens_k[b + 1] - k0;
    const Shape s{1, lq, lk, shape.heads_q, shape.heads_k, shape.headdim};
    const auto slice = [](const std::vector<float>& x, size_t begin, size_t size) {
      return std::vector<float>(x.begin() + begin, x.begin() + begin + size);
    };
    const Reference seq =
        attention_forward(s, slice(q, q0 * q_row, s.q_size()), slice(k, k0 * kv_row, s.kv_size()),
                          slice(v, k0 * kv_row, s.kv_size()), softmax_scale, causal);
    std::copy(seq.out.begin(), seq.out.end(), r.out.begin() + q0 * q_row);
    for (int h = 0; h < shape.heads_q; ++h) {
      std::copy_n(seq.lse.begin() + static_cast<size_t>(h) * s.seqlen_q, s.seqlen_q,
                  r.lse.begin() + static_cast<size_t>(h) * total_q + q0);
    }
  }
  return r;
}

std::vector<float> attention_forward_varlen_plain(HalfType type, const VarlenShape& shape,
                                                  const std::vector<float>& q,
                                                  const std::vector<float>& k,
                                                  const std::vector<float>& v,
                                                  float softmax_scale, bool causal) {
  check_varlen(shape, q.size(), k.size(), v.size());
  const size_t q_row = static_cast<size_t>(shape.heads_q) * shape.headdim;
  const size_t kv_row = static_cast<size_t>(shape.heads_k) * shape.headdim;
  std::vector<float> out(q.size(), 0.0f);
  for (int b = 0; b < shape.batch(); ++b) {
    const int q0 = shape.cu_seqlens_q[b], k0 = shape.cu_seqlens_k[b];
    const int lq = shape.cu_seqlens_q[b + 1] - q0, lk = shape.cu_seqlens_k[b + 1] - k0;
    if (lq == 0 || lk == 0) {
      continue;  // no rows, or rows that see no key: zeros
    }
    const Shape s{1, lq, lk, shape.heads_q, shape.heads_k, shape.headdim};
    const std::vector<float> qs(q.begin() + q0 * q_row, q.begin() + (q0 + lq) * q_row);
    const std::vector<float> ks(k.begin() + k0 * kv_row, k.begin() + (k0 + lk) * kv_row);
    const std::vector<float> vs(v.begin() + k0 * kv_row, v.begin() + (k0 + lk) * kv_row);
    const std::vector<float> p = attention_forward_plain(type, s, qs, ks, vs, softmax_scale, causal);
    std::copy(p.begin(), p.end(), out.begin() + q0 * q_row);
  }
  return out;
}

namespace {

// Calls f(b, shape of sequence b as a batch of one, its q/out rows' first
// element, its k/v rows' first element) for every sequence with queries and
// keys, after checking the packed sizes.
template <class F>
void for_each_sequence(const VarlenShape& shape, size_t q_size, size_t k_size, size_t v_size,
                       F&& f) {
  check_varlen(shape, q_size, k_size, v_size);
  const size_t q_row = static_cast<size_t>(shape.heads_q) * shape.headdim;
  const size_t kv_row = static_cast<size_t>(shape.heads_k) * shape.headdim;
  for (int b = 0; b < shape.batch(); ++b) {
    const int q0 = shape.cu_seqlens_q[b], k0 = shape.cu_seqlens_k[b];
    const int lq = shape.cu_seqlens_q[b + 1] - q0, lk = shape.cu_seqlens_k[b + 1] - k0;
    if (lq > 0 && lk > 0) {
      f(Shape{1, lq, lk, shape.heads_q, shape.heads_k, shape.headdim}, q0 * q_row, k0 * kv_row);
    }
  }
}

std::vector<float> slice(const std::vector<float>& x, size_t begin, size_t size) {
  return std::vector<float>(x.begin() + begin, x.begin() + begin + size);
}

}  // namespace

Gradients attention_backward_varlen(const VarlenShape& shape, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<float>& dout, double softmax_scale,
                                    bool causal) {
  require(dout.size() == q.size(), "dout must be shaped like q");
  Gradients g{std::vector<double>(q.size()), std::vector<double>(k.size()),
              std::vector<double>(v.size())};
  for_each_sequence(shape, q.size(), k.size(), v.size(), [&](const Shape& s, size_t qa, size_t ka) {
    const Gradients seq = attention_backward(s, slice(q, qa, s.q_size()), slice(k, ka, s.kv_size()),
                                             slice(v, ka, s.kv_size()), slice(dout, qa, s.q_size()),
                                             softmax_scale, causal);
    std::copy(seq.dq.begin(), seq.dq.end(), g.dq.begin() + qa);
    std::copy(seq.dk.begin(), seq.dk.end(), g.dk.begin() + ka);
    std::copy(seq.dv.begin(), seq.dv.end(), g.dv.begin() + ka);
  });
  return g;
}

PlainGradients attention_backward_varlen_plain(HalfType type, const VarlenShape& shape,
                                               const std::vector<float>& q,
                                               const std::vector<float>& k,
                                               const std::vector<float>& v,
                                               const std::vector<float>& dout,
                                               float softmax_scale, bool causal) {
  require(dout.size() == q.size(), "dout must be shaped like q");
  PlainGradients g{std::vector<float>(q.size()), std::vector<float>(k.size()),
                   std::vector<float>(v.size())};
  for_each_sequence(shape, q.size(), k.size(), v.size(), [&](const Shape& s, size_t qa, size_t ka) {
    const PlainGradients seq = attention_backward_plain(
        type, s, slice(q, qa, s.q_size()), slice(k, ka, s.kv_size()), slice(v, ka, s.kv_size()),
        slice(dout, qa, s.q_size()), softmax_scale, causal);
    std::copy(seq.dq.begin(), seq.dq.end(), g.dq.begin() + qa);
    std::copy(seq.dk.begin(), seq.dk.end(), g.dk.begin() + ka);
    std::copy(seq.dv.begin(), seq.dv.end(), g.dv.begin() + ka);
  });
  return g;
}

std::vector<float> gather_pages(const std::vector<float>& pool, int page_size, int heads_k,
                                int headdim, const std::vector<int>& page_table, int max_pages,
                                const std::vector<int>& seqlens, int max_seqlen) {
  const size_t row = static_cast<size_t>(heads_k) * headdim;
  require(max_pages >= 0 && max_seqlen >= 0, "max_pages and max_seqlen must not be negative");
  require(page_size > 0 && row > 0 && pool.size() % (page_size * row) == 0,
          "the page pool is not a whole number of pages");
  const size_t num_pages = pool.size() / (page_size * row);
  const size_t batch = seqlens.size();
  require(page_table.size() == batch * max_pages, "page_table must be batch x max_pages");
  std::vector<float> cache(batch * max_seqlen * row);  // zero past each length
  for (size_t b = 0; b < batch; ++b) {
    require(seqlens[b] >= 0 && seqlens[b] <= int64_t{max_pages} * page_size,
            "a sequence is longer than its pages");
    require(seqlens[b] <= max_seqlen, "a sequence is longer than max_seqlen");
    for (int j = 0; j < seqlens[b]; ++j) {
      const int page = page_table[b * max_pages + j / page_size];
      require(page >= 0 && static_cast<size_t>(page) < num_pages, "page index outside the pool");
      const auto src = pool.begin() + (static_cast<size_t>(page) * page_size + j % page_size) * row;
      std::copy_n(src, row, cache.begin() + (b * max_seqlen + j) * row);
    }
  }
  return cache;
}

RotaryTables rotary_tables(int max_positions, int rotary_dim, double base) {
  const int half = rotary_dim / 2;
  RotaryTables t{std::vector<double>(static_cast<size_t>(max_positions) * half),
                 std::vector<double>(static_cast<size_t>(max_positions) * half)};
  for (int pos = 0; pos < max_positions; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(base, -2.0 * i / rotary_dim);
      t.cos[static_cast<size_t>(pos) * half + i] = std::cos(angle);
      t.sin[static_cast<size_t>(pos) * half + i] = std::sin(angle);
    }
  }
  return t;
}

std::vector<double> apply_rotary(const RotaryShape& shape, const std::vector<float>& x,
                                 const std::vector<double>& cos, const std::vector<double>& sin,
                                 const std::vector<int>& position_offsets, bool interleaved) {
  const RotaryShape& s = shape;
  const int half = s.rotary_dim / 2;
  require(s.rotary_dim % 2 == 0 && s.rotary_dim >= 2 && s.rotary_dim <= s.headdim,
          "rotary_dim must be even and within 2 .. headdim");
  require(x.size() == static_cast<size_t>(s.batch) * s.seqlen * s.heads * s.headdim,
          "x does not match the rotary shape");
  require(cos.size() == sin.size() && cos.size() % half == 0,
          "cos and sin must be max_positions x rotary_dim / 2");
  require(position_offsets.size() == static_cast<size_t>(s.batch),
          "position_offsets needs one offset per batch");
  const int64_t max_positions = cos.size() / half;
  std::vector<double> out(x.begin(), x.end());
  for (int b = 0; b < s.batch; ++b) {
    for (int row = 0; row < s.seqlen; ++row) {
      const int64_t pos = int64_t{position_offsets[b]} + row;
      require(pos >= 0 && pos < max_positions, "a position lies outside the cos/sin tables");
      for (int h = 0; h < s.heads; ++h) {
        double* y = &out[((static_cast<size_t>(b) * s.seqlen + row) * s.heads + h) * s.headdim];
        for (int i = 0; i < half; ++i) {
          // The pair's two dimensions.
          const int d1 = interleaved ? 2 * i : i;
          const int d2 = interleaved ? 2 * i + 1 : i + half;
          const double c = cos[pos * half + i], sn = sin[pos * half + i];
          const double x1 = y[d1], x2 = y[d2];
          y[d1] = x1 * c - x2 * sn;
          y[d2] = x1 * sn + x2 * c;
        }
      }
    }
  }
  return out;
}

std::vector<double> apply_rotary(const RotaryShape& shape, const std::vector<float>& x,
                                 const std::vector<float>& cos, const std::vector<float>& sin,
                                 const std::vector<int>& position_offsets, bool interleaved) {
  return apply_rotary(shape, x, to_double(cos), to_double(sin), position_offsets, interleaved);
}

Reference attention_combine(const CombineShape& shape, const std::vector<double>& out_partial,
                            const std::vector<double>& lse_partial) {
  const CombineShape& s = shape;
  const size_t rows = static_cast<size_t>(s.batch) * s.heads * s.seqlen;
  const size_t d = s.headdim;
  require(
      lse_partial.size() == s.num_splits * rows && out_partial.size() == s.num_splits * rows * d,
      "out_partial or lse_partial does not match the combine shape");
  Reference r{std::vector<double>(rows * d), std::vector<double>(rows, kInf)};
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      for (int i = 0; i < s.seqlen; ++i) {
        const size_t lse_row = (static_cast<size_t>(b) * s.heads + h) * s.seqlen + i;
        const size_t out_row = ((static_cast<size_t>(b) * s.seqlen + i) * s.heads + h) * d;
        const auto lse_of = [&](int split) { return lse_partial[split * rows + lse_row]; };
        // Splits that saw no key (lse +-inf) take no part; a NaN spreads.
        double max = -kInf;
        bool any = false;
        for (int split = 0; split < s.num_splits; ++split) {
          if (!std::isinf(lse_of(split))) {
            any = true;
            max = std::max(max, lse_of(split));
          }
        }
        if (!any) {
          continue;  // zeros and +inf
        }
        double sum = 0.0;
        for (int split = 0; split < s.num_splits; ++split) {
          sum += std::isinf(lse_of(split)) ? 0.0 : std::exp(lse_of(split) - max);
        }
        r.lse[lse_row] = max + std::log(sum);
        for (int split = 0; split < s.num_splits; ++split) {
          if (std::isinf(lse_of(split))) {
            continue;
          }
          const double weight = std::exp(lse_of(split) - r.lse[lse_row]);
          const double* o = &out_partial[split * rows * d + out_row];
          for (size_t x = 0; x < d; ++x) {
            r.out[out_row + x] += weight * o[x];
          }
        }
      }
    }
  }
  return r;
}

Reference attention_combine(const CombineShape& shape, const std::vector<float>& out_partial,
                            const std::vector<float>& lse_partial) {
  return attention_combine(shape, to_double(out_partial), to_double(lse_partial));
}

}  // namespace flash3::ref
