// forward_varlen against the float64 reference, sequence by sequence
// (reference/serving_ref.hpp), under the tolerance rule: ragged lengths with
// empty sequences, queries longer and shorter than keys, causal and not, GQA,
// every head dim; out and lse poisoned first, and rows outside the sequences
// left untouched.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "hopper_test.hpp"
#include "reference/serving_ref.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr uint16_t kPoison = 0xFFFF;  // a NaN in fp16 and bf16

struct VarlenCase {
  DType dtype;
  int headdim;
  bool causal;
  std::vector<int> seqlens_q, seqlens_k;
  int heads_q = 4, heads_k = 2;
};

void expect_varlen_matches_reference(const VarlenCase& c) {
  const ref::HalfType type = half_type(c.dtype);
  ref::VarlenShape shape;
  shape.cu_seqlens_q = cu_seqlens_of(c.seqlens_q);
  shape.cu_seqlens_k = cu_seqlens_of(c.seqlens_k);
  shape.heads_q = c.heads_q;
  shape.heads_k = c.heads_k;
  shape.headdim = c.headdim;
  const int total_q = shape.total_q(), total_k = shape.total_k(), batch = shape.batch();
  std::mt19937_64 rng(1234 + c.headdim + 7 * c.causal);
  const size_t q_elems = static_cast<size_t>(total_q) * c.heads_q * c.headdim;
  const size_t kv_elems = static_cast<size_t>(total_k) * c.heads_k * c.headdim;
  const std::vector<float> q = random_halves(type, q_elems, rng),
                           k = random_halves(type, kv_elems, rng),
                           v = random_halves(type, kv_elems, rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.headdim));
  const ref::Reference expected =
      ref::attention_forward_varlen(shape, q, k, v, scale, c.causal);
  // The plain same-dtype result, sequence by sequence, for the tolerance rule.
  const std::vector<float> plain = ref::attention_forward_varlen_plain(
      type, shape, q, k, v, static_cast<float>(scale), c.causal);

  // One padding row each side of out, to see that nothing outside is written.
  const size_t row = static_cast<size_t>(c.heads_q) * c.headdim;
  DeviceBuffer d_q(q_elems * 2 + 16), d_k(kv_elems * 2 + 16), d_v(kv_elems * 2 + 16),
      d_out((q_elems + 2 * row) * 2), d_lse(static_cast<size_t>(c.heads_q) * total_q * 4 + 4),
      d_cu_q(sizeof(int) * (batch + 1)), d_cu_k(sizeof(int) * (batch + 1));
  upload_halves(d_q.get(), type, q, "q");
  upload_halves(d_k.get(), type, k, "k");
  upload_halves(d_v.get(), type, v, "v");
  check_cuda(cudaMemset(d_out.get(), 0xFF, (q_elems + 2 * row) * 2), "poison out");
  check_cuda(cudaMemset(d_lse.get(), 0xFF, static_cast<size_t>(c.heads_q) * total_q * 4), "lse");
  check_cuda(cudaMemcpy(d_cu_q.get(), shape.cu_seqlens_q.data(), sizeof(int) * (batch + 1),
                        cudaMemcpyHostToDevice), "cu_seqlens_q");
  check_cuda(cudaMemcpy(d_cu_k.get(), shape.cu_seqlens_k.data(), sizeof(int) * (batch + 1),
                        cudaMemcpyHostToDevice), "cu_seqlens_k");
  uint16_t* out_rows = static_cast<uint16_t*>(d_out.get()) + row;
  const Tensor tq = Tensor::contiguous(d_q.get(), c.dtype, 1, total_q, c.heads_q, c.headdim);
  const Tensor tk = Tensor::contiguous(d_k.get(), c.dtype, 1, total_k, c.heads_k, c.headdim);
  const Tensor tv = Tensor::contiguous(d_v.get(), c.dtype, 1, total_k, c.heads_k, c.headdim);
  const Tensor to = Tensor::contiguous(out_rows, c.dtype, 1, total_q, c.heads_q, c.headdim);
  int max_q = 1;
  for (int l : c.seqlens_q) {
    max_q = std::max(max_q, l);
  }
  const Varlen varlen{static_cast<const int*>(d_cu_q.get()), static_cast<const int*>(d_cu_k.get()),
                      batch, max_q};
  ForwardOptions options;
  options.causal = c.causal;
  const Status s = flash3::forward_varlen(tq, tk, tv, to, static_cast<float*>(d_lse.get()), varlen,
                                          options, nullptr);
  if (s.code == StatusCode::kUnsupported) {
    GTEST_SKIP() << s.message;
  }
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "forward_varlen");
  std::vector<uint16_t> got_bits(q_elems + 2 * row);
  check_cuda(cudaMemcpy(got_bits.data(), d_out.get(), got_bits.size() * 2, cudaMemcpyDeviceToHost),
             "out");
  for (size_t i = 0; i < row; ++i) {
    ASSERT_EQ(got_bits[i], kPoison) << "written before out";
    ASSERT_EQ(got_bits[row + q_elems + i], kPoison) << "written past out";
  }
  std::vector<float> got(q_elems);
  for (size_t i = 0; i < q_elems; ++i) {
    got[i] = ref::half_to_float(type, got_bits[row + i]);
  }
  const ref::Verdict out_verdict = ref::check_output(got, plain, expected.out);
  EXPECT_TRUE(out_verdict.ok) << out_verdict.message;
  std::vector<float> lse(static_cast<size_t>(c.heads_q) * total_q);
  check_cuda(cudaMemcpy(lse.data(), d_lse.get(), lse.size() * 4, cudaMemcpyDeviceToHost), "lse");
  const ref::Verdict lse_verdict = ref::check_lse(lse, expected.lse);
  EXPECT_TRUE(lse_verdict.ok) << lse_verdict.message;
}

class ForwardVarlen : public HopperTest {};

TEST_F(ForwardVarlen, RaggedBatchesMatchTheReference) {
  const std::vector<int> seqlens_q = {17, 0, 1, 300, 129, 1000, 64};
  const std::vector<int> seqlens_k = {40, 5, 0, 300, 700, 1000, 7};
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("headdim " + std::to_string(headdim) + (causal ? " causal" : ""));
      expect_varlen_matches_reference({DType::kBFloat16, headdim, causal, seqlens_q, seqlens_k});
    }
  }
  expect_varlen_matches_reference({DType::kFloat16, 128, true, seqlens_q, seqlens_k, 8, 1});
}

TEST_F(ForwardVarlen, OneLongAndManyShortSequences) {
  std::vector<int> lengths(40, 33);
  lengths[7] = 4000;
  expect_varlen_matches_reference({DType::kBFloat16, 128, true, lengths, lengths});
}

// Small cases for compute-sanitizer: --gtest_filter='SanitizeForward*'.
class SanitizeForwardVarlen : public HopperTest {};

TEST_F(SanitizeForwardVarlen, Bf16D128RaggedCausal) {
  expect_varlen_matches_reference({DType::kBFloat16, 128, true, {17, 0, 300, 129}, {40, 5, 300, 7}});
}

TEST_F(SanitizeForwardVarlen, Fp16D256RaggedGqa) {
  expect_varlen_matches_reference({DType::kFloat16, 256, false, {1, 200, 0}, {90, 0, 257}, 8, 2});
}

}  // namespace
}  // namespace flash3::test
