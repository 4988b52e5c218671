// Small helpers shared by the CPU and GPU suites.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"

namespace flash3::test {

// CUDA devices visible to this process; 0 when there is no driver either.
inline int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

inline flash3_tensor to_c(const Tensor& t) {
  flash3_tensor c{};
  c.data = t.data;
  c.dtype = static_cast<flash3_dtype>(t.dtype);
  for (int i = 0; i < 4; ++i) {
    c.shape[i] = t.shape[i];
    c.stride[i] = t.stride[i];
  }
  return c;
}

// The masked kernels' options into a forward's or a backward's C arguments.
template <class Args, class Options>
void set_c_mask_args(Args* args, const Options& options) {
  args->window = options.window_left != -1 || options.window_right != -1 ? 1 : 0;
  args->window_left = options.window_left;
  args->window_right = options.window_right;
  args->attention_chunk = options.attention_chunk;
  args->softcap = options.softcap;
}

inline flash3_forward_args to_c_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, float* softmax_lse,
                                     const ForwardOptions& options) {
  flash3_forward_args args{};
  args.q = to_c(q);
  args.k = to_c(k);
  args.v = to_c(v);
  args.out = to_c(out);
  args.softmax_lse = softmax_lse;
  args.softmax_scale = options.softmax_scale;
  args.causal = options.causal ? 1 : 0;
  args.workspace = options.workspace;
  args.workspace_bytes = options.workspace_bytes;
  args.sinks = options.sinks;
  set_c_mask_args(&args, options);
  return args;
}

inline flash3_quantize_args to_c_args(const Tensor& x, const Tensor& x_fp8, float* descale,
                                      const QuantizeOptions& options) {
  flash3_quantize_args args{};
  args.x = to_c(x);
  args.x_fp8 = to_c(x_fp8);
  args.descale = descale;
  args.block_rows = options.block_rows;
  args.hadamard = options.hadamard ? 1 : 0;
  args.seed = options.seed;
  return args;
}

inline flash3_fp8_v to_c(const Fp8V& v) {
  flash3_fp8_v c{};
  c.data = v.data;
  c.batch = v.batch;
  c.seqlen = v.seqlen;
  c.heads = v.heads;
  c.headdim = v.headdim;
  return c;
}

inline flash3_fp8_descale to_c(const Fp8Descale& d) {
  flash3_fp8_descale c{};
  c.data = d.data;
  c.block_rows = d.block_rows;
  return c;
}

inline flash3_forward_fp8_args to_c_args(const Tensor& q, const Tensor& k, const Fp8V& v,
                                         const Tensor& out, float* softmax_lse,
                                         const Fp8Descales& descales,
                                         const ForwardOptions& options) {
  flash3_forward_fp8_args args{};
  args.q = to_c(q);
  args.k = to_c(k);
  args.v = to_c(v);
  args.out = to_c(out);
  args.softmax_lse = softmax_lse;
  args.q_descale = to_c(descales.q);
  args.k_descale = to_c(descales.k);
  args.v_descale = to_c(descales.v);
  args.softmax_scale = options.softmax_scale;
  args.causal = options.causal ? 1 : 0;
  args.workspace = options.workspace;
  args.workspace_bytes = options.workspace_bytes;
  return args;
}

inline flash3_fp8_v_layout_args to_c_args(const Tensor& v, const Fp8V& v_out) {
  flash3_fp8_v_layout_args args{};
  args.v = to_c(v);
  args.v_out = to_c(v_out);
  return args;
}

// Host memory, aligned as TMA wants device memory, filled with a byte pattern
// so a test can tell whether anything wrote to it.
class PoisonedBuffer {
 public:
  static constexpr unsigned char kPoison = 0xA5;

  explicit PoisonedBuffer(size_t bytes) : blocks_((bytes + sizeof(Block) - 1) / sizeof(Block)) {
    std::memset(blocks_.data(), kPoison, blocks_.size() * sizeof(Block));
  }

  unsigned char* data() { return blocks_.data()->bytes; }

  bool untouched() const {
    for (const Block& block : blocks_) {
      for (unsigned char byte : block.bytes) {
        if (byte != kPoison) {
          return false;
        }
      }
    }
    return true;
  }

 private:
  struct alignas(64) Block {
    unsigned char bytes[64];
  };
  std::vector<Block> blocks_;
};

}  // namespace flash3::test
