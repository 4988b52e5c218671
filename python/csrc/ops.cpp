// flash3's PyTorch operators (torch.ops.flash3.*), in C++ over flash3's C++ API.
//
// Loaded by python/flash3/_ops.py with torch.ops.load_library; nothing here
// depends on Python, so one build serves every Python version of a PyTorch
// build. Per op: a CUDA kernel (allocate, describe, call flash3 on the current
// stream), a Meta kernel (the same allocation on meta tensors: the fake
// implementation torch.compile traces with), and for `fwd` an autograd kernel
// whose backward is `bwd`. The `*_out` ops write caller-given tensors (tests
// poison them first). Validation is flash3's own: its Status becomes
//   kInvalidArgument -> ValueError, kUnsupported -> NotImplementedError,
//   anything else -> RuntimeError,
// with flash3's message; only what flash3 cannot see (tensor ranks, devices,
// dtypes without a flash3 code) is checked here.
#include <array>
#include <map>
#include <mutex>
#include <climits>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "flash3/flash3.hpp"

namespace flash3::torch_ops {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// -------------------------------------------------------------- conversions
// A dtype as Python spells it, for messages.
std::string torch_name(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return "torch.float64";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    default: return c10::toString(type);
  }
}

DType to_dtype(at::ScalarType type, const char* name) {
  switch (type) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat32;
    case at::kFloat8_e4m3fn: return DType::kFloat8E4M3;
    default:
      TORCH_CHECK_VALUE(false, "flash3: ", name, ".dtype is ", torch_name(type),
                        "; use torch.float16 or torch.bfloat16");
  }
}

// The checks flash3 cannot make: a 4-d CUDA tensor on `device`.
void check_tensor(const Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(t.dim() == 4, "flash3: ", name,
                    " must be a 4-d tensor (batch, seqlen, heads, headdim), got ", t.dim(),
                    " dimensions");
  TORCH_CHECK_VALUE(t.device() == device, "flash3: ", name, " is on ", t.device(), " but q is on ",
                    device, "; all tensors must be on one CUDA device");
}

flash3::Tensor describe(const Tensor& t, const char* name, const at::Device& device) {
  check_tensor(t, name, device);
  flash3::Tensor d;
  d.data = t.data_ptr();
  d.dtype = to_dtype(t.scalar_type(), name);
  for (int i = 0; i < 4; ++i) {
    d.shape[i] = t.size(i);
    d.stride[i] = t.stride(i);
  }
  return d;
}

float* float_data(const Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat, "flash3: ", name, " must be float32, got ",
                    t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device, "flash3: ", name, " is on ", t.device(),
                    " but q is on ", device);
  return t.data_ptr<float>();
}

// A float32 tensor flash3 reads or writes as contiguous (d0, d1, d2) through
// a bare pointer: the shape is checked here, since flash3 cannot see it.
float* float_rows(const Tensor& t, const char* name, const at::Device& device,
                  std::array<int64_t, 3> shape, const char* dims) {
  TORCH_CHECK_VALUE(t.dim() == 3 && t.size(0) == shape[0] && t.size(1) == shape[1] &&
                        t.size(2) == shape[2] && t.is_contiguous(),
                    "flash3: ", name, " must be a contiguous float32 tensor ", dims, " = (",
                    shape[0], ", ", shape[1], ", ", shape[2], "), got shape ", t.sizes(),
                    t.is_contiguous() ? "" : " (not contiguous)");
  return float_data(t, name, device);
}

// softmax_lse of q (4-d, checked): (batch, heads_q, seqlen_q).
float* lse_of(const Tensor& softmax_lse, const Tensor& q, const at::Device& device) {
  return float_rows(softmax_lse, "softmax_lse", device, {q.size(0), q.size(2), q.size(1)},
                    "(batch, heads_q, seqlen_q)");
}

void raise_unless_ok(const Status& status) {
  switch (status.code) {
    case StatusCode::kOk: return;
    case StatusCode::kInvalidArgument: TORCH_CHECK_VALUE(false, status.message);
    case StatusCode::kUnsupported: TORCH_CHECK_NOT_IMPLEMENTED(false, status.message);
    default: TORCH_CHECK(false, status.message);
  }
}

// flash3 reads 0 as "1 / sqrt(headdim)"; a given scale of 0 would be misread.
float scale_of(std::optional<double> softmax_scale) {
  if (!softmax_scale) {
    return 0.0f;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(*softmax_scale != 0.0,
                              "flash3: softmax_scale=0.0 is not supported (None means "
                              "1/sqrt(headdim))");
  return static_cast<float>(*softmax_scale);
}

at::Device cuda_device_of(const Tensor& q, const char* name) {
  TORCH_CHECK_VALUE(q.is_cuda(), "flash3: ", name, " is on ", q.device(),
                    "; flash3 runs on a CUDA device (a Hopper GPU: H100, H200)");
  return q.device();
}

// q's device made current, and its current stream: where flash3 launches.
struct OnDevice {
  OnDevice(const Tensor& q, const char* name)
      : guard(cuda_device_of(q, name)),
        torch_stream(c10::cuda::getCurrentCUDAStream(q.device().index())),
        stream(torch_stream.stream()) {}
  c10::cuda::CUDAGuard guard;
  c10::cuda::CUDAStream torch_stream;
  cudaStream_t stream;
};

// The forward's workspace (flash3.hpp: ForwardOptions::workspace), from
// PyTorch's caching allocator: one per (device, stream), zeroed once and
// kept (each forward leaves it fit for the next); while the stream is
// captured into a CUDA graph, a fresh zeroed one (the memset is captured
// with the forward, and the graph's pool owns the memory).
Tensor forward_workspace(const Tensor& q, const flash3::Tensor& q_d, const OnDevice& on) {
  size_t bytes = 0;
  if (!forward_workspace_size(q_d, &bytes).ok()) {
    return Tensor();  // none: the forward refuses q and says why
  }
  const auto options = q.options().dtype(at::kByte);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(on.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    return at::zeros({static_cast<int64_t>(bytes)}, options);
  }
  static std::mutex mutex;
  // Never destroyed: freeing at exit could run after CUDA has shut down.
  static auto* workspaces = new std::map<std::pair<c10::DeviceIndex, c10::StreamId>, Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  Tensor& workspace = (*workspaces)[{q.device().index(), on.torch_stream.id()}];
  if (!workspace.defined() || workspace.numel() < static_cast<int64_t>(bytes)) {
    workspace = at::zeros({static_cast<int64_t>(bytes)}, options);  // the old one: stream-ordered free
  }
  return workspace;
}

// A forward's options (causal, the scale) with its workspace, which this
// holds for the call.
// One side of a sliding window as flash3 takes it: -1 (unbounded) or a key
// count, a count past INT_MAX being as unbounded as INT_MAX.
int window_side(int64_t w, const char* name) {
  TORCH_CHECK_VALUE(w >= -1, "flash3: ", name, " = ", w, ": a key count, or -1 for unbounded");
  return static_cast<int>(std::min<int64_t>(w, INT_MAX));
}

// The masked kernels' options of a forward or a backward call (the library
// validates the values; these are the ones that do not fit its ints).
template <class Options>
void set_mask_options(Options* options, int64_t window_left, int64_t window_right,
                      int64_t attention_chunk, double softcap) {
  options->window_left = window_side(window_left, "window_size[0]");
  options->window_right = window_side(window_right, "window_size[1]");
  TORCH_CHECK_VALUE(attention_chunk >= 0 && attention_chunk <= INT_MAX, "flash3: attention_chunk = ",
                    attention_chunk, ": a key count, or 0 for none");
  options->attention_chunk = static_cast<int>(attention_chunk);
  options->softcap = static_cast<float>(softcap);
}

struct ForwardCall {
  ForwardOptions options;
  Tensor workspace;

  ForwardCall(const Tensor& q, const flash3::Tensor& q_d, const OnDevice& on,
              std::optional<double> softmax_scale, bool causal, int64_t window_left = -1,
              int64_t window_right = -1, int64_t attention_chunk = 0,
              double softcap = 0.0)
      : workspace(forward_workspace(q, q_d, on)) {
    options.causal = causal;
    options.softmax_scale = scale_of(softmax_scale);
    set_mask_options(&options, window_left, window_right, attention_chunk, softcap);
    if (workspace.defined()) {
      options.workspace = workspace.data_ptr();
      options.workspace_bytes = static_cast<size_t>(workspace.numel());
    }
  }
};

// A backward's options (causal, the scale, determinism) with its workspace,
// which this holds for the call: from PyTorch's caching allocator on this
// stream, so freed at return while the kernels still run (stream order),
// and safe under CUDA graph capture.
struct BackwardCall {
  BackwardOptions options;
  Tensor workspace;

  BackwardCall(std::optional<double> softmax_scale, bool causal, bool deterministic,
               int64_t window_left = -1, int64_t window_right = -1, int64_t attention_chunk = 0,
               double softcap = 0.0) {
    options.causal = causal;
    options.softmax_scale = scale_of(softmax_scale);
    options.deterministic = deterministic;
    set_mask_options(&options, window_left, window_right, attention_chunk, softcap);
  }
  // `bytes`: backward_workspace_size's for the call, on q's device.
  void take_workspace(const Tensor& q, size_t bytes) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
    options.workspace = workspace.data_ptr();
    options.workspace_bytes = bytes;
  }
};

