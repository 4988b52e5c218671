// combine against the float64 reference (reference/serving_ref.hpp:
// attention_combine) on a Hopper GPU: 1 to 1000 splits, head dims 1 to 1024
// (odd ones through the scalar path), float32/float16/bfloat16 out,
// FlashAttention-3's strided layouts and unaligned ones, rows whose splits
// are all -inf, lses near 1000. The arrays' unused elements hold NaN (a read
// of one would show), out and lse are poisoned with NaN before the call,
// and every element is checked: out within FlashAttention-3's rule (twice
// the rounding of the reference to out's dtype, plus 1e-5), lse within 1e-5
// (absolute and relative), nothing written outside the views.
// Every test skips, saying why, where there is no Hopper GPU.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "hopper_test.hpp"
#include "reference/serving_ref.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr uint32_t kPoisonFloatBits = 0xFFFFFFFFu;  // a NaN
constexpr unsigned char kPoisonByte = 0xFF;         // NaN in every output dtype
constexpr double kOutAtol = 1e-5;
constexpr double kLseTol = 1e-5;  // absolute and relative, as torch.allclose(1e-5, 1e-5)

enum class CombineLayout {
  kContiguous,  // every array dense
  kFa3,         // FlashAttention-3's test: out_partial the first half of a head-major
                // (2 * num_splits, batch, heads, seqlen, headdim) tensor, lse_partial
                // seqlen-contiguous with every other head of (num_splits, batch,
                // 2 * heads, seqlen); out rows padded by 3 elements; lse (batch, heads,
                // seqlen) transposed
  kUnaligned,   // dense, every array one element past a 16-byte boundary: scalar loads
                // and stores at any head dim
};

const char* layout_label(CombineLayout layout) {
  switch (layout) {
    case CombineLayout::kContiguous:
      return "contiguous";
    case CombineLayout::kFa3:
      return "fa3";
    case CombineLayout::kUnaligned:
      return "unaligned";
  }
  return "?";
}

const char* dtype_label(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    default:
      return "?";
  }
}

struct CombineCase {
  int num_splits = 1;
  int batch = 1;
  int seqlen = 1;
  int heads = 1;
  int headdim = 64;
  DType out_dtype = DType::kFloat32;
  CombineLayout layout = CombineLayout::kContiguous;
  bool with_lse = true;

  std::string name() const {
    std::ostringstream os;
    os << dtype_label(out_dtype) << "_s" << num_splits << "_b" << batch << "_q" << seqlen << "_h"
       << heads << "_d" << headdim << "_" << layout_label(layout) << (with_lse ? "" : "_nolse");
    return os.str();
  }
  int64_t rows() const { return int64_t{batch} * seqlen * heads; }
};

