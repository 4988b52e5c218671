// One forward case on the GPU: random inputs laid out in device memory as the
// case says, a poisoned output, the call, and the check against the reference.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"
#include "reference/attention_ref.hpp"

namespace flash3::test {

// How q, k, v and out lie in memory (all in the API's (batch, seqlen, heads,
// headdim) indexing).
enum class Layout {
  kContiguous,  // densely packed
  kPackedQkv,   // one (batch, seqlen, heads_q + 2 heads_k, headdim) buffer; out contiguous
  kHeadMajor,   // stored (batch, heads, seqlen, headdim), as a transposed PyTorch tensor; out too
  kPadded,      // each row and each batch followed by 16 bytes of padding; out too
};

const char* layout_name(Layout layout);  // "contiguous", "packed", ...

// The reference's name for a 16-bit dtype.
ref::HalfType half_type(DType dtype);

// e.g. "bf16_d128"
std::string kernel_label(DType dtype, int headdim);

struct ForwardCase {
  DType dtype = DType::kBFloat16;
  ref::Shape shape;
  bool causal = false;
  float softmax_scale = 0.0f;  // 0: 1/sqrt(headdim), as the API says
  Layout layout = Layout::kContiguous;
  int window_left = -1;  // a sliding window (ForwardOptions::window_left/right); -1: unbounded
  int window_right = -1;
  int attention_chunk = 0;  // ForwardOptions::attention_chunk; 0: none
  float softcap = 0.0f;     // ForwardOptions::softcap; 0: none

  std::string name() const;  // e.g. "bf16_d128_b2_q113_k1013_h4_kv2_causal_packed"
  float resolved_scale() const;
};

// N(0, 1) values rounded to the case's dtype, seeded by the case's name.
struct Inputs {
  std::vector<float> q, k, v;
};
Inputs random_inputs(const ForwardCase& c);

// Why the GPU suites cannot run here; "" when device 0 is a Hopper GPU.
std::string hopper_missing_reason();

// True when flash3 refused the call because its kernel is not compiled in.
bool not_built(const Status& s);

// Throws std::runtime_error naming `what` unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

// Where one tensor's elements lie, in elements from the start of its buffer.
struct View {
  size_t offset = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};
};

// The views of q, k and v in one input buffer, and of out in its own buffer.
struct Placement {
  View q, k, v, out;
  size_t inputs_size = 0;  // elements
  size_t out_size = 0;     // elements
};
Placement place(const ForwardCase& c);

// Calls fn(logical, index) for each element of `view`: its position in the
// contiguous (batch, seqlen, heads, headdim) order and its index in the buffer.
void for_each_element(const View& view, const std::function<void(size_t, size_t)>& fn);

// The tensor that `view` describes in the fp16/bf16 (or e4m3) buffer at `base`.
Tensor view_tensor(void* base, DType dtype, const View& view);

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// The batch + 1 offsets (FlashAttention's cu_seqlens) of packed sequences of
// these lengths.
std::vector<int> cu_seqlens_of(const std::vector<int>& lengths);

// n normal values rounded to `type` (fresh random inputs of the serving tests).
std::vector<float> random_halves(ref::HalfType type, size_t n, std::mt19937_64& rng);

// x as fp16/bf16 bits into device memory at dst; n fp16/bf16 values at src
// back as floats.
void upload_halves(void* dst, ref::HalfType type, const std::vector<float>& x, const char* what);
std::vector<float> download_halves(const void* src, ref::HalfType type, size_t n,
                                   const char* what);

// What the device holds after a call.
struct Output {
  std::vector<float> out;  // contiguous (batch, seqlen_q, heads_q, headdim)
  std::vector<float> lse;  // (batch, heads_q, seqlen_q)
  size_t unwritten = 0;    // elements of out and lse still holding the poison
  size_t clobbered = 0;    // elements of out's buffer outside its view that changed
};

// One case on the device: inputs uploaded (padding poisoned), out and lse poisoned.
class DeviceProblem {
 public:
  DeviceProblem(const ForwardCase& c, const Inputs& inputs);

  Tensor q() const;
  Tensor k() const;
  Tensor v() const;
  Tensor out() const;
  float* lse() const { return static_cast<float*>(lse_.get()); }
  ForwardOptions options() const;

  // flash3::forward on this problem, enqueued on `stream`.
  Status forward(cudaStream_t stream) const;
  flash3_forward_args c_args() const;
  // Copies out and lse back with cudaMemcpy (the legacy default stream).
  Output download() const;

 private:
  ForwardCase case_;
  Placement place_;
  DeviceBuffer inputs_, out_buffer_, lse_;
};

// Runs the case on the default stream and checks every output element
// against the float64 reference with the tolerance rule; skips the test when
// the case's kernel is not in this build.
void expect_matches_reference(const ForwardCase& c);
// The same on the given inputs (values of the case's dtype).
void expect_matches_reference(const ForwardCase& c, const Inputs& in);

}  // namespace flash3::test
