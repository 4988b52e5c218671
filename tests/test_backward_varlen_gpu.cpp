// backward_varlen against the float64 reference, sequence by sequence
// (reference/serving_ref.hpp), under the tolerance rule: ragged lengths with
// empty sequences, queries longer and shorter than keys, causal and not,
// GQA, every head dim, seqused; the forward_varlen's out and lse as inputs,
// dq, dk and dv poisoned first; the deterministic mode bitwise from run to run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "hopper_test.hpp"
#include "reference/serving_ref.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

constexpr uint16_t kPoison = 0xFFFF;  // a NaN in fp16 and bf16

struct VarlenBackwardCase {
  DType dtype;
  int headdim;
  bool causal;
  std::vector<int> seqlens_q, seqlens_k;
  int heads_q = 4, heads_k = 2;
  bool deterministic = false;
  // seqused: sequence b uses its first used_q[b] / used_k[b] rows (empty: all).
  std::vector<int> used_q = {}, used_k = {};
};

// The packed rows of each sequence's first used[b] rows (all without used).
std::vector<char> used_rows(const std::vector<int>& lengths, const std::vector<int>& used) {
  std::vector<char> rows;
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int i = 0; i < lengths[b]; ++i) {
      rows.push_back(used.empty() || i < used[b]);
    }
  }
  return rows;
}

template <class T>
void upload(DeviceBuffer& d, const std::vector<T>& x, const char* what) {
  check_cuda(cudaMemcpy(d.get(), x.data(), sizeof(T) * x.size(), cudaMemcpyHostToDevice), what);
}

// The varlen problem on the device, forward done: backward() runs the
// backward into poisoned dq, dk, dv and returns their bits.
class VarlenBackwardProblem {
 public:
  explicit VarlenBackwardProblem(const VarlenBackwardCase& c)
      : c_(c),
        type_(half_type(c.dtype)),
        total_q_(cu_seqlens_of(c.seqlens_q).back()),
        total_k_(cu_seqlens_of(c.seqlens_k).back()),
        batch_(static_cast<int>(c.seqlens_q.size())),
        q_elems_(static_cast<size_t>(total_q_) * c.heads_q * c.headdim),
        kv_elems_(static_cast<size_t>(total_k_) * c.heads_k * c.headdim),
        d_q_(q_elems_ * 2 + 16), d_k_(kv_elems_ * 2 + 16), d_v_(kv_elems_ * 2 + 16),
        d_out_(q_elems_ * 2 + 16), d_dout_(q_elems_ * 2 + 16),
        d_lse_(static_cast<size_t>(c.heads_q) * total_q_ * 4 + 16),
        d_dq_(q_elems_ * 2 + 16), d_dk_(kv_elems_ * 2 + 16), d_dv_(kv_elems_ * 2 + 16),
        d_cu_q_(sizeof(int) * (batch_ + 1)), d_cu_k_(sizeof(int) * (batch_ + 1)),
        d_used_q_(sizeof(int) * batch_ + 4), d_used_k_(sizeof(int) * batch_ + 4) {
    std::mt19937_64 rng(4321 + c.headdim + 7 * c.causal + 13 * batch_);
    q = random_halves(type_, q_elems_, rng);
    k = random_halves(type_, kv_elems_, rng);
    v = random_halves(type_, kv_elems_, rng);
    dout = random_halves(type_, q_elems_, rng);
    upload_halves(d_q_.get(), type_, q, "q");
    upload_halves(d_k_.get(), type_, k, "k");
    upload_halves(d_v_.get(), type_, v, "v");
    upload_halves(d_dout_.get(), type_, dout, "dout");
    upload(d_cu_q_, cu_seqlens_of(c.seqlens_q), "cu_seqlens_q");
    upload(d_cu_k_, cu_seqlens_of(c.seqlens_k), "cu_seqlens_k");
    if (!c.used_q.empty()) {
      upload(d_used_q_, c.used_q, "seqused_q");
    }
    if (!c.used_k.empty()) {
      upload(d_used_k_, c.used_k, "seqused_k");
    }
    int max_q = 1;
    for (int l : c.seqlens_q) {
      max_q = std::max(max_q, l);
    }
    varlen_ = Varlen{static_cast<const int*>(d_cu_q_.get()),
                     static_cast<const int*>(d_cu_k_.get()),
                     batch_,
                     max_q,
                     c.used_q.empty() ? nullptr : static_cast<const int*>(d_used_q_.get()),
                     c.used_k.empty() ? nullptr : static_cast<const int*>(d_used_k_.get())};
    ForwardOptions options;
    options.causal = c.causal;
    forward_status = flash3::forward_varlen(tensor_q(d_q_.get()), tensor_k(d_k_.get()),
                                            tensor_k(d_v_.get()), tensor_q(d_out_.get()),
                                            static_cast<float*>(d_lse_.get()), varlen_, options,
                                            nullptr);
    check_cuda(cudaDeviceSynchronize(), "forward_varlen");
  }