int64_t element_bytes_of(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Where the four arrays lie in their buffers: an element offset and strides.
struct CombinePlacement {
  size_t partial_offset = 0, lse_partial_offset = 0, out_offset = 0, lse_offset = 0;
  std::array<int64_t, 5> partial_stride{};
  std::array<int64_t, 4> lse_partial_stride{};
  std::array<int64_t, 4> out_stride{};
  std::array<int64_t, 3> lse_stride{};
  size_t partial_size = 0, lse_partial_size = 0, out_size = 0, lse_size = 0;  // elements
};

CombinePlacement place_combine(const CombineCase& c) {
  const int64_t n = c.num_splits, b = c.batch, s = c.seqlen, h = c.heads, d = c.headdim;
  CombinePlacement p;
  if (c.layout == CombineLayout::kFa3) {
    p.partial_stride = {b * h * s * d, h * s * d, d, s * d, 1};
    p.partial_size = 2 * n * b * h * s * d;
    p.lse_partial_stride = {b * 2 * h * s, 2 * h * s, 1, s};
    p.lse_partial_size = n * b * 2 * h * s;
    const int64_t pitch = d + 3;
    p.out_stride = {s * h * pitch, h * pitch, pitch, 1};
    p.out_size = b * s * h * pitch;
    p.lse_stride = {h * s, 1, s};
    p.lse_size = b * h * s;
    return p;
  }
  p.partial_stride = {b * s * h * d, s * h * d, h * d, d, 1};
  p.partial_size = n * b * s * h * d;
  p.lse_partial_stride = {b * s * h, s * h, h, 1};
  p.lse_partial_size = n * b * s * h;
  p.out_stride = {s * h * d, h * d, d, 1};
  p.out_size = b * s * h * d;
  p.lse_stride = {s * h, h, 1};
  p.lse_size = b * s * h;
  if (c.layout == CombineLayout::kUnaligned) {
    p.partial_offset = p.lse_partial_offset = p.out_offset = p.lse_offset = 1;
  }
  return p;
}

// The partials, contiguous (num_splits, batch, seqlen, heads[, headdim]):
// N(0, 1) outputs; lses N(0, 2), those of batch 1 plus 1000 (the weights
// must be taken relative to the max); FlashAttention-3's -inf pattern (the
// back half of the splits of the first third of the batches; all of them
// with one split) and one row whose splits are all -inf.
struct Partials {
  std::vector<float> out;
  std::vector<float> lse;
};

Partials random_partials(const CombineCase& c) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.name()));
  std::normal_distribution<float> normal;
  const int64_t rows = c.rows();
  Partials x;
  x.out.resize(static_cast<size_t>(c.num_splits * rows * c.headdim));
  for (float& v : x.out) {
    v = normal(rng);
  }
  x.lse.resize(static_cast<size_t>(c.num_splits * rows));
  for (int64_t i = 0; i < c.num_splits; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t batch = r / (int64_t{c.seqlen} * c.heads);
      float l = 2.0f * normal(rng) + (batch == 1 ? 1000.0f : 0.0f);
      if (i >= c.num_splits / 2 && batch < c.batch / 3) {
        l = -kInf;
      }
      if (r == rows - 1) {
        l = -kInf;
      }
      x.lse[static_cast<size_t>(i * rows + r)] = l;
    }
  }
  return x;
}

// The reference's float64 out (batch, seqlen, heads, headdim) and lse,
// reordered to (batch, seqlen, heads). flash3 follows torch.logsumexp: a
// row whose splits are all -inf gets lse -inf, where the reference (which
// skips infinite splits) says +inf; these inputs have no +inf, so every
// +inf of the reference is such a row.
struct Expected {
  std::vector<double> out;
  std::vector<double> lse;
};

Expected expected_of(const CombineCase& c, const Partials& x) {
  const int64_t rows = c.rows();
  std::vector<float> lse_bhs(x.lse.size());  // the reference's (num_splits, batch, heads, seqlen)
  for (int64_t i = 0; i < c.num_splits; ++i) {
    for (int b = 0; b < c.batch; ++b) {
      for (int s = 0; s < c.seqlen; ++s) {
        for (int h = 0; h < c.heads; ++h) {
          lse_bhs[static_cast<size_t>(i * rows + (int64_t{b} * c.heads + h) * c.seqlen + s)] =
              x.lse[static_cast<size_t>(i * rows + (int64_t{b} * c.seqlen + s) * c.heads + h)];
        }
      }
    }
  }
  const ref::CombineShape shape{c.num_splits, c.batch, c.seqlen, c.heads, c.headdim};
  const ref::Reference r = ref::attention_combine(shape, x.out, lse_bhs);
  Expected e{r.out, std::vector<double>(static_cast<size_t>(rows))};
  for (int b = 0; b < c.batch; ++b) {
    for (int s = 0; s < c.seqlen; ++s) {
      for (int h = 0; h < c.heads; ++h) {
        const double l = r.lse[static_cast<size_t>((int64_t{b} * c.heads + h) * c.seqlen + s)];
        e.lse[static_cast<size_t>((int64_t{b} * c.seqlen + s) * c.heads + h)] =
            std::isinf(l) ? -std::numeric_limits<double>::infinity() : l;
      }
    }
  }
  return e;
}

// The value of x in out's dtype.
double rounded(DType dtype, double x) {
  const float f = static_cast<float>(x);
  if (dtype == DType::kFloat32) {
    return f;
  }
  const ref::HalfType type = half_type(dtype);
  return ref::half_to_float(type, ref::float_to_half(type, f));
}

float decode(DType dtype, const unsigned char* bytes) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, bytes, sizeof f);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, bytes, sizeof bits);
  return ref::half_to_float(half_type(dtype), bits);
}

