// The argument checks of flash3::quantize_fp8 and flash3::quantize_fp8_v.
#include "validate_common.hpp"

namespace flash3::detail {
namespace {

using namespace validation;

// One CTA quantizes a whole block of rows: larger blocks would leave most SMs idle.
constexpr int64_t kMaxBlockRows = int64_t{1} << 20;

// The `blocks_per_head` scales of each (batch, head) of x as a float32 tensor
// (batch, heads, blocks, 1), for the span and overlap checks.
Tensor descale_tensor(float* descale, const Tensor& x, int64_t blocks_per_head) {
  Tensor t;
  t.data = descale;
  t.dtype = DType::kFloat32;
  t.shape = {x.shape[0], x.shape[2], blocks_per_head, 1};
  t.stride = {x.shape[2] * blocks_per_head, blocks_per_head, 1, 1};
  return t;
}

// What quantize_fp8 and quantize_fp8_v check alike: x, its head dim, the
// block size and the descales (their count and span in *scales).
Status check_input_and_scales(const char* name, const Tensor& x, float* descale,
                              const QuantizeOptions& options, int64_t* blocks_per_head,
                              Span* scales) {
  if (Status s = check_tensor(name, x, half_dtype); !s.ok()) {
    return s;
  }
  if (Status s = check_headdim(x.shape[3]); !s.ok()) {
    return s;
  }
  if (options.block_rows < 1 || options.block_rows > kMaxBlockRows) {
    return invalid("options.block_rows = ", options.block_rows, " must be in [1, ",
                   kMaxBlockRows, "]");
  }
  if (descale == nullptr) {
    return invalid("descale is null");
  }
  if (reinterpret_cast<uintptr_t>(descale) % alignof(float) != 0) {
    return invalid("descale is not 4-byte aligned");
  }
  *blocks_per_head = (x.shape[1] + options.block_rows - 1) / options.block_rows;
  const unsigned __int128 num_blocks =
      static_cast<unsigned __int128>(x.shape[0] * x.shape[2]) * *blocks_per_head;
  if (num_blocks > kMaxDimension) {
    return invalid("batch * heads * ceil(seqlen / block_rows) = ",
                   static_cast<uint64_t>(num_blocks), " scales exceeds 2^31-1");
  }
  uint64_t lo = 0, hi = 0;
  if (!byte_span(descale_tensor(descale, x, *blocks_per_head), &lo, &hi)) {
    return invalid("descale: its ", static_cast<uint64_t>(num_blocks),
                   " floats address past the end of the address space");
  }
  *scales = {lo, hi};
  if (intersect(*scales, span_of(x))) {
    return invalid("descale overlaps ", name, " in memory; the output must not alias the input");
  }
  return Status{};
}

void fill_quantize(const Tensor& x, float* descale, const QuantizeOptions& options,
                   int64_t blocks_per_head, QuantizeParams* p) {
  p->x = x.data;
  p->descale = descale;
  p->dtype = x.dtype;
  set_dims(x, p);
  p->x_stride = strides_of(x);
  p->block_rows = options.block_rows;
  p->blocks_per_head = static_cast<int>(blocks_per_head);
  p->num_blocks = static_cast<int>(x.shape[0] * x.shape[2] * blocks_per_head);
  p->hadamard = options.hadamard;
  p->seed = options.seed;
}

Status check_quantize(const Tensor& x, const Tensor& x_fp8, float* descale,
                      const QuantizeOptions& options, QuantizeParams* params) {
  int64_t blocks_per_head = 0;
  Span scales;
  if (Status s = check_input_and_scales("x", x, descale, options, &blocks_per_head, &scales);
      !s.ok()) {
    return s;
  }
  if (Status s = check_tensor("x_fp8", x_fp8, e4m3_dtype); !s.ok()) {
    return s;
  }
  if (x_fp8.shape != x.shape) {
    return invalid("x_fp8.shape (", x_fp8.shape[0], ", ", x_fp8.shape[1], ", ", x_fp8.shape[2],
                   ", ", x_fp8.shape[3], ") differs from x.shape (", x.shape[0], ", ", x.shape[1],
                   ", ", x.shape[2], ", ", x.shape[3], ")");
  }
  if (self_overlapping(x_fp8)) {
    return invalid("x_fp8's strides make elements overlap; x_fp8 must not alias itself");
  }
  if (spans_intersect(x_fp8, x)) {
    return invalid("x_fp8 overlaps x in memory; the output must not alias the input");
  }
  if (intersect(scales, span_of(x_fp8))) {
    return invalid("descale overlaps x_fp8 in memory; the outputs must not alias each other");
  }

  QuantizeParams p;
  fill_quantize(x, descale, options, blocks_per_head, &p);
  p.x_fp8 = x_fp8.data;
  p.x_fp8_stride = strides_of(x_fp8);
  *params = p;
  return Status{};
}

Status check_quantize_v(const Tensor& v, const Fp8V& v_out, float* descale,
                        const QuantizeOptions& options, QuantizeParams* params) {
  int64_t blocks_per_head = 0;
  Span scales, out;
  if (Status s = check_input_and_scales("v", v, descale, options, &blocks_per_head, &scales);
      !s.ok()) {
    return s;
  }
  if (options.hadamard) {
    return invalid("options.hadamard: V is quantized without the transform (the FP8 forward "
                   "multiplies P by V itself; only Q and K take it)");
  }
  if (options.block_rows % kFp8VKeyGroup != 0 && options.block_rows < v.shape[1]) {
    return invalid("options.block_rows = ", options.block_rows, " must be a multiple of ",
                   kFp8VKeyGroup, " (the Fp8V layout's key groups) or at least seqlen (",
                   v.shape[1], ")");
  }
  if (Status s = check_fp8_v("v_out", v_out, &out); !s.ok()) {
    return s;
  }
  if (Status s = check_fp8_v_shape("v_out", v_out, "v", v); !s.ok()) {
    return s;
  }
  if (intersect(out, span_of(v))) {
    return invalid("v_out overlaps v in memory; the output must not alias the input");
  }
  if (intersect(scales, out)) {
    return invalid("descale overlaps v_out in memory; the outputs must not alias each other");
  }

  QuantizeParams p;
  fill_quantize(v, descale, options, blocks_per_head, &p);
  p.v_out = v_out.data;
  *params = p;
  return Status{};
}

}  // namespace

Status validate_quantize(const Tensor& x, const Tensor& x_fp8, float* descale,
                         const QuantizeOptions& options, QuantizeParams* params) {
  return with_call(kQuantizeCall, check_quantize(x, x_fp8, descale, options, params));
}

Status validate_quantize_v(const Tensor& v, const Fp8V& v_out, float* descale,
                           const QuantizeOptions& options, QuantizeParams* params) {
  return with_call(kQuantizeVCall, check_quantize_v(v, v_out, descale, options, params));
}

}  // namespace flash3::detail