// ------------------------------------------------------------ allocations
// One function per op, run by the CUDA and the Meta kernels alike, so the fake
// tensors torch.compile traces with have the real outputs' shapes and strides.
Tensor lse_like(const Tensor& q) {
  return at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
}

// out like q, but of v's head dim (FlashAttention-3's dv != d: then contiguous).
Tensor out_like(const Tensor& q, const Tensor& v) {
  if (v.dim() != q.dim() || v.size(-1) == q.size(-1)) {
    return at::empty_like(q);
  }
  std::vector<int64_t> sizes = q.sizes().vec();
  sizes.back() = v.size(-1);
  return at::empty(sizes, q.options());
}

std::tuple<Tensor, Tensor> forward_outputs(const Tensor& q, const Tensor& v) {
  TORCH_CHECK_VALUE(q.dim() == 4, "flash3: q must be a 4-d tensor (batch, seqlen, heads, headdim)");
  return {out_like(q, v), lse_like(q)};
}

std::tuple<Tensor, Tensor, Tensor> backward_outputs(const Tensor& q, const Tensor& k,
                                                    const Tensor& v) {
  // Like q, k, v: their strides where dense, else contiguous (last stride 1).
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

std::tuple<Tensor, Tensor> fp8_forward_outputs(const Tensor& q, at::ScalarType out_dtype) {
  TORCH_CHECK_VALUE(q.dim() == 4, "flash3: q must be a 4-d tensor (batch, seqlen, heads, headdim)");
  return {at::empty(q.sizes(), q.options().dtype(out_dtype)), lse_like(q)};
}

// Blocks of block_rows rows in seqlen rows; `what` names block_rows in the
// refusal (flash3 takes it as an int: at most 2^30).
int64_t blocks_of(int64_t seqlen, int64_t block_rows, const char* what = "block_rows") {
  TORCH_CHECK_VALUE(block_rows >= 1 && block_rows <= (int64_t{1} << 30), "flash3: ", what,
                    " must be in [1, 2^30], got ", block_rows);
  return (seqlen + block_rows - 1) / block_rows;
}

// quantize_fp8_v: V's codes in the Fp8V layout, as an e4m3 tensor (batch,
// heads, headdim, seqlen padded to kFp8VKeyGroup), and its descales.
std::tuple<Tensor, Tensor> quantize_v_outputs(const Tensor& v, int64_t block_rows) {
  TORCH_CHECK_VALUE(v.dim() == 4, "flash3: v must be a 4-d tensor (batch, seqlen, heads, headdim)");
  const Fp8V layout{nullptr, v.size(0), v.size(1), v.size(2), v.size(3)};
  return {at::empty({v.size(0), v.size(2), v.size(3), layout.padded_seqlen()},
                    v.options().dtype(at::kFloat8_e4m3fn)),
          at::empty({v.size(0), v.size(2), blocks_of(v.size(1), block_rows)},
                    v.options().dtype(at::kFloat))};
}

std::tuple<Tensor, Tensor> quantize_outputs(const Tensor& x, int64_t block_rows) {
  TORCH_CHECK_VALUE(x.dim() == 4, "flash3: x must be a 4-d tensor (batch, seqlen, heads, headdim)");
  return {at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn)),
          at::empty({x.size(0), x.size(2), blocks_of(x.size(1), block_rows)},
                    x.options().dtype(at::kFloat))};
}

// ------------------------------------------------------------- the calls
// Learnable sinks (ForwardOptions::sinks): a contiguous float32 (heads_q,)
// tensor on q's device, or none.
const float* sinks_of(const std::optional<Tensor>& sinks, const Tensor& q,
                      const at::Device& device) {
  if (!sinks.has_value()) {
    return nullptr;
  }
  const Tensor& t = *sinks;
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == q.size(2) && t.is_contiguous(),
                    "flash3: sinks must be a contiguous float32 tensor of heads_q = ", q.size(2),
                    " values, got shape ", t.sizes());
  return float_data(t, "sinks", device);
}

void forward_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                  const Tensor& softmax_lse, std::optional<double> softmax_scale, bool causal,
                  const std::optional<Tensor>& sinks = std::nullopt, int64_t window_left = -1,
                  int64_t window_right = -1, int64_t attention_chunk = 0,
                  double softcap = 0.0) {
  OnDevice on(q, "q");
  const at::Device device = q.device();
  // In argument order (named locals: a call's arguments are evaluated in no set
  // order), so the first bad tensor is the one named.
  const flash3::Tensor q_d = describe(q, "q", device), k_d = describe(k, "k", device),
                       v_d = describe(v, "v", device), out_d = describe(out, "out", device);
  float* lse = lse_of(softmax_lse, q, device);
  ForwardCall call(q, q_d, on, softmax_scale, causal, window_left, window_right, attention_chunk,
                   softcap);
  call.options.sinks = sinks_of(sinks, q, device);
  raise_unless_ok(forward(q_d, k_d, v_d, out_d, lse, call.options, on.stream));
}

// flash3 reads every tensor with 16-byte TMA accesses; autograd's dout may be
// a view it cannot read (an expanded scalar for out.sum(), a slice).
bool tma_readable(const Tensor& t) {
  constexpr int64_t kAlignment = 16;
  if (t.stride(-1) != 1 || reinterpret_cast<uintptr_t>(t.data_ptr()) % kAlignment != 0) {
    return false;
  }
  for (int64_t i = 0; i + 1 < t.dim(); ++i) {
    if (t.size(i) != 1 && (t.stride(i) <= 0 || t.stride(i) * t.element_size() % kAlignment != 0)) {
      return false;
    }
  }
  return true;
}

