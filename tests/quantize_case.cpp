#include "quantize_case.hpp"

#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "reference/fp8.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

using Bits = uint16_t;                // one fp16 or bf16 element
constexpr Bits kPoisonBits = 0xFFFF;  // a NaN in both formats
constexpr int kPoisonByte = 0xFF;     // e4m3 -NaN, which the kernel never writes (NaN is 0x7F),
                                      // and a float NaN in descale
constexpr uint32_t kPoisonFloatBits = 0xFFFFFFFFu;
constexpr int64_t kPadBytes = 16;    // x_fp8's padding: keeps rows 16-byte aligned
constexpr int kPackedThirds = 3;     // q, k, v in one buffer
constexpr size_t kGuardScales = 16;  // poisoned floats after descale that must stay so
constexpr size_t kGuardBytes = 64;   // v_layout: poisoned bytes after the Fp8V tensor
constexpr double kOutlierProbability = 0.01;
constexpr double kOutlierStd = 100.0;
// Head h has magnitude kHeadMagnitudes[h % 3]: 2^-12 puts most fp16 values
// among the subnormals.
constexpr float kHeadMagnitudes[] = {1.0f, 0x1p-12f, 16.0f};
constexpr int kMismatchesShown = 5;

View contiguous_view(const QuantizeCase& c) {
  const int64_t row = int64_t{c.heads} * c.headdim;
  return {0, {c.batch, c.seqlen, c.heads, c.headdim}, {c.seqlen * row, row, c.headdim, 1}};
}

View x_view(const QuantizeCase& c) {
  if (!c.strided) {
    return contiguous_view(c);
  }
  const int64_t row = int64_t{kPackedThirds} * c.heads * c.headdim;
  return {static_cast<size_t>(c.heads) * c.headdim,
          {c.batch, c.seqlen, c.heads, c.headdim},
          {c.seqlen * row, row, c.headdim, 1}};
}

View x_fp8_view(const QuantizeCase& c) {
  if (!c.strided) {
    return contiguous_view(c);
  }
  const int64_t row = int64_t{c.heads} * c.headdim + kPadBytes;
  return {
      0, {c.batch, c.seqlen, c.heads, c.headdim}, {c.seqlen * row + kPadBytes, row, c.headdim, 1}};
}

// Elements of the buffer that holds `view` (its batch stride covers a batch).
size_t buffer_size(const View& view) { return static_cast<size_t>(view.shape[0] * view.stride[0]); }

// "(b, s, h, x)" of element `logical` of a contiguous tensor.
std::string position(const QuantizeCase& c, size_t logical) {
  const size_t x = logical % c.headdim, rest = logical / c.headdim;
  const size_t h = rest % c.heads, s = rest / c.heads % c.seqlen, b = rest / c.heads / c.seqlen;
  std::ostringstream os;
  os << "(" << b << ", " << s << ", " << h << ", " << x << ")";
  return os.str();
}

}  // namespace

std::string QuantizeCase::name() const {
  std::ostringstream os;
  os << kernel_label(dtype, headdim) << (hadamard ? "_hadamard" : "") << "_b" << batch << "_s"
     << seqlen << "_h" << heads << "_block" << block_rows << "_seed" << seed
     << (strided ? "_strided" : "") << (v_layout ? "_vlayout" : "");
  return os.str();
}

size_t QuantizeCase::num_scales() const {
  return static_cast<size_t>(batch) * heads * ((seqlen + block_rows - 1) / block_rows);
}

std::vector<float> random_quantize_input(const QuantizeCase& c) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.name()));
  std::normal_distribution<double> normal;
  std::normal_distribution<double> outlier_term(0.0, kOutlierStd);
  std::bernoulli_distribution outlier(kOutlierProbability);
  const ref::HalfType type = half_type(c.dtype);
  std::vector<float> x(static_cast<size_t>(c.batch) * c.seqlen * c.heads * c.headdim);
  size_t at = 0;
  for (int b = 0; b < c.batch; ++b) {
    for (int s = 0; s < c.seqlen; ++s) {
      for (int h = 0; h < c.heads; ++h) {
        const bool zero_block = b == 0 && h == 0 && s < c.block_rows;
        const double magnitude = kHeadMagnitudes[h % std::size(kHeadMagnitudes)];
        for (int d = 0; d < c.headdim; ++d, ++at) {
          const double value = normal(rng) + (outlier(rng) ? outlier_term(rng) : 0.0);
          x[at] = zero_block ? 0.0f : ref::round_to(type, static_cast<float>(value * magnitude));
        }
      }
    }
  }
  return x;
}

