// The argument checks of flash3::combine. Its tensors are not Tensors
// (out_partial has five dimensions, the lse arrays three or four) and need
// less than TMA does: their elements' alignment and non-negative strides, as
// the kernel picks a vectorized or a scalar path by what it is given. So the
// checks here walk a small strided view of each instead of check_tensor.
#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "validate_common.hpp"

namespace flash3::detail {
namespace {

using namespace validation;

constexpr int kMaxRank = 5;
const char* const kPartialDimNames[kMaxRank] = {"num_splits", "batch", "seqlen", "heads",
                                                "headdim"};
const char* const* const kRowDimNames = kPartialDimNames + 1;  // batch, seqlen, heads, headdim

// One of combine's arrays as the checks see it: `rank` sizes and element
// strides. Messages spell its pointer `pointer_name` ("out.data") and its
// strides `stride_name` ("out.stride").
struct View {
  const char* name;
  const char* pointer_name;
  const char* stride_name;
  const char* const* dim_names;
  const void* data;
  int64_t element_bytes;
  int rank;
  bool has_headdim;  // its last dimension is headdim, which must be contiguous
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};
};

View partial_view(const CombineArgs& a) {
  View v{"out_partial", "out_partial", "out_partial_stride", kPartialDimNames, a.out_partial,
         4,           5,             true};
  v.shape = a.out_partial_shape;
  v.stride = a.out_partial_stride;
  return v;
}

View lse_partial_view(const CombineArgs& a) {
  View v{"lse_partial", "lse_partial", "lse_partial_stride", kPartialDimNames, a.lse_partial,
         4,             4,             false};
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = a.out_partial_shape[i];
    v.stride[i] = a.lse_partial_stride[i];
  }
  return v;
}

View out_view(const CombineArgs& a) {
  View v{"out", "out.data", "out.stride", kRowDimNames, a.out.data, element_bytes(a.out.dtype),
         4,     true};
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = a.out.shape[i];
    v.stride[i] = a.out.stride[i];
  }
  return v;
}

View lse_view(const CombineArgs& a) {
  View v{"lse", "lse", "lse_stride", kRowDimNames, a.lse, 4, 3, false};
  for (int i = 0; i < 3; ++i) {
    v.shape[i] = a.out_partial_shape[i + 1];
    v.stride[i] = a.lse_stride[i];
  }
  return v;
}

// The bytes [lo, hi) the view's elements occupy (strides checked
// non-negative; those of size-1 dimensions never move the pointer); false
// past the end of the address space.
bool view_span(const View& v, Span* span) {
  unsigned __int128 last = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] > 1) {
      last += static_cast<unsigned __int128>(v.shape[i] - 1) * static_cast<uint64_t>(v.stride[i]);
    }
  }
  const unsigned __int128 lo = reinterpret_cast<uintptr_t>(v.data);
  const unsigned __int128 hi = lo + (last + 1) * static_cast<uint64_t>(v.element_bytes);
  if (hi > std::numeric_limits<uint64_t>::max()) {
    return false;
  }
  span->lo = static_cast<uint64_t>(lo);
  span->hi = static_cast<uint64_t>(hi);
  return true;
}

// A non-empty problem's array: present, aligned to its element, strides
// non-negative with the last dimension contiguous, inside the address space.
Status check_view(const View& v, Span* span) {
  if (v.data == nullptr) {
    return invalid(v.pointer_name, " is null");
  }
  if (reinterpret_cast<uintptr_t>(v.data) % v.element_bytes != 0) {
    return invalid(v.pointer_name, " is not ", v.element_bytes, "-byte aligned");
  }
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] > 1 && v.stride[i] < 0) {
      return invalid(v.stride_name, "[", i, "] (", v.dim_names[i], ") = ", v.stride[i],
                     " must not be negative");
    }
  }
  const int last = v.rank - 1;
  if (v.has_headdim && v.shape[last] > 1 && v.stride[last] != 1) {
    return invalid(v.stride_name, "[", last, "] (headdim) = ", v.stride[last],
                   " must be 1: the last dimension must be contiguous");
  }
  if (!view_span(v, span)) {
    return invalid(v.name, ": shape and strides address past the end of the address space");
  }
  return Status{};
}

// An output's strides must give each element its own address (writes would
// race): as self_overlapping of a Tensor, its dimensions padded with size 1.
bool overlaps_itself(const View& v) {
  Tensor t;
  t.shape = {1, 1, 1, 1};
  t.stride = {1, 1, 1, 1};
  for (int i = 0; i < v.rank; ++i) {
    t.shape[i] = v.shape[i];
    t.stride[i] = v.stride[i];
  }
  return self_overlapping(t);
}