// One case on the device: the partials scattered into NaN-filled buffers,
// out and lse poisoned; the call; every element checked.
class CombineProblem {
 public:
  explicit CombineProblem(const CombineCase& c)
      : case_(c),
        place_(place_combine(c)),
        partial_(bytes_of(place_.partial_offset + place_.partial_size, 4)),
        lse_partial_(bytes_of(place_.lse_partial_offset + place_.lse_partial_size, 4)),
        out_(bytes_of(place_.out_offset + place_.out_size, element_bytes_of(c.out_dtype))),
        lse_(bytes_of(place_.lse_offset + place_.lse_size, 4)) {
    inputs_ = random_partials(c);
    upload(inputs_.out, 5, place_.partial_offset, place_.partial_stride.data(),
           place_.partial_offset + place_.partial_size, partial_);
    upload(inputs_.lse, 4, place_.lse_partial_offset, place_.lse_partial_stride.data(),
           place_.lse_partial_offset + place_.lse_partial_size, lse_partial_);
    check_cuda(cudaMemset(out_.get(), kPoisonByte, out_bytes()), "poison out");
    check_cuda(cudaMemset(lse_.get(), kPoisonByte, lse_bytes()), "poison lse");
  }

  CombineArgs args() const {
    const CombineCase& c = case_;
    CombineArgs a;
    a.out_partial = static_cast<const float*>(partial_.get()) + place_.partial_offset;
    a.out_partial_shape = {c.num_splits, c.batch, c.seqlen, c.heads, c.headdim};
    a.out_partial_stride = place_.partial_stride;
    a.lse_partial = static_cast<const float*>(lse_partial_.get()) + place_.lse_partial_offset;
    a.lse_partial_stride = place_.lse_partial_stride;
    a.out.data = static_cast<unsigned char*>(out_.get()) +
                 place_.out_offset * element_bytes_of(c.out_dtype);
    a.out.dtype = c.out_dtype;
    a.out.shape = {c.batch, c.seqlen, c.heads, c.headdim};
    a.out.stride = place_.out_stride;
    a.lse = c.with_lse ? static_cast<float*>(lse_.get()) + place_.lse_offset : nullptr;
    a.lse_stride = place_.lse_stride;
    return a;
  }

  flash3_combine_args c_args() const {
    const CombineArgs a = args();
    flash3_combine_args c{};
    c.out_partial = a.out_partial;
    c.lse_partial = a.lse_partial;
    c.out = to_c(a.out);
    c.lse = a.lse;
    std::copy(a.out_partial_shape.begin(), a.out_partial_shape.end(), c.out_partial_shape);
    std::copy(a.out_partial_stride.begin(), a.out_partial_stride.end(), c.out_partial_stride);
    std::copy(a.lse_partial_stride.begin(), a.lse_partial_stride.end(), c.lse_partial_stride);
    std::copy(a.lse_stride.begin(), a.lse_stride.end(), c.lse_stride);
    return c;
  }