void backward_into(const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& softmax_lse,
                   std::optional<double> softmax_scale, bool causal, bool deterministic,
                   const Tensor& dq, const Tensor& dk, const Tensor& dv,
                   const std::optional<Tensor>& sinks = std::nullopt,
                   const Tensor& dsinks = Tensor(), int64_t window_left = -1,
                   int64_t window_right = -1, int64_t attention_chunk = 0, double softcap = 0.0) {
  OnDevice on(q, "q");
  const at::Device device = q.device();
  check_tensor(dout_in, "dout", device);
  const Tensor dout = tma_readable(dout_in) ? dout_in : dout_in.contiguous();
  BackwardCall call(softmax_scale, causal, deterministic, window_left, window_right, attention_chunk,
                    softcap);
  if (dsinks.defined()) {  // the sinks' gradient too (bwd_sinks)
    call.options.sinks = sinks_of(sinks, q, device);
    call.options.dsinks = dsinks.data_ptr<float>();
  }
  const flash3::Tensor dout_d = describe(dout, "dout", device), q_d = describe(q, "q", device),
                       k_d = describe(k, "k", device), v_d = describe(v, "v", device),
                       out_d = describe(out, "out", device);
  const float* lse = lse_of(softmax_lse, q, device);
  const flash3::Tensor dq_d = describe(dq, "dq", device), dk_d = describe(dk, "dk", device),
                       dv_d = describe(dv, "dv", device);
  size_t bytes = 0;
  raise_unless_ok(backward_workspace_size(q_d, k_d, v_d, call.options, &bytes));
  call.take_workspace(q, bytes);
  raise_unless_ok(
      backward(dout_d, q_d, k_d, v_d, out_d, lse, dq_d, dk_d, dv_d, call.options, on.stream));
}

// One descale per block of block_rows rows of each (batch, head) of x (4-d,
// checked): (batch, heads, ceil(seqlen / block_rows)).
Fp8Descale descale_of(const Tensor& t, int64_t block_rows, const char* name, const Tensor& x,
                      const at::Device& device) {
  const int64_t blocks =
      blocks_of(x.size(1), block_rows, (std::string(name) + " block_rows").c_str());
  return Fp8Descale{float_rows(t, name, device, {x.size(0), x.size(2), blocks},
                               "(batch, heads, blocks)"),
                    static_cast<int>(block_rows)};
}

// ------------------------------------------------------------- CUDA kernels
std::tuple<Tensor, Tensor> fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::optional<double> softmax_scale, bool causal,
                                    bool /*deterministic: the backward's*/,
                                    const std::optional<Tensor>& sinks, int64_t window_left,
                                    int64_t window_right, int64_t attention_chunk,
                                    double softcap) {
  auto [out, lse] = forward_outputs(q, v);
  forward_into(q, k, v, out, lse, softmax_scale, causal, sinks, window_left, window_right, attention_chunk,
               softcap);
  return {out, lse};
}

void fwd_out_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                  const Tensor& softmax_lse, std::optional<double> softmax_scale, bool causal) {
  forward_into(q, k, v, out, softmax_lse, softmax_scale, causal);
}

std::tuple<Tensor, Tensor, Tensor> bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& out,
                                            const Tensor& softmax_lse,
                                            std::optional<double> softmax_scale, bool causal,
                                            bool deterministic, int64_t window_left,
                                            int64_t window_right, int64_t attention_chunk,
                                            double softcap) {
  auto [dq, dk, dv] = backward_outputs(q, k, v);
  backward_into(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic, dq, dk, dv,
                std::nullopt, Tensor(), window_left, window_right, attention_chunk, softcap);
  return {dq, dk, dv};
}

// bwd with the gradient of the forward's sinks as well: (dq, dk, dv, dsinks).
std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_sinks_outputs(const Tensor& q, const Tensor& k,
                                                             const Tensor& v,
                                                             const Tensor& sinks) {
  auto [dq, dk, dv] = backward_outputs(q, k, v);
  return {dq, dk, dv, at::empty_like(sinks, sinks.options().dtype(at::kFloat))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_sinks_cuda(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& softmax_lse, const Tensor& sinks, std::optional<double> softmax_scale,
    bool causal, bool deterministic, int64_t window_left, int64_t window_right, int64_t attention_chunk,
    double softcap) {
  auto [dq, dk, dv, dsinks] = bwd_sinks_outputs(q, k, v, sinks);
  backward_into(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic, dq, dk, dv,
                sinks, dsinks, window_left, window_right, attention_chunk, softcap);
  return {dq, dk, dv, dsinks};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_sinks_meta(
    const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
    const Tensor&, const Tensor& sinks, std::optional<double>, bool, bool, int64_t, int64_t,
    int64_t, double) {
  return bwd_sinks_outputs(q, k, v, sinks);
}

void bwd_out_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& softmax_lse, const Tensor& dq, const Tensor& dk,
                  const Tensor& dv, std::optional<double> softmax_scale, bool causal,
                  bool deterministic) {
  backward_into(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic, dq, dk, dv);
}

std::tuple<Tensor, Tensor> fwd_fp8_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& q_descale, int64_t q_block_rows,
                                        const Tensor& k_descale, int64_t k_block_rows,
                                        const Tensor& v_descale, int64_t v_block_rows,
                                        std::optional<double> softmax_scale, bool causal,
                                        std::optional<at::ScalarType> out_dtype,
                                        bool v_laid_out) {
  OnDevice on(q, "q");
  const at::Device device = q.device();
  const flash3::Tensor q_d = describe(q, "q", device), k_d = describe(k, "k", device);
  // V in the layout FP8 tensor cores read (flash3.hpp: Fp8V): as given
  // (v_laid_out: quantize_fp8_v's output, k's sizes), else laid out here
  // into a buffer from the caching allocator on this stream.
  Fp8V v_layout{nullptr, k.size(0), k.size(1), k.size(2), k.size(3)};
  Tensor v_buffer;
  if (v_laid_out) {
    TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == k.size(0) && v.size(1) == k.size(2) &&
                          v.size(2) == k.size(3) && v.size(3) == v_layout.padded_seqlen(),
                      "flash3: a laid-out v must be (batch, heads_k, headdim, seqlen_k padded to ",
                      kFp8VKeyGroup, ") = (", k.size(0), ", ", k.size(2), ", ", k.size(3), ", ",
                      v_layout.padded_seqlen(), "), as quantize_fp8_v writes it; got ", v.sizes());
    TORCH_CHECK_VALUE(v.scalar_type() == at::kFloat8_e4m3fn && v.is_contiguous(),
                      "flash3: a laid-out v must be a contiguous float8_e4m3fn tensor");
    TORCH_CHECK_VALUE(v.device() == device, "flash3: v is on ", v.device(), " but q is on ",
                      device);
    v_layout.data = v.data_ptr();
  } else {
    const flash3::Tensor v_d = describe(v, "v", device);
    v_layout = Fp8V{nullptr, v.size(0), v.size(1), v.size(2), v.size(3)};
    v_buffer = at::empty({v_layout.bytes()}, q.options().dtype(at::kByte));
    v_layout.data = v_buffer.data_ptr();
    raise_unless_ok(fp8_v_layout(v_d, v_layout, on.stream));
  }
  auto [out, lse] = fp8_forward_outputs(q, out_dtype.value_or(at::kBFloat16));
  Fp8Descales descales{descale_of(q_descale, q_block_rows, "q_descale", q, device),
                       descale_of(k_descale, k_block_rows, "k_descale", k, device),
                       descale_of(v_descale, v_block_rows, "v_descale", v_laid_out ? k : v,
                                  device)};
  const flash3::Tensor out_d = describe(out, "out", device);
  const ForwardCall call(q, q_d, on, softmax_scale, causal);
  raise_unless_ok(
      forward_fp8(q_d, k_d, v_layout, out_d, lse.data_ptr<float>(), descales, call.options,
                  on.stream));
  return {out, lse};
}

