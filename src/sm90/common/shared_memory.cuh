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

// The same storage as smem_raw plus an offset, so that the compiler keeps the
// shared address space: accesses through it are LDS / STS, not the generic
// LD / ST that the integer round trip above leaves (the backward's row
// statistics and dQ staging). Its wgmma descriptors are then best built as
// the tile's plus an offset (TileDesc<true>): from a shared-space address
// ptxas rebuilds each one (design.md, 'Backward kernel shape').
template <class Storage, int kAlign>
__device__ __forceinline__ Storage& shared_space_storage() {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  return *reinterpret_cast<Storage*>(smem_raw + ((kAlign - (base & (kAlign - 1))) & (kAlign - 1)));
}

}  // namespace flash3::sm90