  // After the call has finished (device synchronized).
  void expect_matches_reference() const {
    const CombineCase& c = case_;
    const Expected e = expected_of(c, inputs_);
    const int64_t out_bytes_each = element_bytes_of(c.out_dtype);
    std::vector<unsigned char> out(out_bytes());
    check_cuda(cudaMemcpy(out.data(), out_.get(), out.size(), cudaMemcpyDeviceToHost), "out");
    std::vector<float> lse(lse_bytes() / 4);
    check_cuda(cudaMemcpy(lse.data(), lse_.get(), lse_bytes(), cudaMemcpyDeviceToHost), "lse");

    std::vector<bool> in_out(out.size() / out_bytes_each, false), in_lse(lse.size(), false);
    size_t bad_out = 0, bad_lse = 0;
    double worst_excess = -1.0;
    std::string first_bad;
    for (int b = 0; b < c.batch; ++b) {
      for (int s = 0; s < c.seqlen; ++s) {
        for (int h = 0; h < c.heads; ++h) {
          const size_t row = static_cast<size_t>((int64_t{b} * c.seqlen + s) * c.heads + h);
          const size_t out_row = place_.out_offset + b * place_.out_stride[0] +
                                 s * place_.out_stride[1] + h * place_.out_stride[2];
          for (int x = 0; x < c.headdim; ++x) {
            const size_t at = out_row + x;
            in_out[at] = true;
            const double want = e.out[row * c.headdim + x];
            const double got = decode(c.out_dtype, &out[at * out_bytes_each]);
            const double bound = 2.0 * std::fabs(rounded(c.out_dtype, want) - want) + kOutAtol;
            const double error = std::fabs(got - want);
            if (!(error <= bound)) {  // NaN fails too
              if (bad_out++ == 0) {
                std::ostringstream os;
                os << "out[" << b << ", " << s << ", " << h << ", " << x << "] = " << got
                   << ", reference " << want << ", bound " << bound;
                first_bad = os.str();
              }
            }
            worst_excess = std::max(worst_excess, error - bound);
          }
          if (!c.with_lse) {
            continue;
          }
          const size_t at = place_.lse_offset + b * place_.lse_stride[0] +
                            s * place_.lse_stride[1] + h * place_.lse_stride[2];
          in_lse[at] = true;
          const double want = e.lse[row];
          const double got = lse[at];
          const bool ok = std::isinf(want) ? got == want
                                           : std::fabs(got - want) <= kLseTol * (1.0 + std::fabs(want));
          if (!ok && bad_lse++ == 0 && first_bad.empty()) {
            std::ostringstream os;
            os << "lse[" << b << ", " << s << ", " << h << "] = " << got << ", reference " << want;
            first_bad = os.str();
          }
        }
      }
    }
    EXPECT_EQ(bad_out, 0u) << c.name() << ": " << first_bad << " (worst excess over the bound "
                           << worst_excess << ")";
    EXPECT_EQ(bad_lse, 0u) << c.name() << ": " << first_bad;
    // Nothing outside the views written: padding, offsets, and lse when not asked for.
    size_t clobbered = 0;
    for (size_t i = 0; i < in_out.size(); ++i) {
      for (int64_t k = 0; k < out_bytes_each && !in_out[i]; ++k) {
        clobbered += out[i * out_bytes_each + k] != kPoisonByte;
      }
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &lse[i], sizeof bits);
      clobbered += !in_lse[i] && bits != kPoisonFloatBits;
    }
    EXPECT_EQ(clobbered, 0u) << c.name() << ": bytes written outside out and lse";
  }

 private:
  static size_t bytes_of(size_t elements, int64_t element_bytes) {
    return std::max<size_t>(elements * element_bytes, 16);
  }
  size_t out_bytes() const {
    return (place_.out_offset + place_.out_size) * element_bytes_of(case_.out_dtype);
  }
  size_t lse_bytes() const { return (place_.lse_offset + place_.lse_size) * 4; }

  // Scatters a contiguous array of `rank` dimensions (the case's num_splits,
  // batch, seqlen, heads, headdim, in that order) into a NaN-filled buffer.
  void upload(const std::vector<float>& values, int rank, size_t offset, const int64_t* stride,
              size_t size, const DeviceBuffer& buffer) const {
    const CombineCase& c = case_;
    const int64_t shape[5] = {c.num_splits, c.batch, c.seqlen, c.heads, c.headdim};
    float poison;
    std::memcpy(&poison, &kPoisonFloatBits, sizeof poison);
    std::vector<float> host(size, poison);
    std::array<int64_t, 5> index{};
    for (size_t i = 0; i < values.size(); ++i) {
      int64_t at = static_cast<int64_t>(offset);
      for (int k = 0; k < rank; ++k) {
        at += index[k] * stride[k];
      }
      host[static_cast<size_t>(at)] = values[i];
      for (int k = rank - 1; k >= 0 && ++index[k] == shape[k]; --k) {
        index[k] = 0;
      }
    }
    check_cuda(cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(float),
                          cudaMemcpyHostToDevice),
               "upload");
  }

  CombineCase case_;
  CombinePlacement place_;
  Partials inputs_;
  DeviceBuffer partial_, lse_partial_, out_, lse_;
};