std::tuple<Tensor, Tensor> quantize_fp8_cuda(const Tensor& x, int64_t block_rows, bool hadamard,
                                             int64_t seed) {
  OnDevice on(x, "x");
  const at::Device device = x.device();
  auto [x_fp8, descale] = quantize_outputs(x, block_rows);  // block_rows checked there
  QuantizeOptions options;
  options.block_rows = static_cast<int>(block_rows);
  options.hadamard = hadamard;
  options.seed = static_cast<uint64_t>(seed);
  const flash3::Tensor x_d = describe(x, "x", device), x_fp8_d = describe(x_fp8, "x_fp8", device);
  raise_unless_ok(quantize_fp8(x_d, x_fp8_d, descale.data_ptr<float>(), options, on.stream));
  return {x_fp8, descale};
}

std::tuple<Tensor, Tensor> quantize_fp8_v_cuda(const Tensor& v, int64_t block_rows) {
  OnDevice on(v, "v");
  const at::Device device = v.device();
  auto [v_fp8, descale] = quantize_v_outputs(v, block_rows);  // block_rows checked there
  QuantizeOptions options;
  options.block_rows = static_cast<int>(block_rows);
  const flash3::Tensor v_d = describe(v, "v", device);
  const Fp8V layout{v_fp8.data_ptr(), v.size(0), v.size(1), v.size(2), v.size(3)};
  raise_unless_ok(quantize_fp8_v(v_d, layout, descale.data_ptr<float>(), options, on.stream));
  return {v_fp8, descale};
}

// combine (FlashAttention-3's flash_attn_combine): out_partial (num_splits,
// batch, seqlen, heads, headdim) and lse_partial (num_splits, batch, seqlen,
// heads), float32, any strides with headdim contiguous, merged into out
// (batch, seqlen, heads, headdim) of out_dtype (float32 by default) and lse
// (batch, seqlen, heads), allocated (batch, heads, seqlen) and transposed as
// FlashAttention-3 does.
std::tuple<Tensor, Tensor> combine_outputs(const Tensor& out_partial,
                                           std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(out_partial.dim() == 5, "flash3: out_partial must be a 5-d tensor "
                    "(num_splits, batch, seqlen, heads, headdim), got ", out_partial.dim(),
                    " dimensions");
  const at::ScalarType type = out_dtype.value_or(at::kFloat);
  TORCH_CHECK_VALUE(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
                    "flash3: out_dtype is ", torch_name(type),
                    "; combine writes torch.float32, torch.float16 or torch.bfloat16");
  // Symbolic sizes: torch.compile's dynamic shapes trace this (the Meta kernel).
  const c10::SymInt batch = out_partial.sym_size(1), seqlen = out_partial.sym_size(2),
                    heads = out_partial.sym_size(3), headdim = out_partial.sym_size(4);
  return {at::empty_symint({batch, seqlen, heads, headdim}, out_partial.options().dtype(type)),
          at::empty_symint({batch, heads, seqlen}, out_partial.options().dtype(at::kFloat))
              .transpose(1, 2)};
}

std::tuple<Tensor, Tensor> combine_cuda(const Tensor& out_partial, const Tensor& lse_partial,
                                        std::optional<at::ScalarType> out_dtype) {
  OnDevice on(out_partial, "out_partial");
  const at::Device device = out_partial.device();
  auto [out, lse] = combine_outputs(out_partial, out_dtype);
  // flash3 takes bare float pointers and reads lse_partial's shape from
  // out_partial's: the dtypes, lse_partial's shape and its device are checked here.
  TORCH_CHECK_VALUE(out_partial.scalar_type() == at::kFloat, "flash3: out_partial must be "
                    "torch.float32, got ", torch_name(out_partial.scalar_type()));
  TORCH_CHECK_VALUE(lse_partial.dim() == 4 && lse_partial.sizes() == out_partial.sizes().slice(0, 4),
                    "flash3: lse_partial must be (num_splits, batch, seqlen, heads) = ",
                    out_partial.sizes().slice(0, 4), ", got shape ", lse_partial.sizes());
  TORCH_CHECK_VALUE(lse_partial.scalar_type() == at::kFloat, "flash3: lse_partial must be "
                    "torch.float32, got ", torch_name(lse_partial.scalar_type()));
  TORCH_CHECK_VALUE(lse_partial.device() == device, "flash3: lse_partial is on ",
                    lse_partial.device(), " but out_partial is on ", device);
  CombineArgs args;
  args.out_partial = out_partial.data_ptr<float>();
  for (int i = 0; i < 5; ++i) {
    args.out_partial_shape[i] = out_partial.size(i);
    args.out_partial_stride[i] = out_partial.stride(i);
  }
  args.lse_partial = lse_partial.data_ptr<float>();
  for (int i = 0; i < 4; ++i) {
    args.lse_partial_stride[i] = lse_partial.stride(i);
  }
  args.out = describe(out, "out", device);
  args.lse = lse.data_ptr<float>();
  for (int i = 0; i < 3; ++i) {
    args.lse_stride[i] = lse.stride(i);
  }
  raise_unless_ok(combine(args, on.stream));
  return {out, lse};
}

// Varlen (FlashAttention's packed layout): q, k, v (total, heads, headdim),
// out like q, lse (heads_q, total_q); flash3 sees them as batch 1. With
// seqused_q no kernel writes the rows past a sequence's used ones: zeros
// and an lse of +inf there, as rows that see no key, so that the outputs are
// the same from call to call (FlashAttention-3's operator checks compare two
// calls' whole tensors); the backward's gradients likewise
// (varlen_backward_outputs).
std::tuple<Tensor, Tensor> varlen_outputs(const Tensor& q, const Tensor& v, bool seqused_q) {
  TORCH_CHECK_VALUE(q.dim() == 3, "flash3: q must be a 3-d tensor (total_q, heads, headdim) for "
                    "a varlen batch, got ", q.dim(), " dimensions");
  Tensor out = out_like(q, v);
  Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
  if (seqused_q) {
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
  }
  return {out, lse};
}

const int* offsets_of(const Tensor& cu, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(cu.dim() == 1 && cu.scalar_type() == at::kInt && cu.is_contiguous() &&
                        cu.numel() >= 2,
                    "flash3: ", name, " must be a contiguous int32 tensor of batch + 1 >= 2 "
                    "offsets, got ", cu.scalar_type(), " of shape ", cu.sizes());
  TORCH_CHECK_VALUE(cu.device() == device, "flash3: ", name, " is on ", cu.device(),
                    " but q is on ", device);
  return cu.data_ptr<int>();
}

// A (batch,) int32 tensor on q's device (cache lengths, seqused).
const int* per_batch(const Tensor& t, const char* name, int64_t batch, const at::Device& device) {
  TORCH_CHECK_VALUE(t.dim() == 1 && t.scalar_type() == at::kInt && t.is_contiguous() &&
                        t.numel() == batch,
                    "flash3: ", name, " must be a contiguous int32 tensor of batch = ", batch,
                    " entries, got ", t.scalar_type(), " of shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == device, "flash3: ", name, " is on ", t.device(),
                    " but q is on ", device);
  return t.data_ptr<int>();
}

