// Internal description of one validated forward call: what the kernels see.
#pragma once

#include <cstdint>

#include "flash3/flash3.hpp"

namespace flash3::detail {

// Element strides of a (batch, seqlen, heads, headdim) tensor, headdim contiguous.
struct Strides3 {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;
};

struct ForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* softmax_lse = nullptr;  // contiguous (batch, heads_q, seqlen_q), or null

  DType dtype = DType::kBFloat16;
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_k = 0;
  int headdim = 0;
  Strides3 q_stride, k_stride, v_stride, out_stride;

  float softmax_scale = 0.0f;  // resolved: never 0 here
  bool causal = false;

  int device = 0;     // filled by the device check
  int num_sms = 0;
};

}  // namespace flash3::detail