Status check_shapes(const CombineArgs& a, int64_t* rows) {
  for (int i = 0; i < kMaxRank; ++i) {
    const int64_t n = a.out_partial_shape[i];
    if (n < 0) {
      return invalid("out_partial_shape[", i, "] (", kPartialDimNames[i], ") = ", n,
                     " must not be negative");
    }
    if (n > kMaxDimension) {
      return invalid("out_partial_shape[", i, "] (", kPartialDimNames[i], ") = ", n,
                     " exceeds 2^31-1, the largest size the kernel indexes with 32 bits");
    }
  }
  if (a.out_partial_shape[0] < 1) {
    return invalid("out_partial_shape[0] (num_splits) = 0 must be at least 1");
  }
  const int64_t headdim = a.out_partial_shape[4];
  if (headdim < 1) {
    return invalid("out_partial_shape[4] (headdim) = 0 must be at least 1");
  }
  if (headdim > kMaxCombineHeadDim) {
    return unsupported("out_partial_shape[4] (headdim) = ", headdim,
                       " is not supported; combine takes head dims up to ", kMaxCombineHeadDim);
  }
  const unsigned __int128 n = static_cast<unsigned __int128>(a.out_partial_shape[1]) *
                              static_cast<uint64_t>(a.out_partial_shape[2]) *
                              static_cast<uint64_t>(a.out_partial_shape[3]);
  if (n > kMaxDimension) {
    return invalid("batch * seqlen * heads = ", static_cast<uint64_t>(n),
                   " rows exceeds 2^31-1, the largest row count the kernel indexes");
  }
  *rows = static_cast<int64_t>(n);
  return Status{};
}

Status check_out_dtype_and_shape(const Tensor& out, const CombineArgs& a) {
  if (!known_dtype(out.dtype)) {
    return invalid("out.dtype has the unknown value ", static_cast<int>(out.dtype));
  }
  if (out.dtype != DType::kFloat32 && out.dtype != DType::kFloat16 &&
      out.dtype != DType::kBFloat16) {
    return invalid("out.dtype is ", dtype_name(out.dtype),
                   "; out must be float32, float16 or bfloat16");
  }
  const auto& p = a.out_partial_shape;
  if (out.shape[0] != p[1] || out.shape[1] != p[2] || out.shape[2] != p[3] ||
      out.shape[3] != p[4]) {
    return invalid("out.shape (", out.shape[0], ", ", out.shape[1], ", ", out.shape[2], ", ",
                   out.shape[3], ") differs from out_partial_shape[1:] (", p[1], ", ", p[2], ", ",
                   p[3], ", ", p[4], ")");
  }
  return Status{};
}

// Element strides for the kernel; 0 for a dimension of size 1.
int64_t used_stride(const View& v, int i) { return v.shape[i] > 1 ? v.stride[i] : 0; }

Strides3 row_strides(const View& v, int first) {
  return Strides3{used_stride(v, first), used_stride(v, first + 1), used_stride(v, first + 2)};
}

Status check_combine(const CombineArgs& a, CombineParams* params) {
  int64_t rows = 0;
  if (Status s = check_shapes(a, &rows); !s.ok()) {
    return s;
  }
  if (Status s = check_out_dtype_and_shape(a.out, a); !s.ok()) {
    return s;
  }
  CombineParams p;
  p.out_dtype = a.out.dtype;
  p.num_splits = static_cast<int>(a.out_partial_shape[0]);
  p.batch = static_cast<int>(a.out_partial_shape[1]);
  p.seqlen = static_cast<int>(a.out_partial_shape[2]);
  p.heads = static_cast<int>(a.out_partial_shape[3]);
  p.headdim = static_cast<int>(a.out_partial_shape[4]);
  p.rows = static_cast<int>(rows);
  if (rows == 0) {
    *params = p;  // nothing to read or write: the pointers stay null
    return Status{};
  }

  const View partial = partial_view(a), lse_partial = lse_partial_view(a), out = out_view(a),
             lse = lse_view(a);
  Span partial_span, lse_partial_span, out_span, lse_span;
  if (Status s = check_view(partial, &partial_span); !s.ok()) {
    return s;
  }
  if (Status s = check_view(lse_partial, &lse_partial_span); !s.ok()) {
    return s;
  }
  if (Status s = check_view(out, &out_span); !s.ok()) {
    return s;
  }
  if (overlaps_itself(out)) {
    return invalid("out's strides make elements overlap; out must not alias itself");
  }
  if (a.lse != nullptr) {
    if (Status s = check_view(lse, &lse_span); !s.ok()) {
      return s;
    }
    if (overlaps_itself(lse)) {
      return invalid("lse's strides make elements overlap; lse must not alias itself");
    }
  }
  // Spans, not elements: an output in the gaps of an input is refused too.
  // lse's span is empty (meets nothing) when lse is null.
  const NamedSpan o{"out", out_span}, l{"lse", lse_span}, op{"out_partial", partial_span},
      lp{"lse_partial", lse_partial_span};
  const std::pair<NamedSpan, NamedSpan> pairs[] = {{o, op}, {o, lp}, {l, op}, {l, lp}, {l, o}};
  for (const auto& [output, other] : pairs) {
    if (intersect(output.span, other.span)) {
      return invalid(output.name, " overlaps ", other.name,
                     " in memory; the outputs must not alias the inputs or each other");
    }
  }

  p.out_partial = a.out_partial;
  p.lse_partial = a.lse_partial;
  p.out = a.out.data;
  p.lse = a.lse;
  p.out_partial_stride = SplitStrides{used_stride(partial, 0), row_strides(partial, 1)};
  p.lse_partial_stride = SplitStrides{used_stride(lse_partial, 0), row_strides(lse_partial, 1)};
  p.out_stride = row_strides(out, 0);
  if (a.lse != nullptr) {
    p.lse_stride = row_strides(lse, 0);
  }
  *params = p;
  return Status{};
}

}  // namespace

Status validate_combine(const CombineArgs& args, CombineParams* params) {
  return with_call(kCombineCall, check_combine(args, params));
}

}  // namespace flash3::detail