// The sequences of a varlen call (flash3.hpp: Varlen), the tensors checked
// that flash3 reads through bare pointers.
Varlen varlen_of(const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                 const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k,
                 const at::Device& device) {
  TORCH_CHECK_VALUE(cu_seqlens_k.numel() == cu_seqlens_q.numel(), "flash3: cu_seqlens_k has ",
                    cu_seqlens_k.numel(), " offsets, cu_seqlens_q ", cu_seqlens_q.numel());
  TORCH_CHECK_VALUE(max_seqlen_q >= 1 && max_seqlen_q <= (int64_t{1} << 31) - 1,
                    "flash3: max_seqlen_q must be in [1, 2^31), got ", max_seqlen_q);
  const int64_t batch = cu_seqlens_q.numel() - 1;
  return Varlen{
      offsets_of(cu_seqlens_q, "cu_seqlens_q", device),
      offsets_of(cu_seqlens_k, "cu_seqlens_k", device),
      static_cast<int>(batch),
      static_cast<int>(max_seqlen_q),
      seqused_q.has_value() ? per_batch(*seqused_q, "seqused_q", batch, device) : nullptr,
      seqused_k.has_value() ? per_batch(*seqused_k, "seqused_k", batch, device) : nullptr};
}

std::tuple<Tensor, Tensor> fwd_varlen_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& cu_seqlens_q,
                                           const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                           std::optional<double> softmax_scale, bool causal,
                                           const std::optional<Tensor>& seqused_q,
                                           const std::optional<Tensor>& seqused_k,
                                           bool /*deterministic: the backward's*/,
                                           int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                           double softcap) {
  auto [out, lse] = varlen_outputs(q, v, seqused_q.has_value());
  OnDevice on(q, "q");
  const at::Device device = q.device();
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"k", k}, {"v", v}}) {
    TORCH_CHECK_VALUE(t.dim() == 3, "flash3: ", name,
                      " must be a 3-d tensor (total_k, heads_k, headdim) for a varlen batch");
  }
  if (q.size(0) == 0 || k.size(0) == 0) {
    // No rows, or no sequence has a key (FlashAttention-3 takes both): what the
    // kernels give rows that see no key, without a launch over empty tensors.
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  const Tensor q4 = q.unsqueeze(0), k4 = k.unsqueeze(0), v4 = v.unsqueeze(0), out4 = out.unsqueeze(0);
  const flash3::Tensor q_d = describe(q4, "q", device), k_d = describe(k4, "k", device),
                       v_d = describe(v4, "v", device), out_d = describe(out4, "out", device);
  const Varlen varlen =
      varlen_of(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_q, seqused_k, device);
  const ForwardCall call(q4, q_d, on, softmax_scale, causal, window_left, window_right, attention_chunk,
                         softcap);
  raise_unless_ok(forward_varlen(q_d, k_d, v_d, out_d, lse.data_ptr<float>(), varlen,
                                 call.options, on.stream));
  return {out, lse};
}

// The varlen backward: dq, dk, dv like q, k, v; rows outside the used ones
// (seqused_q / seqused_k) are zeros.
std::tuple<Tensor, Tensor, Tensor> varlen_backward_outputs(const Tensor& q, const Tensor& k,
                                                           const Tensor& v, bool zero_q,
                                                           bool zero_kv) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
                    "flash3: q, k and v must be 3-d tensors (total, heads, headdim) for a "
                    "varlen batch");
  return {zero_q ? at::zeros_like(q) : at::empty_like(q),
          zero_kv ? at::zeros_like(k) : at::empty_like(k),
          zero_kv ? at::zeros_like(v) : at::empty_like(v)};
}