QuantizeProblem::QuantizeProblem(const QuantizeCase& c, const std::vector<float>& x)
    : case_(c),
      input_(x),
      x_view_(x_view(c)),
      x_fp8_view_(x_fp8_view(c)),
      x_staging_(buffer_size(x_view_), kPoisonBits),
      x_fp8_bytes_(c.v_layout ? static_cast<size_t>(Fp8V{nullptr, c.batch, c.seqlen, c.heads,
                                                           c.headdim}
                                                          .bytes()) +
                                    kGuardBytes
                              : buffer_size(x_fp8_view_)),
      x_(x_staging_.size() * sizeof(Bits)),
      x_fp8_(x_fp8_bytes_),
      descale_((c.num_scales() + kGuardScales) * sizeof(float)) {
  const ref::HalfType type = half_type(c.dtype);
  for_each_element(x_view_, [&](size_t logical, size_t index) {
    x_staging_[index] = ref::float_to_half(type, x[logical]);
  });
  check_cuda(cudaMemcpy(x_.get(), x_staging_.data(), x_staging_.size() * sizeof(Bits),
                        cudaMemcpyHostToDevice),
             "upload x");
  check_cuda(cudaMemset(x_fp8_.get(), kPoisonByte, x_fp8_bytes_), "poison x_fp8");
  check_cuda(
      cudaMemset(descale_.get(), kPoisonByte, (c.num_scales() + kGuardScales) * sizeof(float)),
      "poison descale");
  // The copies ran on the legacy stream; a call on another stream would not wait.
  check_cuda(cudaDeviceSynchronize(), "set up the problem");
}

Tensor QuantizeProblem::x() const { return view_tensor(x_.get(), case_.dtype, x_view_); }

Tensor QuantizeProblem::x_fp8() const {
  return view_tensor(x_fp8_.get(), DType::kFloat8E4M3, x_fp8_view_);
}

Fp8V QuantizeProblem::v_out() const {
  return {x_fp8_.get(), case_.batch, case_.seqlen, case_.heads, case_.headdim};
}

Status QuantizeProblem::quantize(cudaStream_t stream) const {
  if (case_.v_layout) {
    return flash3::quantize_fp8_v(x(), v_out(), descale(), case_.options(), stream);
  }
  return flash3::quantize_fp8(x(), x_fp8(), descale(), case_.options(), stream);
}

flash3_quantize_args QuantizeProblem::c_args() const {
  return to_c_args(x(), x_fp8(), descale(), case_.options());
}

void QuantizeProblem::expect_matches_reference() const {
  std::vector<Bits> x_after(x_staging_.size());
  std::vector<uint8_t> codes(x_fp8_bytes_);
  std::vector<float> scales(case_.num_scales() + kGuardScales);
  check_cuda(
      cudaMemcpy(x_after.data(), x_.get(), x_after.size() * sizeof(Bits), cudaMemcpyDeviceToHost),
      "download x");
  check_cuda(cudaMemcpy(codes.data(), x_fp8_.get(), codes.size(), cudaMemcpyDeviceToHost),
             "download x_fp8");
  check_cuda(cudaMemcpy(scales.data(), descale_.get(), scales.size() * sizeof(float),
                        cudaMemcpyDeviceToHost),
             "download descale");
  EXPECT_TRUE(x_after == x_staging_) << "the kernel wrote to x's buffer";

  const ref::Fp8Tensor want =
      ref::quantize_e4m3({case_.batch, case_.seqlen, case_.heads, case_.headdim}, input_,
                         {case_.block_rows, case_.hadamard, case_.seed});
  if (case_.v_layout) {  // every byte of the layout, zero padding included, then the guard
    const std::vector<uint8_t> layout = ref::fp8_v_layout(
        {case_.batch, case_.seqlen, case_.heads, case_.headdim}, want.data);
    size_t wrong = 0;
    for (size_t i = 0; i < layout.size(); ++i) {
      if (codes[i] != layout[i] && wrong++ < kMismatchesShown) {
        ADD_FAILURE() << "Fp8V byte " << i << ": got 0x" << std::hex << int{codes[i]}
                      << ", want 0x" << int{layout[i]};
      }
    }
    EXPECT_EQ(wrong, 0u) << "Fp8V bytes that differ from the reference's layout";
    for (size_t i = layout.size(); i < codes.size(); ++i) {
      EXPECT_EQ(codes[i], kPoisonByte) << "the kernel wrote past the Fp8V tensor, at " << i;
    }
  }
  std::vector<bool> in_view(codes.size());
  size_t mismatches = 0;
  for_each_element(x_fp8_view_, [&](size_t logical, size_t index) {
    if (case_.v_layout) {
      return;
    }
    in_view[index] = true;
    if (codes[index] != want.data[logical] && mismatches++ < kMismatchesShown) {
      ADD_FAILURE() << "code at " << position(case_, logical) << ": got 0x" << std::hex
                    << int{codes[index]} << ", want 0x" << int{want.data[logical]};
    }
  });
  EXPECT_EQ(mismatches, 0u) << "codes that differ from the reference";
  size_t clobbered = 0;
  for (size_t i = 0; i < codes.size() && !case_.v_layout; ++i) {
    clobbered += !in_view[i] && codes[i] != kPoisonByte;
  }
  EXPECT_EQ(clobbered, 0u) << "bytes the kernel wrote outside x_fp8's view";

  EXPECT_EQ(std::memcmp(scales.data(), want.descale.data(), want.descale.size() * sizeof(float)), 0)
      << "descale differs from the reference (bitwise)";
  for (size_t i = want.descale.size(); i < scales.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &scales[i], sizeof bits);
    EXPECT_EQ(bits, kPoisonFloatBits) << "the kernel wrote past descale, at " << i;
  }
}

void expect_quantize_matches_reference(const QuantizeCase& c) {
  const QuantizeProblem problem(c, random_quantize_input(c));
  const Status s = problem.quantize(nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "the quantization kernel");
  problem.expect_matches_reference();
}

}  // namespace flash3::test