  Tensor tensor_q(void* p) const {
    return Tensor::contiguous(p, c_.dtype, 1, total_q_, c_.heads_q, c_.headdim);
  }
  Tensor tensor_k(void* p) const {
    return Tensor::contiguous(p, c_.dtype, 1, total_k_, c_.heads_k, c_.headdim);
  }

  struct Bits {
    std::vector<uint16_t> dq, dk, dv;
  };

  Status backward(Bits* bits) const {
    for (const auto& [buffer, elems] : {std::pair<const DeviceBuffer*, size_t>{&d_dq_, q_elems_},
                                        {&d_dk_, kv_elems_}, {&d_dv_, kv_elems_}}) {
      check_cuda(cudaMemset(buffer->get(), 0xFF, elems * 2), "poison the gradients");
    }
    BackwardOptions options;
    options.causal = c_.causal;
    options.deterministic = c_.deterministic;
    const Status s = flash3::backward_varlen(
        tensor_q(d_dout_.get()), tensor_q(d_q_.get()), tensor_k(d_k_.get()),
        tensor_k(d_v_.get()), tensor_q(d_out_.get()), static_cast<const float*>(d_lse_.get()),
        tensor_q(d_dq_.get()), tensor_k(d_dk_.get()), tensor_k(d_dv_.get()), varlen_, options,
        nullptr);
    if (!s.ok()) {
      return s;
    }
    check_cuda(cudaDeviceSynchronize(), "backward_varlen");
    bits->dq.resize(q_elems_);
    bits->dk.resize(kv_elems_);
    bits->dv.resize(kv_elems_);
    check_cuda(cudaMemcpy(bits->dq.data(), d_dq_.get(), q_elems_ * 2, cudaMemcpyDeviceToHost), "dq");
    check_cuda(cudaMemcpy(bits->dk.data(), d_dk_.get(), kv_elems_ * 2, cudaMemcpyDeviceToHost), "dk");
    check_cuda(cudaMemcpy(bits->dv.data(), d_dv_.get(), kv_elems_ * 2, cudaMemcpyDeviceToHost), "dv");
    return s;
  }

