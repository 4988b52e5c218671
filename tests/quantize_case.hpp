// One FP8 quantization case on the GPU: random inputs laid out in device
// memory as the case says, poisoned outputs, the call, and a bitwise
// comparison of every code and scale with flash3::ref::quantize_e4m3.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"
#include "forward_case.hpp"

namespace flash3::test {

struct QuantizeCase {
  DType dtype = DType::kBFloat16;
  int headdim = 128;
  int batch = 1;
  int seqlen = 1;
  int heads = 1;
  int block_rows = 128;
  bool hadamard = false;
  uint64_t seed = 0;
  // x the middle third (k) of a packed (q, k, v) buffer, x_fp8 with 16 bytes
  // of padding after each row and batch; else both contiguous.
  bool strided = false;
  // quantize_fp8_v: the codes into an Fp8V tensor (contiguous, guard bytes
  // after it), compared with ref::fp8_v_layout of the reference's codes.
  bool v_layout = false;

  std::string name() const;  // e.g. "bf16_d128_hadamard_b2_s300_h3_block128_seed7_strided"
  QuantizeOptions options() const { return {block_rows, hadamard, seed}; }
  size_t num_scales() const;
};

// x drawn from N(0, 1) plus rare large outliers, each head at its own
// magnitude (fp16 subnormals included), the first block of (batch 0, head 0)
// all zeros; rounded to the case's dtype, seeded by the case's name.
// Contiguous (batch, seqlen, heads, headdim).
std::vector<float> random_quantize_input(const QuantizeCase& c);

// One case on the device: x uploaded (the rest of its buffer poisoned),
// x_fp8's buffer and descale (plus guard elements) poisoned.
class QuantizeProblem {
 public:
  QuantizeProblem(const QuantizeCase& c, const std::vector<float>& x);

  Tensor x() const;
  Tensor x_fp8() const;
  Fp8V v_out() const;  // v_layout: x_fp8's buffer as the Fp8V tensor
  float* descale() const { return static_cast<float*>(descale_.get()); }

  Status quantize(cudaStream_t stream) const;
  flash3_quantize_args c_args() const;

  // After the call has finished: x unchanged, every code and scale bitwise
  // equal to the reference's, nothing written outside x_fp8 and descale.
  void expect_matches_reference() const;

 private:
  QuantizeCase case_;
  std::vector<float> input_;
  View x_view_, x_fp8_view_;
  std::vector<uint16_t> x_staging_;
  size_t x_fp8_bytes_ = 0;
  DeviceBuffer x_, x_fp8_, descale_;
};

// Runs the case on the default stream and checks it (expect_matches_reference).
void expect_quantize_matches_reference(const QuantizeCase& c);

}  // namespace flash3::test
