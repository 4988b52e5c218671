#include "validate.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace flash3::detail {
namespace {

// TMA (cp.async.bulk.tensor) limits, from the CUDA driver's cuTensorMapEncodeTiled.
constexpr int64_t kTmaAlignmentBytes = 16;          // base address and every stride
constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;
// Tile coordinates and row indices are 32-bit signed inside the kernels.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();

const char* const kDimNames[4] = {"batch", "seqlen", "heads", "headdim"};

template <class... Parts>
Status error(StatusCode code, Parts&&... parts) {
  std::ostringstream os;
  os << "flash3::forward: ";
  (os << ... << parts);
  return Status{code, os.str()};
}

template <class... Parts>
Status invalid(Parts&&... parts) {
  return error(StatusCode::kInvalidArgument, std::forward<Parts>(parts)...);
}

template <class... Parts>
Status unsupported(Parts&&... parts) {
  return error(StatusCode::kUnsupported, std::forward<Parts>(parts)...);
}

int64_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFloat8E4M3:
      return 1;
  }
  return 0;
}

bool known_dtype(DType dtype) { return element_bytes(dtype) != 0; }

// Byte span [lo, hi) that a tensor's elements occupy; false if it overflows.
bool byte_span(const Tensor& t, uint64_t* lo, uint64_t* hi) {
  const int64_t bytes = element_bytes(t.dtype);
  unsigned __int128 last = 0;
  for (int i = 0; i < 4; ++i) {
    last += static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<uint64_t>(t.stride[i]);
  }
  const unsigned __int128 end =
      reinterpret_cast<uintptr_t>(t.data) + (last + 1) * static_cast<uint64_t>(bytes);
  if (end > std::numeric_limits<uint64_t>::max()) {
    return false;
  }
  *lo = reinterpret_cast<uintptr_t>(t.data);
  *hi = static_cast<uint64_t>(end);
  return true;
}

// One tensor on its own: pointer, dtype, shape, strides, alignment.
Status check_tensor(const char* name, const Tensor& t) {
  if (t.data == nullptr) {
    return invalid(name, ".data is null");
  }
  if (!known_dtype(t.dtype)) {
    return invalid(name, ".dtype has the unknown value ", static_cast<int>(t.dtype));
  }
  if (t.dtype == DType::kFloat32) {
    return invalid(name, ".dtype is float32; q, k, v and out must be float16 or bfloat16");
  }
  if (t.dtype == DType::kFloat8E4M3) {
    return unsupported(name, ".dtype is float8_e4m3, which the forward does not support yet; "
                       "use float16 or bfloat16");
  }
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 1) {
      return invalid(name, ".shape[", i, "] (", kDimNames[i], ") = ", t.shape[i],
                     " must be at least 1");
    }
    if (t.shape[i] > kMaxDimension) {
      return invalid(name, ".shape[", i, "] (", kDimNames[i], ") = ", t.shape[i],
                     " exceeds 2^31-1, the largest size the kernels index with 32 bits");
    }
  }
  if (t.stride[3] != 1) {
    return invalid(name, ".stride[3] (headdim) = ", t.stride[3],
                   " must be 1: the last dimension must be contiguous");
  }
  const int64_t bytes = element_bytes(t.dtype);
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] == 1) {
      continue;  // the stride of a dimension of size 1 is never used
    }
    if (t.stride[i] < 1) {
      return invalid(name, ".stride[", i, "] (", kDimNames[i], ") = ", t.stride[i],
                     " must be positive");
    }
    if (t.stride[i] > kTmaMaxStrideBytes / bytes) {
      return invalid(name, ".stride[", i, "] (", kDimNames[i], ") = ", t.stride[i],
                     " elements exceeds the 2^40-byte stride limit of TMA");
    }
    if ((t.stride[i] * bytes) % kTmaAlignmentBytes != 0) {
      return invalid(name, ".stride[", i, "] (", kDimNames[i], ") = ", t.stride[i],
                     " elements (", t.stride[i] * bytes, " bytes) is not a multiple of ",
                     kTmaAlignmentBytes, " bytes, which TMA needs");
    }
  }
  if (reinterpret_cast<uintptr_t>(t.data) % kTmaAlignmentBytes != 0) {
    return invalid(name, ".data is not ", kTmaAlignmentBytes,
                   "-byte aligned, which TMA needs");
  }
  uint64_t lo = 0, hi = 0;
  if (!byte_span(t, &lo, &hi)) {
    return invalid(name, ": shape and strides address past the end of the address space");
  }
  return Status{};
}

// True if two distinct index tuples of `t` can reach the same element.
bool self_overlapping(const Tensor& t) {
  // Order the dimensions of size > 1 by stride; each stride must clear the
  // extent of all smaller ones.
  int order[4] = {0, 1, 2, 3};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      if (t.stride[order[j]] < t.stride[order[i]]) {
        std::swap(order[i], order[j]);
      }
    }
  }
  int64_t extent = 1;  // elements spanned by the dims visited so far
  for (int i = 0; i < 4; ++i) {
    const int d = order[i];
    if (t.shape[d] == 1) {
      continue;
    }
    if (t.stride[d] < extent) {
      return true;
    }
    extent = t.stride[d] * (t.shape[d] - 1) + extent;
  }
  return false;
}