std::tuple<Tensor, Tensor, Tensor> bwd_varlen_cuda(
    const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& softmax_lse, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
    int64_t max_seqlen_q, std::optional<double> softmax_scale, bool causal, bool deterministic,
    const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k,
    int64_t window_left, int64_t window_right, int64_t attention_chunk, double softcap) {
  auto [dq, dk, dv] =
      varlen_backward_outputs(q, k, v, seqused_q.has_value(), seqused_k.has_value());
  if (q.size(0) == 0 || k.size(0) == 0) {  // as fwd_varlen: nothing attends to anything
    OnDevice on(q, "q");
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  OnDevice on(q, "q");
  const at::Device device = q.device();
  TORCH_CHECK_VALUE(dout_in.dim() == 3 && out.dim() == 3,
                    "flash3: dout and out must be 3-d tensors (total_q, heads, headdim)");
  const Tensor dout = tma_readable(dout_in) ? dout_in : dout_in.contiguous();
  const Tensor dout4 = dout.unsqueeze(0), q4 = q.unsqueeze(0), k4 = k.unsqueeze(0),
               v4 = v.unsqueeze(0), out4 = out.unsqueeze(0), dq4 = dq.unsqueeze(0),
               dk4 = dk.unsqueeze(0), dv4 = dv.unsqueeze(0);
  const flash3::Tensor dout_d = describe(dout4, "dout", device), q_d = describe(q4, "q", device),
                       k_d = describe(k4, "k", device), v_d = describe(v4, "v", device),
                       out_d = describe(out4, "out", device);
  const float* lse = float_data(softmax_lse, "softmax_lse", device);
  TORCH_CHECK_VALUE(softmax_lse.dim() == 2 && softmax_lse.size(0) == q.size(1) &&
                        softmax_lse.size(1) == q.size(0) && softmax_lse.is_contiguous(),
                    "flash3: softmax_lse must be a contiguous float32 tensor (heads_q, total_q) "
                    "= (", q.size(1), ", ", q.size(0), "), got shape ", softmax_lse.sizes());
  const flash3::Tensor dq_d = describe(dq4, "dq", device), dk_d = describe(dk4, "dk", device),
                       dv_d = describe(dv4, "dv", device);
  const Varlen varlen =
      varlen_of(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_q, seqused_k, device);
  BackwardCall call(softmax_scale, causal, deterministic, window_left, window_right, attention_chunk,
                    softcap);
  size_t bytes = 0;
  raise_unless_ok(backward_workspace_size(q_d, k_d, v_d, varlen, call.options, &bytes));
  call.take_workspace(q, bytes);
  raise_unless_ok(backward_varlen(dout_d, q_d, k_d, v_d, out_d, lse, dq_d, dk_d, dv_d, varlen,
                                  call.options, on.stream));
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> bwd_varlen_meta(
    const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
    const Tensor&, const Tensor&, const Tensor&, int64_t, std::optional<double>, bool, bool,
    const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k, int64_t,
    int64_t, int64_t, double) {
  return varlen_backward_outputs(q, k, v, seqused_q.has_value(), seqused_k.has_value());
}

std::tuple<Tensor, Tensor> fwd_varlen_meta(const Tensor& q, const Tensor&, const Tensor& v,
                                           const Tensor&, const Tensor&, int64_t,
                                           std::optional<double>, bool,
                                           const std::optional<Tensor>& seqused_q,
                                           const std::optional<Tensor>&, bool, int64_t, int64_t,
                                           int64_t, double) {
  return varlen_outputs(q, v, seqused_q.has_value());
}

// KV cache (FlashAttention's flash_attn_with_kvcache without pages or
// appends): q (batch, seqlen_q, heads_q, headdim), k_cache and v_cache
// (kv_batch, capacity, heads_k, headdim), cache_seqlens (batch,) int32,
// cache_batch_idx (batch,) int32 or none; out and lse as fwd's.

// A cache's description for flash3 (flash3.hpp: KvCache): the per-batch
// arrays checked here, and a paged cache's page table: (rows, pages) int32,
// contiguous, on q's device (rows = batch, or any with cache_batch_idx).
KvCache cache_of(const Tensor& q, const Tensor& cache_seqlens,
                 const std::optional<Tensor>& cache_batch_idx,
                 const std::optional<Tensor>& page_table, const at::Device& device,
                 const std::optional<Tensor>& cache_leftpad = std::nullopt) {
  const int64_t batch = q.size(0);
  KvCache cache{per_batch(cache_seqlens, "cache_seqlens", batch, device),
                cache_batch_idx.has_value()
                    ? per_batch(*cache_batch_idx, "cache_batch_idx", batch, device)
                    : nullptr};
  if (cache_leftpad.has_value()) {
    cache.cache_leftpad = per_batch(*cache_leftpad, "cache_leftpad", batch, device);
  }
  if (page_table.has_value()) {
    const Tensor& t = *page_table;
    TORCH_CHECK_VALUE(t.dim() == 2 && t.scalar_type() == at::kInt && t.is_contiguous() &&
                          t.size(0) >= 1 && t.size(1) >= 1 && t.size(0) <= INT_MAX &&
                          t.size(1) <= INT_MAX,
                      "flash3: page_table must be a contiguous int32 tensor (rows, pages), got ",
                      t.scalar_type(), " of shape ", t.sizes());
    TORCH_CHECK_VALUE(t.device() == device, "flash3: page_table is on ", t.device(),
                      " but q is on ", device);
    cache.page_table = t.data_ptr<int>();
    cache.pages_per_batch = static_cast<int>(t.size(1));
    cache.page_table_rows = static_cast<int>(t.size(0));
  }
  return cache;
}

std::tuple<Tensor, Tensor> fwd_kvcache_cuda(const Tensor& q, const Tensor& k_cache,
                                            const Tensor& v_cache, const Tensor& cache_seqlens,
                                            const std::optional<Tensor>& cache_batch_idx,
                                            std::optional<double> softmax_scale, bool causal,
                                            const std::optional<Tensor>& page_table,
                                            const std::optional<Tensor>& cache_leftpad,
                                            int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                            double softcap) {
  auto [out, lse] = forward_outputs(q, v_cache);
  OnDevice on(q, "q");
  const at::Device device = q.device();
  const flash3::Tensor q_d = describe(q, "q", device), k_d = describe(k_cache, "k_cache", device),
                       v_d = describe(v_cache, "v_cache", device),
                       out_d = describe(out, "out", device);
  const KvCache cache =
      cache_of(q, cache_seqlens, cache_batch_idx, page_table, device, cache_leftpad);
  const ForwardCall call(q, q_d, on, softmax_scale, causal, window_left, window_right, attention_chunk,
                         softcap);
  raise_unless_ok(forward_kvcache(q_d, k_d, v_d, out_d, lse.data_ptr<float>(), cache,
                                  call.options, on.stream));
  return {out, lse};
}

std::tuple<Tensor, Tensor> fwd_kvcache_meta(const Tensor& q, const Tensor&, const Tensor& v_cache,
                                            const Tensor&, const std::optional<Tensor>&,
                                            std::optional<double>, bool,
                                            const std::optional<Tensor>&,
                                            const std::optional<Tensor>&, int64_t, int64_t,
                                            int64_t, double) {
  return forward_outputs(q, v_cache);
}

// New tokens for a KV cache (FlashAttention-3's k, v and rotary arguments of
// flash_attn_with_kvcache): k and v written into k_cache / v_cache in place
// after each batch's cache_seqlens[b] slots; returns q rotated (an empty
// tensor without rotary tables: q stays as it is) and the new lengths.
std::tuple<Tensor, Tensor> kvcache_append_outputs(const Tensor& q, const Tensor& cache_seqlens,
                                                  bool rotary) {
  return {rotary ? at::empty_like(q) : at::empty({0}, q.options()),
          at::empty({q.size(0)}, cache_seqlens.options().dtype(at::kInt))};
}

std::tuple<Tensor, Tensor> kvcache_append_cuda(
    const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
    const Tensor& v, const Tensor& cache_seqlens, const std::optional<Tensor>& cache_batch_idx,
    const std::optional<Tensor>& page_table, const std::optional<Tensor>& rotary_cos,
    const std::optional<Tensor>& rotary_sin, bool rotary_interleaved, bool causal,
    const std::optional<Tensor>& rotary_seqlens) {
  OnDevice on(q, "q");
  const at::Device device = q.device();
  const bool rotary = rotary_cos.has_value() || rotary_sin.has_value();
  TORCH_CHECK_VALUE(rotary_cos.has_value() == rotary_sin.has_value(),
                    "flash3: rotary_cos and rotary_sin go together");
  auto [q_rotated, seqlens] = kvcache_append_outputs(q, cache_seqlens, rotary);
  KvCacheAppend append;
  append.k_new = describe(k, "k", device);
  append.v_new = describe(v, "v", device);
  append.causal = causal;
  append.rotary_interleaved = rotary_interleaved;
  append.seqlens_out = seqlens.data_ptr<int>();
  if (rotary) {
    for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"rotary_cos", *rotary_cos},
                                  {"rotary_sin", *rotary_sin}}) {
      TORCH_CHECK_VALUE(t.dim() == 2 && t.is_contiguous() && t.scalar_type() == q.scalar_type() &&
                            t.device() == device && t.sizes() == rotary_cos->sizes(),
                        "flash3: ", name, " must be a contiguous (seqlen_ro, rotary_dim / 2) "
                        "tensor of q's dtype on q's device, like rotary_cos; got ",
                        t.scalar_type(), " of shape ", t.sizes(), " on ", t.device());
    }
    append.rotary_cos = rotary_cos->data_ptr();
    append.rotary_sin = rotary_sin->data_ptr();
    append.rotary_rows = static_cast<int>(rotary_cos->size(0));
    append.rotary_dim = static_cast<int>(rotary_cos->size(1) * 2);
    append.q_rotated = describe(q_rotated, "q_rotated", device);
    if (rotary_seqlens.has_value()) {
      append.rotary_seqlens = per_batch(*rotary_seqlens, "rotary_seqlens", q.size(0), device);
    }
  }
  const KvCache cache = cache_of(q, cache_seqlens, cache_batch_idx, page_table, device);
  raise_unless_ok(kvcache_append(describe(q, "q", device), describe(k_cache, "k_cache", device),
                                 describe(v_cache, "v_cache", device), cache, append, on.stream));
  return {q_rotated, seqlens};
}

std::tuple<Tensor, Tensor> kvcache_append_meta(
    const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor& cache_seqlens, const std::optional<Tensor>&, const std::optional<Tensor>&,
    const std::optional<Tensor>& rotary_cos, const std::optional<Tensor>&, bool, bool,
    const std::optional<Tensor>&) {
  return kvcache_append_outputs(q, cache_seqlens, rotary_cos.has_value());
}

// ------------------------------------------------------------- CPU
// Every op on CPU tensors (the first CPU one named): a clear refusal instead of
// the dispatcher's list of backends.
void refuse_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::string name = "the inputs";
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensor() && value.toTensor().device().is_cpu()) {
      name = arguments[i].name();
      break;
    }
  }
  const bool no_gpu = !at::globalContext().hasCUDA() || c10::cuda::device_count() == 0;
  const std::string& qualified = op.schema().name();  // "flash3::fwd"
  TORCH_CHECK_VALUE(false, "flash3: ", qualified.substr(qualified.find("::") + 2), ": ", name,
                    " is on the CPU; flash3 runs on a Hopper GPU (H100, H200)",
                    no_gpu ? ", and this machine has no CUDA device" : "; move it to one");
}

// ------------------------------------------------------------- Meta kernels
std::tuple<Tensor, Tensor> fwd_meta(const Tensor& q, const Tensor&, const Tensor& v,
                                    std::optional<double>, bool, bool,
                                    const std::optional<Tensor>&, int64_t, int64_t, int64_t,
                                    double) {
  return forward_outputs(q, v);
}

void fwd_out_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  std::optional<double>, bool) {}

std::tuple<Tensor, Tensor, Tensor> bwd_meta(const Tensor&, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor&, const Tensor&,
                                            std::optional<double>, bool, bool, int64_t,
                                            int64_t, int64_t, double) {
  return backward_outputs(q, k, v);
}