  // The reference on the used rows alone: each sequence cut to its used rows.
  void expect_matches_reference(const Bits& bits) const {
    const std::vector<char> rows_q = used_rows(c_.seqlens_q, c_.used_q);
    const std::vector<char> rows_k = used_rows(c_.seqlens_k, c_.used_k);
    const size_t q_row = static_cast<size_t>(c_.heads_q) * c_.headdim;
    const size_t k_row = static_cast<size_t>(c_.heads_k) * c_.headdim;
    const auto pick = [](const std::vector<float>& x, const std::vector<char>& rows, size_t row) {
      std::vector<float> y;
      for (size_t r = 0; r < rows.size(); ++r) {
        if (rows[r]) {
          y.insert(y.end(), x.begin() + r * row, x.begin() + (r + 1) * row);
        }
      }
      return y;
    };
    const auto pick_bits = [&](const std::vector<uint16_t>& x, const std::vector<char>& rows,
                               size_t row, const char* name) {
      std::vector<float> y;
      for (size_t r = 0; r < rows.size(); ++r) {
        for (size_t i = 0; i < row; ++i) {
          const uint16_t b = x[r * row + i];
          if (rows[r]) {
            y.push_back(ref::half_to_float(type_, b));
          } else {
            EXPECT_EQ(b, kPoison) << name << " row " << r << " is outside the used rows but "
                                  << "was written";
          }
        }
      }
      return y;
    };
    ref::VarlenShape shape;
    std::vector<int> lq = c_.seqlens_q, lk = c_.seqlens_k;
    for (int b = 0; b < batch_; ++b) {
      if (!c_.used_q.empty()) {
        lq[b] = std::min(lq[b], c_.used_q[b]);
      }
      if (!c_.used_k.empty()) {
        lk[b] = std::min(lk[b], c_.used_k[b]);
      }
    }
    shape.cu_seqlens_q = cu_seqlens_of(lq);
    shape.cu_seqlens_k = cu_seqlens_of(lk);
    shape.heads_q = c_.heads_q;
    shape.heads_k = c_.heads_k;
    shape.headdim = c_.headdim;
    const std::vector<float> q_used = pick(q, rows_q, q_row), k_used = pick(k, rows_k, k_row),
                             v_used = pick(v, rows_k, k_row), dout_used = pick(dout, rows_q, q_row);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c_.headdim));
    const ref::Gradients want =
        ref::attention_backward_varlen(shape, q_used, k_used, v_used, dout_used, scale, c_.causal);
    const ref::PlainGradients plain = ref::attention_backward_varlen_plain(
        type_, shape, q_used, k_used, v_used, dout_used, static_cast<float>(scale), c_.causal);
    // With GQA the dK / dV sums are converted for every row, so the unused
    // rows hold zeros there rather than the poison.
    const bool gqa = c_.heads_q != c_.heads_k;
    const std::vector<char> all_k(rows_k.size(), 1);
    const std::vector<float> dq = pick_bits(bits.dq, rows_q, q_row, "dq");
    std::vector<float> dk = pick_bits(bits.dk, gqa ? all_k : rows_k, k_row, "dk");
    std::vector<float> dv = pick_bits(bits.dv, gqa ? all_k : rows_k, k_row, "dv");
    if (gqa) {
      for (size_t r = 0; r < rows_k.size(); ++r) {
        for (size_t i = 0; !rows_k[r] && i < k_row; ++i) {
          EXPECT_EQ(dk[r * k_row + i], 0.0f) << "GQA dk of an unused row";
          EXPECT_EQ(dv[r * k_row + i], 0.0f) << "GQA dv of an unused row";
        }
      }
      dk = pick(dk, rows_k, k_row);
      dv = pick(dv, rows_k, k_row);
    }
    for (const auto& [name, got, p, w] :
         {std::tuple<const char*, const std::vector<float>&, const std::vector<float>&,
                     const std::vector<double>&>{"dq", dq, plain.dq, want.dq},
          {"dk", dk, plain.dk, want.dk},
          {"dv", dv, plain.dv, want.dv}}) {
      const ref::Verdict verdict = ref::check_gradient(name, got, p, w);
      EXPECT_TRUE(verdict.ok) << verdict.message;
    }
  }

  Status forward_status;

 private:
  VarlenBackwardCase c_;
  ref::HalfType type_;
  int total_q_, total_k_, batch_;
  size_t q_elems_, kv_elems_;
  std::vector<float> q, k, v, dout;
  DeviceBuffer d_q_, d_k_, d_v_, d_out_, d_dout_, d_lse_, d_dq_, d_dk_, d_dv_;
  DeviceBuffer d_cu_q_, d_cu_k_, d_used_q_, d_used_k_;
  Varlen varlen_;
};

void expect_varlen_backward_matches_reference(const VarlenBackwardCase& c) {
  const VarlenBackwardProblem problem(c);
  if (problem.forward_status.code == StatusCode::kUnsupported) {
    GTEST_SKIP() << problem.forward_status.message;
  }
  ASSERT_TRUE(problem.forward_status.ok()) << problem.forward_status.message;
  VarlenBackwardProblem::Bits bits;
  const Status s = problem.backward(&bits);
  if (s.code == StatusCode::kUnsupported) {
    GTEST_SKIP() << s.message;
  }
  ASSERT_TRUE(s.ok()) << s.message;
  problem.expect_matches_reference(bits);
}

class BackwardVarlen : public HopperTest {};

TEST_F(BackwardVarlen, RaggedBatchesMatchTheReference) {
  const std::vector<int> seqlens_q = {17, 0, 1, 300, 129, 1000, 64, 5};
  const std::vector<int> seqlens_k = {40, 5, 0, 300, 700, 1000, 7, 0};
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("headdim " + std::to_string(headdim) + (causal ? " causal" : ""));
      expect_varlen_backward_matches_reference(
          {DType::kBFloat16, headdim, causal, seqlens_q, seqlens_k, 4, 4});
      expect_varlen_backward_matches_reference(
          {DType::kFloat16, headdim, causal, seqlens_q, seqlens_k, 6, 2});
    }
  }
}

