// fp8_forward: FP8 attention from bfloat16 inputs with flash3, checked on the CPU.
//
// Quantizes q, k (block scales of 128 rows plus the randomized Hadamard
// transform: incoherent processing) and v (block scales, straight into the
// transposed layout the FP8 kernel reads) to e4m3, runs the FP8 forward with a
// bfloat16 output, and compares one output row with a float softmax of the
// original bfloat16 inputs computed here. Head dim 128, 2 x 8 heads, 2048
// tokens, non-causal.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "example_util.hpp"
#include "flash3/flash3.hpp"

int main() {
  const int batch = 2, seqlen = 2048, heads = 8, headdim = 128, block_rows = 128;
  const size_t elems = size_t{1} * batch * seqlen * heads * headdim;
  const size_t scales = size_t{1} * batch * heads * ((seqlen + block_rows - 1) / block_rows);
  const uint64_t seed = 7;  // the same for q and k: their transforms cancel in q k^T

  std::vector<uint16_t> q(elems), k(elems), v(elems), out(elems);
  fill_normal_bf16({&q, &k, &v}, 2024);
  if (!have_cuda_device()) return 1;
  void *dq, *dk, *dv, *dq8, *dk8, *dv8_layout, *dout;
  float *dq_scale, *dk_scale, *dv_scale;
  using flash3::DType;
  using flash3::Tensor;
  const flash3::Fp8V v_layout{nullptr, batch, seqlen, heads, headdim};
  for (void** p : {&dq, &dk, &dv, &dout}) CUDA_CHECK(cudaMalloc(p, elems * 2));
  for (void** p : {&dq8, &dk8}) CUDA_CHECK(cudaMalloc(p, elems));
  CUDA_CHECK(cudaMalloc(&dv8_layout, v_layout.bytes()));
  for (float** p : {&dq_scale, &dk_scale, &dv_scale}) {
    CUDA_CHECK(cudaMalloc(p, scales * sizeof(float)));
  }
  CUDA_CHECK(cudaMemcpy(dq, q.data(), elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dk, k.data(), elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dv, v.data(), elems * 2, cudaMemcpyHostToDevice));

  auto tensor = [&](void* p, DType dtype) {
    return Tensor::contiguous(p, dtype, batch, seqlen, heads, headdim);
  };
  auto bf16 = [&](void* p) { return tensor(p, DType::kBFloat16); };
  auto e4m3 = [&](void* p) { return tensor(p, DType::kFloat8E4M3); };
  flash3::QuantizeOptions qk_options;
  qk_options.block_rows = block_rows;
  qk_options.hadamard = true;
  qk_options.seed = seed;
  flash3::QuantizeOptions v_options;
  v_options.block_rows = block_rows;
  FLASH3_CHECK(flash3::quantize_fp8(bf16(dq), e4m3(dq8), dq_scale, qk_options));
  FLASH3_CHECK(flash3::quantize_fp8(bf16(dk), e4m3(dk8), dk_scale, qk_options));
  flash3::Fp8V v8 = v_layout;
  v8.data = dv8_layout;
  FLASH3_CHECK(flash3::quantize_fp8_v(bf16(dv), v8, dv_scale, v_options));
  const flash3::Fp8Descales descales{{dq_scale, block_rows}, {dk_scale, block_rows},
                                     {dv_scale, block_rows}};
  FLASH3_CHECK(flash3::forward_fp8(e4m3(dq8), e4m3(dk8), v8, bf16(dout), /*softmax_lse=*/nullptr,
                                   descales));
  CUDA_CHECK(cudaMemcpy(out.data(), dout, elems * 2, cudaMemcpyDeviceToHost));

  // One query row on the CPU from the bfloat16 inputs.
  const int b = 1, h = 5, i = 1234;
  auto at = [&](const std::vector<uint16_t>& t, int s, int d) {
    return from_bf16(t[((size_t{1} * b * seqlen + s) * heads + h) * headdim + d]);
  };
  const float scale = 1.0f / std::sqrt(float(headdim));
  std::vector<float> p(seqlen);
  float row_max = -INFINITY, row_sum = 0;
  for (int j = 0; j < seqlen; ++j) {
    float s = 0;
    for (int d = 0; d < headdim; ++d) s += at(q, i, d) * at(k, j, d);
    p[j] = s * scale;
    row_max = std::fmax(row_max, p[j]);
  }
  for (float& x : p) {
    x = std::exp(x - row_max);
    row_sum += x;
  }
  double err2 = 0, ref2 = 0;
  for (int d = 0; d < headdim; ++d) {
    float o = 0;
    for (int j = 0; j < seqlen; ++j) o += p[j] * at(v, j, d);
    o /= row_sum;
    err2 += double(o - at(out, i, d)) * (o - at(out, i, d));
    ref2 += double(o) * o;
  }
  // FP8 keeps about 3 significant bits of each operand: expect a relative
  // error of a few percent on one row (bf16 gives ~0.3%).
  const double rel = std::sqrt(err2 / ref2);
  const bool ok = rel < 0.1;
  std::printf("flash3 %s FP8 forward: CPU check of row (b=%d, h=%d, i=%d) against the bf16 "
              "inputs: relative RMS error %.2e: %s\n",
              flash3::version(), b, h, i, rel, ok ? "OK" : "TOO LARGE");

  for (void* p : {dq, dk, dv, dq8, dk8, dv8_layout, dout}) cudaFree(p);
  for (float* p : {dq_scale, dk_scale, dv_scale}) cudaFree(p);
  return ok ? 0 : 1;
}
