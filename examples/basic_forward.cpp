// basic_forward: causal grouped-query attention with flash3, checked on the CPU.
//
// 16 query heads share 4 key/value heads (GQA), head dim 128, 1000 tokens,
// bfloat16. Prints a checksum of the output and compares one output row and its
// log-sum-exp with a plain float softmax computed here.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "example_util.hpp"
#include "flash3/flash3.hpp"

int main() {
  const int batch = 2, seqlen = 1000, heads_q = 16, heads_k = 4, headdim = 128;
  const size_t q_elems = size_t{1} * batch * seqlen * heads_q * headdim;
  const size_t kv_elems = size_t{1} * batch * seqlen * heads_k * headdim;
  const size_t lse_elems = size_t{1} * batch * heads_q * seqlen;

  // Random N(0, 1) inputs on the host.
  std::vector<uint16_t> q(q_elems), k(kv_elems), v(kv_elems), out(q_elems);
  fill_normal_bf16({&q, &k, &v}, 2024);
  if (!have_cuda_device()) return 1;
  void *dq, *dk, *dv, *dout;
  float* dlse;
  CUDA_CHECK(cudaMalloc(&dq, q_elems * 2));
  CUDA_CHECK(cudaMalloc(&dk, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&dv, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&dout, q_elems * 2));
  CUDA_CHECK(cudaMalloc(&dlse, lse_elems * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(dq, q.data(), q_elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dk, k.data(), kv_elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dv, v.data(), kv_elems * 2, cudaMemcpyHostToDevice));

  // Tensors are (batch, seqlen, heads, headdim); contiguous() fills the strides.
  using flash3::DType;
  using flash3::Tensor;
  flash3::ForwardOptions options;
  options.causal = true;  // softmax_scale 0: 1/sqrt(headdim)
  flash3::Status status = flash3::forward(
      Tensor::contiguous(dq, DType::kBFloat16, batch, seqlen, heads_q, headdim),
      Tensor::contiguous(dk, DType::kBFloat16, batch, seqlen, heads_k, headdim),
      Tensor::contiguous(dv, DType::kBFloat16, batch, seqlen, heads_k, headdim),
      Tensor::contiguous(dout, DType::kBFloat16, batch, seqlen, heads_q, headdim), dlse,
      options, /*stream=*/nullptr);
  if (!status.ok()) {
    std::fprintf(stderr, "flash3::forward failed: %s\n", status.message.c_str());
    return 1;
  }
  std::vector<float> lse(lse_elems);
  CUDA_CHECK(cudaMemcpy(out.data(), dout, q_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(lse.data(), dlse, lse_elems * sizeof(float), cudaMemcpyDeviceToHost));

  double checksum = 0;
  for (uint16_t x : out) checksum += from_bf16(x);
  std::printf("flash3 %s: out[%d, %d, %d, %d] checksum %.6f\n", flash3::version(), batch,
              seqlen, heads_q, headdim, checksum);

  // One query row on the CPU: row i of query head h sees keys 0..i of the key
  // head h / (heads_q / heads_k).
  const int b = 1, h = 7, i = 613, hk = h / (heads_q / heads_k);
  auto at = [&](const std::vector<uint16_t>& t, int heads, int s, int head, int d) {
    return from_bf16(t[((size_t{1} * b * seqlen + s) * heads + head) * headdim + d]);
  };
  const float scale = 1.0f / std::sqrt(float(headdim));
  std::vector<float> p(i + 1);
  float row_max = -INFINITY, row_sum = 0;
  for (int j = 0; j <= i; ++j) {
    float s = 0;
    for (int d = 0; d < headdim; ++d) s += at(q, heads_q, i, h, d) * at(k, heads_k, j, hk, d);
    p[j] = s * scale;
    row_max = std::fmax(row_max, p[j]);
  }
  for (float& x : p) {
    x = std::exp(x - row_max);
    row_sum += x;
  }
  float max_err = 0;
  for (int d = 0; d < headdim; ++d) {
    float o = 0;
    for (int j = 0; j <= i; ++j) o += p[j] * at(v, heads_k, j, hk, d);
    max_err = std::fmax(max_err, std::fabs(o / row_sum - at(out, heads_q, i, h, d)));
  }
  const float lse_err =
      std::fabs(row_max + std::log(row_sum) - lse[(size_t{1} * b * heads_q + h) * seqlen + i]);
  const bool ok = max_err < 2e-2f && lse_err < 1e-3f;
  std::printf("CPU check of row (b=%d, h=%d, i=%d): max |out error| %.2e, |lse error| %.2e: %s\n",
              b, h, i, max_err, lse_err, ok ? "OK" : "TOO LARGE");

  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  cudaFree(dlse);
  return ok ? 0 : 1;
}