bool spans_intersect(const Tensor& a, const Tensor& b) {
  uint64_t alo = 0, ahi = 0, blo = 0, bhi = 0;
  byte_span(a, &alo, &ahi);
  byte_span(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

bool supported_headdim(int64_t d) {
  for (int s : kSupportedHeadDims) {
    if (d == s) {
      return true;
    }
  }
  return false;
}

Strides3 strides_of(const Tensor& t) {
  // Dimensions of size 1 may carry any stride (PyTorch's do); give them a
  // harmless one that TMA accepts.
  Strides3 s;
  s.head = t.shape[2] == 1 ? t.shape[3] : t.stride[2];
  s.seq = t.shape[1] == 1 ? s.head * t.shape[2] : t.stride[1];
  s.batch = t.shape[0] == 1 ? s.seq * t.shape[1] : t.stride[0];
  return s;
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat8E4M3:
      return "float8_e4m3";
  }
  return "unknown";
}

Status validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        float* softmax_lse, const ForwardOptions& options,
                        ForwardParams* params) {
  const struct {
    const char* name;
    const Tensor& t;
  } tensors[] = {{"q", q}, {"k", k}, {"v", v}, {"out", out}};
  for (const auto& [name, t] : tensors) {
    if (Status s = check_tensor(name, t); !s.ok()) {
      return s;
    }
  }
  for (const auto& [name, t] : tensors) {
    if (t.dtype != q.dtype) {
      return invalid(name, ".dtype (", dtype_name(t.dtype), ") differs from q.dtype (",
                     dtype_name(q.dtype), ")");
    }
  }
  for (const auto& [name, t] : tensors) {
    if (t.shape[3] != q.shape[3]) {
      return invalid(name, ".shape[3] (headdim) = ", t.shape[3], " differs from q's ",
                     q.shape[3]);
    }
    if (t.shape[0] != q.shape[0]) {
      return invalid(name, ".shape[0] (batch) = ", t.shape[0], " differs from q's ",
                     q.shape[0]);
    }
  }
  if (!supported_headdim(q.shape[3])) {
    return unsupported("headdim = ", q.shape[3], " is not supported; supported: 64, 128, 256");
  }
  if (v.shape[1] != k.shape[1]) {
    return invalid("v.shape[1] (seqlen) = ", v.shape[1], " differs from k's ", k.shape[1]);
  }
  if (v.shape[2] != k.shape[2]) {
    return invalid("v.shape[2] (heads) = ", v.shape[2], " differs from k's ", k.shape[2]);
  }
  if (out.shape[1] != q.shape[1] || out.shape[2] != q.shape[2]) {
    return invalid("out.shape (", out.shape[0], ", ", out.shape[1], ", ", out.shape[2], ", ",
                   out.shape[3], ") differs from q.shape (", q.shape[0], ", ", q.shape[1], ", ",
                   q.shape[2], ", ", q.shape[3], ")");
  }
  if (q.shape[2] % k.shape[2] != 0) {
    return invalid("q.shape[2] (heads_q) = ", q.shape[2],
                   " is not a multiple of k.shape[2] (heads_k) = ", k.shape[2]);
  }
  if (self_overlapping(out)) {
    return invalid("out's strides make elements overlap; out must not alias itself");
  }
  for (const auto& [name, t] : tensors) {
    if (&t != &out && spans_intersect(out, t)) {
      return invalid("out overlaps ", name, " in memory; the output must not alias an input");
    }
  }
  if (softmax_lse != nullptr && reinterpret_cast<uintptr_t>(softmax_lse) % alignof(float) != 0) {
    return invalid("softmax_lse is not 4-byte aligned");
  }
  if (!std::isfinite(options.softmax_scale) || options.softmax_scale < 0.0f) {
    return invalid("options.softmax_scale = ", options.softmax_scale,
                   " must be positive and finite (or 0 for 1/sqrt(headdim))");
  }
  const int64_t lse_rows = q.shape[0] * q.shape[2];
  if (lse_rows > kMaxDimension) {
    return invalid("batch * heads_q = ", lse_rows, " exceeds 2^31-1");
  }

  ForwardParams p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.softmax_lse = softmax_lse;
  p.dtype = q.dtype;
  p.batch = static_cast<int>(q.shape[0]);
  p.seqlen_q = static_cast<int>(q.shape[1]);
  p.seqlen_k = static_cast<int>(k.shape[1]);
  p.heads_q = static_cast<int>(q.shape[2]);
  p.heads_k = static_cast<int>(k.shape[2]);
  p.headdim = static_cast<int>(q.shape[3]);
  p.q_stride = strides_of(q);
  p.k_stride = strides_of(k);
  p.v_stride = strides_of(v);
  p.out_stride = strides_of(out);
  p.softmax_scale = options.softmax_scale > 0.0f
                        ? options.softmax_scale
                        : 1.0f / std::sqrt(static_cast<float>(p.headdim));
  p.causal = options.causal;
  *params = p;
  return Status{};
}

}  // namespace flash3::detail