TEST_F(BackwardVarlen, MqaAndOneLongSequence) {
  std::vector<int> lengths(24, 33);
  lengths[7] = 2500;
  expect_varlen_backward_matches_reference(
      {DType::kBFloat16, 128, true, lengths, lengths, 8, 1});
}

TEST_F(BackwardVarlen, SequsedLeavesTheOtherRowsUnwritten) {
  for (const bool causal : {false, true}) {
    for (const int heads_k : {4, 2}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "non-causal") + " heads_k " +
                   std::to_string(heads_k));
      expect_varlen_backward_matches_reference({DType::kBFloat16, 128, causal,
                                                {100, 70, 3, 200},
                                                {90, 300, 8, 129},
                                                4,
                                                heads_k,
                                                false,
                                                {60, 70, 0, 131},
                                                {90, 1, 8, 64}});
    }
  }
}

TEST_F(BackwardVarlen, DeterministicIsBitwiseRepeatable) {
  for (const int heads_k : {4, 1}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "non-causal") + " heads_k " +
                   std::to_string(heads_k));
      const VarlenBackwardCase c{DType::kBFloat16, 64, causal, {700, 1, 0, 300, 513},
                                 {900, 40, 7, 300, 128}, 4, heads_k, true};
      const VarlenBackwardProblem problem(c);
      if (problem.forward_status.code == StatusCode::kUnsupported) {
        GTEST_SKIP() << problem.forward_status.message;  // a build without the kernel
      }
      ASSERT_TRUE(problem.forward_status.ok()) << problem.forward_status.message;
      VarlenBackwardProblem::Bits first;
      const Status s = problem.backward(&first);
      if (s.code == StatusCode::kUnsupported) {
        GTEST_SKIP() << s.message;
      }
      ASSERT_TRUE(s.ok()) << s.message;
      problem.expect_matches_reference(first);
      for (int run = 1; run < 5; ++run) {
        VarlenBackwardProblem::Bits again;
        ASSERT_TRUE(problem.backward(&again).ok());
        EXPECT_EQ(again.dq, first.dq) << "dq differs in run " << run;
        EXPECT_EQ(again.dk, first.dk) << "dk differs in run " << run;
        EXPECT_EQ(again.dv, first.dv) << "dv differs in run " << run;
      }
    }
  }
}

// The offsets are read on the device: host memory is refused by name
// before anything is launched (a kernel would fault on it).
TEST_F(BackwardVarlen, HostOffsetsAreRefusedByName) {
  const int total = 64, heads = 2, d = 64;
  const size_t elems = static_cast<size_t>(total) * heads * d;
  DeviceBuffer buffers[8] = {DeviceBuffer(elems * 2), DeviceBuffer(elems * 2),
                             DeviceBuffer(elems * 2), DeviceBuffer(elems * 2),
                             DeviceBuffer(elems * 2), DeviceBuffer(elems * 2),
                             DeviceBuffer(elems * 2), DeviceBuffer(elems * 2)};
  DeviceBuffer lse(static_cast<size_t>(heads) * total * 4);
  const auto t = [&](int i) {
    return Tensor::contiguous(buffers[i].get(), DType::kBFloat16, 1, total, heads, d);
  };
  const int host_cu[3] = {0, 30, total};
  const Varlen varlen{host_cu, host_cu, 2, 34};
  const Status s = flash3::backward_varlen(t(0), t(1), t(2), t(3), t(4),
                                           static_cast<const float*>(lse.get()), t(5), t(6), t(7),
                                           varlen);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find("varlen.cu_seqlens_q"), std::string::npos) << s.message;
}

// Small cases for compute-sanitizer: --gtest_filter='Sanitize*'.
class SanitizeBackwardVarlen : public HopperTest {};

TEST_F(SanitizeBackwardVarlen, Bf16D128RaggedCausalGqa) {
  expect_varlen_backward_matches_reference(
      {DType::kBFloat16, 128, true, {17, 0, 300, 129}, {40, 5, 300, 7}, 4, 2});
}

TEST_F(SanitizeBackwardVarlen, Fp16D64SequsedDeterministic) {
  expect_varlen_backward_matches_reference(
      {DType::kFloat16, 64, false, {1, 200, 0}, {90, 0, 257}, 2, 2, true, {1, 150, 0}, {80, 0, 200}});
}

}  // namespace
}  // namespace flash3::test
