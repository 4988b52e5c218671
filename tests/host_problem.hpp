// Valid forward, quantize_fp8, forward_fp8 and fp8_v_layout calls over
// poisoned host buffers. Validation never touches the memory behind the
// pointers, so the CPU suites mutate one argument at a time and check that
// the call is refused and the buffers are unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "test_support.hpp"

namespace flash3::test {

// t made contiguous with the given shape, same data and dtype.
inline void set_dims(Tensor& t, int64_t batch, int64_t seqlen, int64_t heads, int64_t headdim) {
  t = Tensor::contiguous(t.data, t.dtype, batch, seqlen, heads, headdim);
}

inline void* offset_bytes(void* base, size_t bytes) {
  return static_cast<unsigned char*>(base) + bytes;
}

// An address validation never dereferences, far from every real buffer.
inline void* far_address(int slot) {
  constexpr int kSlotShift = 44;
  return reinterpret_cast<void*>(uintptr_t{static_cast<uintptr_t>(slot)} << kSlotShift);
}

struct HostProblem {
  // Base shape: batch 2, seqlen_q 8, seqlen_k 16, heads_q 4, heads_k 2, headdim 64.
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kSeqlenQ = 8;
  static constexpr int64_t kSeqlenK = 16;
  static constexpr int64_t kHeadsQ = 4;
  static constexpr int64_t kHeadsK = 2;
  static constexpr int64_t kHeadDim = 64;
  // Room for every case's reshaped tensors, so their spans stay inside.
  static constexpr size_t kBufferBytes = 64 * 1024;

  HostProblem() = default;
  HostProblem(const HostProblem&) = delete;  // the tensors point into this one's buffers
  HostProblem& operator=(const HostProblem&) = delete;

  PoisonedBuffer q_buffer{kBufferBytes}, k_buffer{kBufferBytes}, v_buffer{kBufferBytes},
      out_buffer{kBufferBytes}, lse_buffer{kBufferBytes};

  Tensor q =
      Tensor::contiguous(q_buffer.data(), DType::kBFloat16, kBatch, kSeqlenQ, kHeadsQ, kHeadDim);
  Tensor k =
      Tensor::contiguous(k_buffer.data(), DType::kBFloat16, kBatch, kSeqlenK, kHeadsK, kHeadDim);
  Tensor v =
      Tensor::contiguous(v_buffer.data(), DType::kBFloat16, kBatch, kSeqlenK, kHeadsK, kHeadDim);
  Tensor out =
      Tensor::contiguous(out_buffer.data(), DType::kBFloat16, kBatch, kSeqlenQ, kHeadsQ, kHeadDim);
  float* lse = reinterpret_cast<float*>(lse_buffer.data());
  ForwardOptions options{true, 0.0f};

  Status call() const { return flash3::forward(q, k, v, out, lse, options, nullptr); }

  flash3_forward_args c_args() const { return to_c_args(q, k, v, out, lse, options); }
  flash3_status c_call() const {
    const flash3_forward_args args = c_args();
    return flash3_forward(&args, nullptr);
  }

  bool untouched() const {
    return q_buffer.untouched() && k_buffer.untouched() && v_buffer.untouched() &&
           out_buffer.untouched() && lse_buffer.untouched();
  }
};

struct HostQuantizeProblem {
  // batch 2, seqlen 40, heads 3, headdim 64; blocks of 16 rows: 3 per head.
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kSeqlen = 40;
  static constexpr int64_t kHeads = 3;
  static constexpr int64_t kHeadDim = 64;
  static constexpr int kBlockRows = 16;
  static constexpr size_t kBufferBytes = 64 * 1024;

  HostQuantizeProblem() = default;
  HostQuantizeProblem(const HostQuantizeProblem&) = delete;
  HostQuantizeProblem& operator=(const HostQuantizeProblem&) = delete;

  PoisonedBuffer x_buffer{kBufferBytes}, x_fp8_buffer{kBufferBytes}, descale_buffer{kBufferBytes};

  Tensor x =
      Tensor::contiguous(x_buffer.data(), DType::kBFloat16, kBatch, kSeqlen, kHeads, kHeadDim);
  Tensor x_fp8 = Tensor::contiguous(x_fp8_buffer.data(), DType::kFloat8E4M3, kBatch, kSeqlen,
                                    kHeads, kHeadDim);
  float* descale = reinterpret_cast<float*>(descale_buffer.data());
  QuantizeOptions options{kBlockRows, true, 7};

  Status call() const { return flash3::quantize_fp8(x, x_fp8, descale, options, nullptr); }

  flash3_quantize_args c_args() const { return to_c_args(x, x_fp8, descale, options); }
  flash3_status c_call() const {
    const flash3_quantize_args args = c_args();
    return flash3_quantize_fp8(&args, nullptr);
  }

