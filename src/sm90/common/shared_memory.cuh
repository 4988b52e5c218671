// The kernels' dynamic shared memory as one struct: the launch adds kAlign
// bytes of slack (dynamic shared memory is only guaranteed 16-byte aligned)
// and the kernel rounds the base up to kAlign (the swizzle atom).
#pragma once

#include <cstdint>

namespace flash3::sm90 {

template <class Storage, int kAlign>
__device__ __forceinline__ Storage& aligned_shared_storage() {
  extern __shared__ uint8_t smem_raw[];
  const uintptr_t base = reinterpret_cast<uintptr_t>(smem_raw);
  const uintptr_t aligned = (base + kAlign - 1) & ~uintptr_t(kAlign - 1);
  return *reinterpret_cast<Storage*>(aligned);
}

}  // namespace flash3::sm90