void bwd_out_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  std::optional<double>, bool, bool) {}

std::tuple<Tensor, Tensor> fwd_fp8_meta(const Tensor& q, const Tensor&, const Tensor&,
                                        const Tensor&, int64_t, const Tensor&, int64_t,
                                        const Tensor&, int64_t, std::optional<double>, bool,
                                        std::optional<at::ScalarType> out_dtype, bool) {
  return fp8_forward_outputs(q, out_dtype.value_or(at::kBFloat16));
}

std::tuple<Tensor, Tensor> quantize_fp8_meta(const Tensor& x, int64_t block_rows, bool, int64_t) {
  return quantize_outputs(x, block_rows);
}

std::tuple<Tensor, Tensor> quantize_fp8_v_meta(const Tensor& v, int64_t block_rows) {
  return quantize_v_outputs(v, block_rows);
}

std::tuple<Tensor, Tensor> combine_meta(const Tensor& out_partial, const Tensor&,
                                        std::optional<at::ScalarType> out_dtype) {
  return combine_outputs(out_partial, out_dtype);
}

// ------------------------------------------------------------- autograd
// The options an autograd kernel's forward saves for its backward.
struct SavedOptions {
  std::optional<double> softmax_scale;
  bool causal;
  bool deterministic;

  static void save(AutogradContext* ctx, std::optional<double> softmax_scale, bool causal,
                   bool deterministic) {
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["deterministic"] = deterministic;
  }
  // The forward's sliding window, for the backward's call.
  static void save_window(AutogradContext* ctx, int64_t window_left, int64_t window_right,
                          int64_t attention_chunk, double softcap) {
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["attention_chunk"] = attention_chunk;
    ctx->saved_data["softcap"] = softcap;
  }
  static double softcap_of(AutogradContext* ctx) { return ctx->saved_data["softcap"].toDouble(); }
  static int64_t chunk_of(AutogradContext* ctx) {
    return ctx->saved_data["attention_chunk"].toInt();
  }
  static int64_t window_left_of(AutogradContext* ctx) {
    return ctx->saved_data["window_left"].toInt();
  }
  static int64_t window_right_of(AutogradContext* ctx) {
    return ctx->saved_data["window_right"].toInt();
  }
  static SavedOptions of(AutogradContext* ctx) {
    const c10::IValue& scale = ctx->saved_data["softmax_scale"];
    return {scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()),
            ctx->saved_data["causal"].toBool(), ctx->saved_data["deterministic"].toBool()};
  }
};

// fwd's autograd kernel: saves q, k, v, out and the log-sum-exp; its backward
// is the `bwd` op (through the dispatcher, so torch.compile traces it too).
class Attention : public torch::autograd::Function<Attention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, std::optional<double> softmax_scale, bool causal,
                               bool deterministic, const std::optional<Tensor>& sinks,
                               int64_t window_left, int64_t window_right, int64_t attention_chunk,
                               double softcap) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flash3::fwd", "")
                         .typed<decltype(fwd_cuda)>();
    auto [out, lse] = op.call(q, k, v, softmax_scale, causal, deterministic, sinks, window_left,
                              window_right, attention_chunk, softcap);
    SavedOptions::save_window(ctx, window_left, window_right, attention_chunk, softcap);
    // The lse includes the sinks, so bwd's dq, dk, dv are theirs too; with
    // sinks that require grad, bwd_sinks adds their gradient.
    const bool sinks_need_grad = sinks.has_value() && sinks->requires_grad();
    ctx->saved_data["sinks_need_grad"] = sinks_need_grad;
    if (sinks_need_grad) {
      ctx->saved_data["sinks"] = *sinks;
    }
    ctx->save_for_backward({q, k, v, out, lse});
    SavedOptions::save(ctx, softmax_scale, causal, deterministic);
    ctx->mark_non_differentiable({lse});
    // No zeros for lse's gradient, which nobody reads (a (batch, heads,
    // seqlen) float tensor and a memset a backward call).
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) {  // out's gradient not materialized: no gradient flows
      return variable_list(11);
    }
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flash3::bwd", "")
                         .typed<decltype(bwd_cuda)>();
    const variable_list saved = ctx->get_saved_variables();
    const SavedOptions o = SavedOptions::of(ctx);
    const int64_t window_left = SavedOptions::window_left_of(ctx),
                  window_right = SavedOptions::window_right_of(ctx),
                  attention_chunk = SavedOptions::chunk_of(ctx);
    if (ctx->saved_data["sinks_need_grad"].toBool()) {
      static auto with_sinks = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("flash3::bwd_sinks", "")
                                   .typed<decltype(bwd_sinks_cuda)>();
      auto [dq, dk, dv, dsinks] =
          with_sinks.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                          ctx->saved_data["sinks"].toTensor(), o.softmax_scale, o.causal,
                          o.deterministic, window_left, window_right, attention_chunk,
                          SavedOptions::softcap_of(ctx));
      return {dq,     dk,       dv,       Tensor(), Tensor(), Tensor(),
              dsinks, Tensor(), Tensor(), Tensor(), Tensor()};
    }
    auto [dq, dk, dv] = op.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                                o.softmax_scale, o.causal, o.deterministic, window_left,
                                window_right, attention_chunk, SavedOptions::softcap_of(ctx));
    return {dq,       dk,       dv,       Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// fwd_fp8's autograd kernel: outputs whose backward says there is none yet
// (rather than PyTorch's generic "not implemented" for the operator).
class Fp8Attention : public torch::autograd::Function<Fp8Attention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& q_descale, int64_t q_block_rows,
                               const Tensor& k_descale, int64_t k_block_rows,
                               const Tensor& v_descale, int64_t v_block_rows,
                               std::optional<double> softmax_scale, bool causal,
                               std::optional<at::ScalarType> out_dtype, bool v_laid_out) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flash3::fwd_fp8", "")
                         .typed<decltype(fwd_fp8_cuda)>();
    auto [out, lse] = op.call(q, k, v, q_descale, q_block_rows, k_descale, k_block_rows,
                              v_descale, v_block_rows, softmax_scale, causal, out_dtype,
                              v_laid_out);
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash3: the FP8 path has no backward yet");
  }
};

std::tuple<Tensor, Tensor> fwd_fp8_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& q_descale, int64_t q_block_rows,
                                            const Tensor& k_descale, int64_t k_block_rows,
                                            const Tensor& v_descale, int64_t v_block_rows,
                                            std::optional<double> softmax_scale, bool causal,
                                            std::optional<at::ScalarType> out_dtype,
                                            bool v_laid_out) {
  variable_list result =
      Fp8Attention::apply(q, k, v, q_descale, q_block_rows, k_descale, k_block_rows, v_descale,
                          v_block_rows, softmax_scale, causal, out_dtype, v_laid_out);
  return {result[0], result[1]};
}