void expect_combine_matches_reference(const CombineCase& c) {
  SCOPED_TRACE(c.name());
  const CombineProblem problem(c);
  const Status s = flash3::combine(problem.args(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "combine");
  problem.expect_matches_reference();
}

// ---------------------------------------------------------------- the sweep

using SweepParam = std::tuple<int, int>;  // num_splits, headdim

class CombineSweep : public HopperTest, public ::testing::WithParamInterface<SweepParam> {};

// For each out dtype: a single row per head contiguous, FlashAttention-3's
// layouts at 113 rows, and unaligned arrays.
TEST_P(CombineSweep, MatchesTheReference) {
  const auto& [num_splits, headdim] = GetParam();
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    expect_combine_matches_reference(
        {num_splits, 5, 1, 4, headdim, dtype, CombineLayout::kContiguous});
    expect_combine_matches_reference({num_splits, 3, 113, 2, headdim, dtype, CombineLayout::kFa3});
    expect_combine_matches_reference(
        {num_splits, 3, 37, 3, headdim, dtype, CombineLayout::kUnaligned});
  }
}

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  const auto& [num_splits, headdim] = info.param;
  return "s" + std::to_string(num_splits) + "_d" + std::to_string(headdim);
}

INSTANTIATE_TEST_SUITE_P(Cases, CombineSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 17, 133),
                                            ::testing::Values(64, 96, 128, 256, 512, 59)),
                         sweep_name);

// ---------------------------------------------------------------- the rest

class Combine : public HopperTest {};

// Head dims at the kernel's chunk boundaries and past them, 1 and 1024.
TEST_F(Combine, EveryRowWidth) {
  for (const int headdim : {1, 2, 3, 4, 31, 33, 124, 132, 192, 260, 516, 1000, 1024}) {
    expect_combine_matches_reference({5, 3, 7, 2, headdim, DType::kBFloat16,
                                      CombineLayout::kContiguous});
    expect_combine_matches_reference({5, 3, 7, 2, headdim, DType::kFloat32,
                                      CombineLayout::kUnaligned});
  }
}

// Many groups of 32 splits, and more splits than FlashAttention-3 takes (256).
TEST_F(Combine, ManySplits) {
  for (const int num_splits : {31, 32, 33, 64, 65, 257, 1000}) {
    expect_combine_matches_reference(
        {num_splits, 3, 5, 2, 128, DType::kFloat16, CombineLayout::kFa3});
  }
}

TEST_F(Combine, WithoutLse) {
  for (const CombineLayout layout : {CombineLayout::kContiguous, CombineLayout::kFa3}) {
    CombineCase c{17, 3, 20, 3, 256, DType::kBFloat16, layout};
    c.with_lse = false;
    expect_combine_matches_reference(c);
  }
}

TEST_F(Combine, OnAStreamThroughTheCAbi) {
  const CombineCase c{7, 3, 50, 4, 128, DType::kFloat32, CombineLayout::kFa3};
  const CombineProblem problem(c);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const flash3_combine_args args = problem.c_args();
  const flash3_status status = flash3_combine(&args, stream);
  check_cuda(cudaStreamSynchronize(stream), "combine");
  check_cuda(cudaStreamDestroy(stream), "stream");
  ASSERT_EQ(status, FLASH3_OK) << flash3_last_error();
  problem.expect_matches_reference();
}

