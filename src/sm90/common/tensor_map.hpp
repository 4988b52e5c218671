// TMA descriptors (CUtensorMap) for (batch, seqlen, heads, headdim) tensors,
// built on the host through the driver entry point, so that the library
// needs no link against libcuda.
#pragma once

#include <cuda.h>

#include "sm90/problem.hpp"
#include "flash3/flash3.hpp"

namespace flash3::detail {

struct TensorMapShape {
  const void* data;
  DType dtype;
  int batch, seqlen, heads, headdim;
  Strides3 stride;  // elements
};

// A 4-d map over (headdim, seqlen, heads, batch), innermost first, whose box
// is (box_cols, box_rows, 1, 1): box_cols elements of headdim (at most 128
// bytes, the span of the 128-byte swizzle) by box_rows sequence positions.
// Rows past seqlen read as zero and are dropped on store.
Status make_tensor_map(const TensorMapShape& t, int box_cols, int box_rows, CUtensorMap* map);

}  // namespace flash3::detail
