// basic_backward: gradients of causal grouped-query attention with flash3, checked on the CPU.
//
// 4 query heads share 2 key/value heads (GQA), head dim 64, 300 tokens, bfloat16.
// The forward writes out and its log-sum-exp, which the backward needs; the
// backward's workspace is sized by backward_workspace_size() and owned here.
// Checks dq of one query row and dv of one key row against a float softmax
// computed here.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "example_util.hpp"
#include "flash3/flash3.hpp"

int main() {
  const int batch = 1, seqlen = 300, heads_q = 4, heads_k = 2, headdim = 64;
  const size_t q_elems = size_t{1} * batch * seqlen * heads_q * headdim;
  const size_t kv_elems = size_t{1} * batch * seqlen * heads_k * headdim;

  std::vector<uint16_t> q(q_elems), k(kv_elems), v(kv_elems), dout(q_elems);
  fill_normal_bf16({&q, &k, &v, &dout}, 7);
  if (!have_cuda_device()) return 1;
  // Device buffers: inputs, out, dout, the gradients, the log-sum-exp.
  void *d_q, *d_k, *d_v, *d_out, *d_dout, *d_dq, *d_dk, *d_dv;
  float* d_lse;
  for (void** p : {&d_q, &d_out, &d_dout, &d_dq}) CUDA_CHECK(cudaMalloc(p, q_elems * 2));
  for (void** p : {&d_k, &d_v, &d_dk, &d_dv}) CUDA_CHECK(cudaMalloc(p, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&d_lse, size_t{1} * batch * heads_q * seqlen * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(d_q, q.data(), q_elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_k, k.data(), kv_elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_v, v.data(), kv_elems * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_dout, dout.data(), q_elems * 2, cudaMemcpyHostToDevice));

  using flash3::DType;
  using flash3::Tensor;
  auto q_like = [&](void* data) {
    return Tensor::contiguous(data, DType::kBFloat16, batch, seqlen, heads_q, headdim);
  };
  auto kv_like = [&](void* data) {
    return Tensor::contiguous(data, DType::kBFloat16, batch, seqlen, heads_k, headdim);
  };
  flash3::ForwardOptions forward_options;
  forward_options.causal = true;
  FLASH3_CHECK(flash3::forward(q_like(d_q), kv_like(d_k), kv_like(d_v), q_like(d_out), d_lse,
                               forward_options, nullptr));

  flash3::BackwardOptions options;
  options.causal = true;  // as the forward; softmax_scale 0: 1/sqrt(headdim)
  size_t workspace_bytes = 0;
  FLASH3_CHECK(flash3::backward_workspace_size(q_like(d_q), kv_like(d_k), options,
                                               &workspace_bytes));
  void* workspace = nullptr;
  CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));  // 256-byte aligned
  options.workspace = workspace;
  options.workspace_bytes = workspace_bytes;
  FLASH3_CHECK(flash3::backward(q_like(d_dout), q_like(d_q), kv_like(d_k), kv_like(d_v),
                                q_like(d_out), d_lse, q_like(d_dq), kv_like(d_dk),
                                kv_like(d_dv), options, nullptr));
  std::vector<uint16_t> dq(q_elems), dv(kv_elems);
  CUDA_CHECK(cudaMemcpy(dq.data(), d_dq, q_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(dv.data(), d_dv, kv_elems * 2, cudaMemcpyDeviceToHost));
  std::printf("flash3 %s: backward with a %zu-byte workspace\n", flash3::version(),
              workspace_bytes);

  // The CPU side: P of query head h (rows i, keys j <= i), in float.
  auto at = [&](const std::vector<uint16_t>& t, int heads, int s, int head, int d) {
    return from_bf16(t[(size_t{1} * s * heads + head) * headdim + d]);
  };
  const float scale = 1.0f / std::sqrt(float(headdim));
  auto probs = [&](int h, int i) {  // row i of P for query head h
    const int hk = h / (heads_q / heads_k);
    std::vector<float> p(i + 1);
    float top = -INFINITY, sum = 0;
    for (int j = 0; j <= i; ++j) {
      float s = 0;
      for (int d = 0; d < headdim; ++d) s += at(q, heads_q, i, h, d) * at(k, heads_k, j, hk, d);
      p[j] = s * scale;
      top = std::fmax(top, p[j]);
    }
    for (float& x : p) sum += (x = std::exp(x - top));
    for (float& x : p) x /= sum;
    return p;
  };
  auto dot = [&](const std::vector<uint16_t>& a, int heads_a, int sa, int ha,
                 const std::vector<uint16_t>& b, int heads_b, int sb, int hb) {
    float s = 0;
    for (int d = 0; d < headdim; ++d) s += at(a, heads_a, sa, ha, d) * at(b, heads_b, sb, hb, d);
    return s;
  };

  // dq of row i of head h: scale * sum_j P_ij (dO_i . V_j - D_i) K_j, D_i = sum_j P_ij dO_i . V_j.
  const int h = 3, i = 211, hk = h / (heads_q / heads_k);
  const std::vector<float> p = probs(h, i);
  std::vector<float> dp(i + 1);
  float rowsum = 0;
  for (int j = 0; j <= i; ++j) rowsum += p[j] * (dp[j] = dot(dout, heads_q, i, h, v, heads_k, j, hk));
  float dq_err = 0;
  for (int d = 0; d < headdim; ++d) {
    float g = 0;
    for (int j = 0; j <= i; ++j) g += p[j] * (dp[j] - rowsum) * at(k, heads_k, j, hk, d);
    dq_err = std::fmax(dq_err, std::fabs(scale * g - at(dq, heads_q, i, h, d)));
  }
  // dv of key j of K/V head 0: sum over its query heads and the rows that see it.
  const int j = 150;
  std::vector<float> dv_ref(headdim, 0.0f);
  for (int hq = 0; hq < heads_q / heads_k; ++hq) {
    for (int r = j; r < seqlen; ++r) {
      const float pr = probs(hq, r)[j];
      for (int d = 0; d < headdim; ++d) dv_ref[d] += pr * at(dout, heads_q, r, hq, d);
    }
  }
  float dv_err = 0;
  for (int d = 0; d < headdim; ++d) {
    dv_err = std::fmax(dv_err, std::fabs(dv_ref[d] - at(dv, heads_k, j, 0, d)));
  }
  const bool ok = dq_err < 3e-2f && dv_err < 3e-2f;
  std::printf("CPU check: max |dq error| %.2e (row %d of head %d), max |dv error| %.2e "
              "(key %d of kv head 0): %s\n",
              dq_err, i, h, dv_err, j, ok ? "OK" : "TOO LARGE");

  for (void* ptr : {d_q, d_k, d_v, d_out, d_dout, d_dq, d_dk, d_dv, workspace}) cudaFree(ptr);
  cudaFree(d_lse);
  return ok ? 0 : 1;
}