// fwd_varlen's autograd kernel: saves what bwd_varlen needs; its backward
// is the `bwd_varlen` op.
class VarlenAttention : public torch::autograd::Function<VarlenAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& cu_seqlens_q,
                               const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                               std::optional<double> softmax_scale, bool causal,
                               const std::optional<Tensor>& seqused_q,
                               const std::optional<Tensor>& seqused_k, bool deterministic,
                               int64_t window_left, int64_t window_right, int64_t attention_chunk,
                               double softcap) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flash3::fwd_varlen", "")
                         .typed<decltype(fwd_varlen_cuda)>();
    auto [out, lse] = op.call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                              causal, seqused_q, seqused_k, deterministic, window_left,
                              window_right, attention_chunk, softcap);
    SavedOptions::save_window(ctx, window_left, window_right, attention_chunk, softcap);
    // Optional tensors saved as undefined ones when absent.
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                            seqused_q.value_or(Tensor()), seqused_k.value_or(Tensor())});
    ctx->saved_data["max_seqlen_q"] = max_seqlen_q;
    SavedOptions::save(ctx, softmax_scale, causal, deterministic);
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // as Attention's
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) {
      return variable_list(15);
    }
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flash3::bwd_varlen", "")
                         .typed<decltype(bwd_varlen_cuda)>();
    const variable_list saved = ctx->get_saved_variables();
    const SavedOptions o = SavedOptions::of(ctx);
    const auto optional = [](const Tensor& t) {
      return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
    };
    auto [dq, dk, dv] =
        op.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
                ctx->saved_data["max_seqlen_q"].toInt(),
                o.softmax_scale, o.causal, o.deterministic,
                optional(saved[7]), optional(saved[8]), SavedOptions::window_left_of(ctx),
                SavedOptions::window_right_of(ctx), SavedOptions::chunk_of(ctx),
                SavedOptions::softcap_of(ctx));
    return {dq,       dk,       dv,       Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> fwd_varlen_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& cu_seqlens_q,
                                               const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                               std::optional<double> softmax_scale, bool causal,
                                               const std::optional<Tensor>& seqused_q,
                                               const std::optional<Tensor>& seqused_k,
                                               bool deterministic, int64_t window_left,
                                               int64_t window_right, int64_t attention_chunk,
                                               double softcap) {
  variable_list result =
      VarlenAttention::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                             causal, seqused_q, seqused_k, deterministic, window_left,
                             window_right, attention_chunk, softcap);
  return {result[0], result[1]};
}

std::tuple<Tensor, Tensor> fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                        std::optional<double> softmax_scale, bool causal,
                                        bool deterministic, const std::optional<Tensor>& sinks,
                                        int64_t window_left, int64_t window_right, int64_t attention_chunk,
                                        double softcap) {
  variable_list result = Attention::apply(q, k, v, softmax_scale, causal, deterministic, sinks,
                                          window_left, window_right, attention_chunk, softcap);
  return {result[0], result[1]};
}

}  // namespace

TORCH_LIBRARY(flash3, m) {
  m.def("fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, "
        "bool deterministic=False, Tensor? sinks=None, int window_left=-1, int window_right=-1, int attention_chunk=0, "
        "float softcap=0.0) "
        "-> (Tensor out, Tensor softmax_lse)");
  m.def("fwd_out(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) softmax_lse, "
        "float? softmax_scale=None, bool causal=False) -> ()");
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "float? softmax_scale=None, bool causal=False, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, int attention_chunk=0, float softcap=0.0) "
        "-> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("bwd_sinks(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor sinks, float? softmax_scale=None, bool causal=False, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, int attention_chunk=0, float softcap=0.0) "
        "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)");
  m.def("bwd_out(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, float? softmax_scale=None, "
        "bool causal=False, bool deterministic=False) -> ()");
  m.def("fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor q_descale, int q_block_rows, "
        "Tensor k_descale, int k_block_rows, Tensor v_descale, int v_block_rows, "
        "float? softmax_scale=None, bool causal=False, ScalarType? out_dtype=None, "
        "bool v_laid_out=False) -> (Tensor out, Tensor softmax_lse)");
  m.def("quantize_fp8(Tensor x, int block_rows=128, bool hadamard=False, int seed=0) "
        "-> (Tensor x_fp8, Tensor descale)");
  m.def("quantize_fp8_v(Tensor v, int block_rows=128) -> (Tensor v_fp8, Tensor descale)");
  m.def("fwd_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, float? softmax_scale=None, bool causal=False, Tensor? seqused_q=None, "
        "Tensor? seqused_k=None, bool deterministic=False, int window_left=-1, "
        "int window_right=-1, int attention_chunk=0, float softcap=0.0) "
        "-> (Tensor out, Tensor softmax_lse)");
  m.def("bwd_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, float? softmax_scale=None, "
        "bool causal=False, bool deterministic=False, Tensor? seqused_q=None, "
        "Tensor? seqused_k=None, int window_left=-1, int window_right=-1, int attention_chunk=0, "
        "float softcap=0.0) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("fwd_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
        "Tensor? cache_batch_idx=None, float? softmax_scale=None, bool causal=False, "
        "Tensor? page_table=None, Tensor? cache_leftpad=None, int window_left=-1, "
        "int window_right=-1, int attention_chunk=0, float softcap=0.0) "
        "-> (Tensor out, Tensor softmax_lse)");
  m.def("kvcache_append(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
        "Tensor cache_seqlens, Tensor? cache_batch_idx=None, Tensor? page_table=None, "
        "Tensor? rotary_cos=None, Tensor? rotary_sin=None, bool rotary_interleaved=False, "
        "bool causal=False, Tensor? rotary_seqlens=None) -> (Tensor q_rotated, Tensor seqlens)");
  m.def("combine(Tensor out_partial, Tensor lse_partial, ScalarType? out_dtype=None) "
        "-> (Tensor out, Tensor softmax_lse)");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) {
  m.impl("combine", &combine_cuda);
  m.impl("fwd", &fwd_cuda);
  m.impl("fwd_out", &fwd_out_cuda);
  m.impl("bwd", &bwd_cuda);
  m.impl("bwd_sinks", &bwd_sinks_cuda);
  m.impl("bwd_out", &bwd_out_cuda);
  m.impl("fwd_fp8", &fwd_fp8_cuda);
  m.impl("quantize_fp8", &quantize_fp8_cuda);
  m.impl("quantize_fp8_v", &quantize_fp8_v_cuda);
  m.impl("fwd_varlen", &fwd_varlen_cuda);
  m.impl("bwd_varlen", &bwd_varlen_cuda);
  m.impl("fwd_kvcache", &fwd_kvcache_cuda);
  m.impl("kvcache_append", &kvcache_append_cuda);
}

TORCH_LIBRARY_IMPL(flash3, CPU, m) {
  m.impl("combine", torch::CppFunction::makeFromBoxedFunction<&refuse_cpu>());
  for (const char* op :
       {"fwd", "fwd_out", "bwd", "bwd_sinks", "bwd_out", "fwd_fp8", "quantize_fp8",
        "quantize_fp8_v", "fwd_varlen", "bwd_varlen", "fwd_kvcache", "kvcache_append"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&refuse_cpu>());
  }
}

TORCH_LIBRARY_IMPL(flash3, Meta, m) {
  m.impl("combine", &combine_meta);
  m.impl("fwd", &fwd_meta);
  m.impl("fwd_out", &fwd_out_meta);
  m.impl("bwd", &bwd_meta);
  m.impl("bwd_sinks", &bwd_sinks_meta);
  m.impl("bwd_out", &bwd_out_meta);
  m.impl("fwd_fp8", &fwd_fp8_meta);
  m.impl("quantize_fp8", &quantize_fp8_meta);
  m.impl("quantize_fp8_v", &quantize_fp8_v_meta);
  m.impl("fwd_varlen", &fwd_varlen_meta);
  m.impl("bwd_varlen", &bwd_varlen_meta);
  m.impl("fwd_kvcache", &fwd_kvcache_meta);
  m.impl("kvcache_append", &kvcache_append_meta);
}

TORCH_LIBRARY_IMPL(flash3, Autograd, m) {
  m.impl("fwd", &fwd_autograd);
  m.impl("fwd_fp8", &fwd_fp8_autograd);
  m.impl("fwd_varlen", &fwd_varlen_autograd);
}

}  // namespace flash3::torch_ops