  bool untouched() const {
    return x_buffer.untouched() && x_fp8_buffer.untouched() && descale_buffer.untouched();
  }
};

// A valid forward_fp8 call: batch 2, seqlen_q 130, seqlen_k 200, heads_q 4,
// heads_k 2, headdim 128; q descales in blocks of 64 rows (3 per head), k in
// blocks of 128 (2 per head), v one per head.
struct HostFp8Problem {
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kSeqlenQ = 130;
  static constexpr int64_t kSeqlenK = 200;
  static constexpr int64_t kHeadsQ = 4;
  static constexpr int64_t kHeadsK = 2;
  static constexpr int64_t kHeadDim = 128;
  static constexpr int kQBlockRows = 64;
  static constexpr int kKBlockRows = 128;
  static constexpr int kVBlockRows = 256;
  // Room for every case's reshaped tensors, so their spans stay inside: the
  // largest, out at head dim 256, takes 2 * 130 * 4 * 256 * 2 bytes.
  static constexpr size_t kBufferBytes = 1024 * 1024;
  static_assert(kBatch * kSeqlenQ * kHeadsQ * 256 * 2 <= kBufferBytes);
  static constexpr size_t kScaleBufferBytes = 4 * 1024;

  HostFp8Problem() = default;
  HostFp8Problem(const HostFp8Problem&) = delete;
  HostFp8Problem& operator=(const HostFp8Problem&) = delete;

  PoisonedBuffer q_buffer{kBufferBytes}, k_buffer{kBufferBytes}, v_buffer{kBufferBytes},
      out_buffer{kBufferBytes}, lse_buffer{kBufferBytes}, q_scale_buffer{kScaleBufferBytes},
      k_scale_buffer{kScaleBufferBytes}, v_scale_buffer{kScaleBufferBytes};

  Tensor q = Tensor::contiguous(q_buffer.data(), DType::kFloat8E4M3, kBatch, kSeqlenQ, kHeadsQ,
                                kHeadDim);
  Tensor k = Tensor::contiguous(k_buffer.data(), DType::kFloat8E4M3, kBatch, kSeqlenK, kHeadsK,
                                kHeadDim);
  Fp8V v{v_buffer.data(), kBatch, kSeqlenK, kHeadsK, kHeadDim};
  Tensor out =
      Tensor::contiguous(out_buffer.data(), DType::kBFloat16, kBatch, kSeqlenQ, kHeadsQ, kHeadDim);
  float* lse = reinterpret_cast<float*>(lse_buffer.data());
  Fp8Descales descales{{reinterpret_cast<float*>(q_scale_buffer.data()), kQBlockRows},
                       {reinterpret_cast<float*>(k_scale_buffer.data()), kKBlockRows},
                       {reinterpret_cast<float*>(v_scale_buffer.data()), kVBlockRows}};
  ForwardOptions options{true, 0.0f};

  Status call() const {
    return flash3::forward_fp8(q, k, v, out, lse, descales, options, nullptr);
  }

  flash3_forward_fp8_args c_args() const {
    return to_c_args(q, k, v, out, lse, descales, options);
  }
  flash3_status c_call() const {
    const flash3_forward_fp8_args args = c_args();
    return flash3_forward_fp8(&args, nullptr);
  }

  bool untouched() const {
    return q_buffer.untouched() && k_buffer.untouched() && v_buffer.untouched() &&
           out_buffer.untouched() && lse_buffer.untouched() && q_scale_buffer.untouched() &&
           k_scale_buffer.untouched() && v_scale_buffer.untouched();
  }
};

// A valid fp8_v_layout call: batch 2, seqlen 21 (padded to 32), heads 3, headdim 64.
struct HostFp8VLayoutProblem {
  static constexpr int64_t kBatch = 2;
  static constexpr int64_t kSeqlen = 21;
  static constexpr int64_t kHeads = 3;
  static constexpr int64_t kHeadDim = 64;
  static constexpr size_t kBufferBytes = 64 * 1024;

  HostFp8VLayoutProblem() = default;
  HostFp8VLayoutProblem(const HostFp8VLayoutProblem&) = delete;
  HostFp8VLayoutProblem& operator=(const HostFp8VLayoutProblem&) = delete;

  PoisonedBuffer v_buffer{kBufferBytes}, v_out_buffer{kBufferBytes};

  Tensor v =
      Tensor::contiguous(v_buffer.data(), DType::kFloat8E4M3, kBatch, kSeqlen, kHeads, kHeadDim);
  Fp8V v_out{v_out_buffer.data(), kBatch, kSeqlen, kHeads, kHeadDim};

  Status call() const { return flash3::fp8_v_layout(v, v_out, nullptr); }

  flash3_fp8_v_layout_args c_args() const { return to_c_args(v, v_out); }
  flash3_status c_call() const {
    const flash3_fp8_v_layout_args args = c_args();
    return flash3_fp8_v_layout(&args, nullptr);
  }

  bool untouched() const { return v_buffer.untouched() && v_out_buffer.untouched(); }
};

}  // namespace flash3::test