// Values the reference does not take (it skips every infinite split):
// torch.logsumexp's answers, with zero outputs where a weight is inf or NaN.
TEST_F(Combine, InfiniteAndNanLses) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  struct Row {
    std::vector<float> lse;  // one per split
    float want_lse;
  };
  const Row rows[] = {
      {{-kInf, -kInf, -kInf}, -kInf},           // no split saw a key: zeros and -inf
      {{kInf, 1.0f, 2.0f}, kInf},               // +inf: every weight inf - inf or 0
      {{kNan, 1.0f, 2.0f}, kNan},               // NaN: every weight NaN
      {{-kInf, kInf, -kInf}, kInf},
      {{3.0f, -kInf, -kInf}, 3.0f},             // one split: its lse, its out
      {{0.0f, -200.0f, 0.0f}, std::log(2.0f)},  // exp(-200) underflows: that split unread
  };
  constexpr int kSplits = 3, kRows = 6, kHeadDim = 8;
  std::vector<float> out_partial(kSplits * kRows * kHeadDim), lse_partial(kSplits * kRows);
  for (int i = 0; i < kSplits; ++i) {
    for (int r = 0; r < kRows; ++r) {
      lse_partial[i * kRows + r] = rows[r].lse[i];
      for (int x = 0; x < kHeadDim; ++x) {
        out_partial[(i * kRows + r) * kHeadDim + x] = static_cast<float>(i + 1) + 0.125f * x;
      }
    }
  }
  DeviceBuffer d_partial(out_partial.size() * 4), d_lse_partial(lse_partial.size() * 4),
      d_out(kRows * kHeadDim * 4), d_lse(kRows * 4);
  check_cuda(cudaMemcpy(d_partial.get(), out_partial.data(), out_partial.size() * 4,
                        cudaMemcpyHostToDevice), "out_partial");
  check_cuda(cudaMemcpy(d_lse_partial.get(), lse_partial.data(), lse_partial.size() * 4,
                        cudaMemcpyHostToDevice), "lse_partial");
  check_cuda(cudaMemset(d_out.get(), kPoisonByte, kRows * kHeadDim * 4), "poison out");
  check_cuda(cudaMemset(d_lse.get(), kPoisonByte, kRows * 4), "poison lse");
  CombineArgs a;  // batch 1, seqlen kRows, heads 1
  a.out_partial = static_cast<const float*>(d_partial.get());
  a.out_partial_shape = {kSplits, 1, kRows, 1, kHeadDim};
  a.out_partial_stride = {kRows * kHeadDim, kRows * kHeadDim, kHeadDim, kHeadDim, 1};
  a.lse_partial = static_cast<const float*>(d_lse_partial.get());
  a.lse_partial_stride = {kRows, kRows, 1, 1};
  a.out = Tensor::contiguous(d_out.get(), DType::kFloat32, 1, kRows, 1, kHeadDim);
  a.lse = static_cast<float*>(d_lse.get());
  a.lse_stride = {kRows, 1, 1};
  const Status s = flash3::combine(a, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "combine");
  std::vector<float> out(kRows * kHeadDim), lse(kRows);
  check_cuda(cudaMemcpy(out.data(), d_out.get(), out.size() * 4, cudaMemcpyDeviceToHost), "out");
  check_cuda(cudaMemcpy(lse.data(), d_lse.get(), lse.size() * 4, cudaMemcpyDeviceToHost), "lse");
  for (int r = 0; r < kRows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const float want = rows[r].want_lse;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(lse[r])) << lse[r];
    } else if (std::isinf(want)) {
      EXPECT_EQ(lse[r], want);
    } else {
      EXPECT_NEAR(lse[r], want, 1e-6);
    }
    for (int x = 0; x < kHeadDim; ++x) {
      float expected = 0.0f;  // the non-finite rows
      if (r == 4) {
        expected = 1.0f + 0.125f * x;  // split 0 alone
      } else if (r == 5) {
        expected = 0.5f * (1.0f + 0.125f * x) + 0.5f * (3.0f + 0.125f * x);
      }
      EXPECT_NEAR(out[r * kHeadDim + x], expected, 1e-6) << "column " << x;
    }
  }
}

// batch, seqlen or heads 0: nothing launched, success, null pointers allowed.
TEST_F(Combine, EmptyProblemsSucceed) {
  const std::array<int64_t, 3> cases[] = {{0, 5, 4}, {2, 0, 4}, {2, 5, 0}};
  for (const std::array<int64_t, 3>& rows : cases) {
    CombineArgs a;
    a.out_partial_shape = {3, rows[0], rows[1], rows[2], 64};
    a.out.dtype = DType::kBFloat16;
    a.out.shape = {rows[0], rows[1], rows[2], 64};
    const Status s = flash3::combine(a, nullptr);
    EXPECT_TRUE(s.ok()) << s.message;
  }
  check_cuda(cudaDeviceSynchronize(), "empty combine");
}

// Small cases for compute-sanitizer (tests/CMakeLists.txt: Sanitize*): the
// vector and scalar paths, every out dtype, FlashAttention-3's layouts.
class SanitizeCombine : public HopperTest {};

TEST_F(SanitizeCombine, BothPaths) {
  expect_combine_matches_reference({3, 2, 9, 3, 128, DType::kBFloat16, CombineLayout::kFa3});
  expect_combine_matches_reference({40, 2, 3, 2, 59, DType::kFloat16, CombineLayout::kContiguous});
  expect_combine_matches_reference({2, 2, 5, 2, 1024, DType::kFloat32, CombineLayout::kUnaligned});
}

}  // namespace
}  // namespace flash3::test
