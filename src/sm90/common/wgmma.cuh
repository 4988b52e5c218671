// Warpgroup MMA (wgmma) on Hopper: shared-memory matrix descriptors for the
// 128-byte-swizzled tiles that TMA writes, and calls of CuTe's MMA atoms with
// the accumulator held in a plain register array.
//
// Tile layout used everywhere: a tile of R rows by C columns is stored as
// column blocks of 128 bytes (64 16-bit or 128 8-bit elements), each R rows, with the
// 16-byte chunks of row r XOR-ed by (r % 8) (TMA's SWIZZLE_128B). Tiles start
// on 1024-byte boundaries, so the swizzle phase is the same for hardware and
// software.
#pragma once

#include <cstdint>
#include <utility>

// N = 80, 176, ... (multiples of 8 that are not multiples of 16/32) live in the extended set.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <cute/arch/mma_sm90.hpp>

#include "sm90/common/accumulator.hpp"

namespace flash3::sm90 {

namespace gmma = cute::SM90::GMMA;

inline constexpr int kSwizzleRowBytes = 128;                        // one swizzled row
inline constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;      // 8 rows: one XOR period
inline constexpr int kSwizzleCols16 = kSwizzleRowBytes / 2;         // 16-bit elements per row
inline constexpr int kMmaKBytes = 32;                               // K of one wgmma, in bytes
inline constexpr int kMmaK16 = kMmaKBytes / 2;                      // K of one 16-bit wgmma
inline constexpr int kMmaM = 64;                                    // M of one wgmma (a warpgroup)

// Bits of the wgmma shared-memory descriptor (PTX ISA, "Matrix Descriptor").
__device__ inline uint64_t make_smem_desc(uint32_t smem_addr, uint32_t leading_bytes,
                                          uint32_t stride_bytes) {
  constexpr uint64_t kSwizzle128B = 1;
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= kSwizzle128B << 62;
  return desc;
}

// Byte offset of element (row, col) of a 16-bit tile of kRows rows in the
// layout above.
template <int kRows>
__device__ __forceinline__ uint32_t tile_offset16(int row, int col) {
  const int block = col / kSwizzleCols16;
  const int chunk = (col % kSwizzleCols16) / 8;  // 16-byte chunk within the 128-byte row
  return block * kRows * kSwizzleRowBytes + row * kSwizzleRowBytes + ((chunk ^ (row % 8)) * 16) +
         (col % 8) * 2;
}

// A tile's descriptors: at(offset) is that of the tile `offset` bytes on.
// kAdd: the tile's descriptor plus offset >> 4 in its low word (the address
// field holds bits 4..17 of the shared address and shared memory ends below
// 2^18 bytes, so it never carries out of the field), one uniform add per
// wgmma; else a descriptor made from the address plus offset, three dependent
// uniform instructions (add, mask and shift, or). Which is faster depends on
// ptxas's plan of the whole kernel (Traits::kDescAdd).
template <bool kAdd>
struct TileDesc {
  uint32_t addr, leading_bytes, stride_bytes;
  __device__ uint64_t at(uint32_t offset) const {
    if constexpr (kAdd) {
      const uint64_t base = make_smem_desc(addr, leading_bytes, stride_bytes);
      return (base >> 32) << 32 | (static_cast<uint32_t>(base) + (offset >> 4));
    } else {
      return make_smem_desc(addr + offset, leading_bytes, stride_bytes);
    }
  }
};

// Operand whose reduction dimension is the contiguous one (Q and K in Q K^T):
// rows at 128 B, 8-row groups at 1024 B; the leading offset is unused for
// swizzled K-major layouts and set to one unit as CuTe does.
template <bool kAdd>
__device__ inline TileDesc<kAdd> desc_k_major(uint32_t smem_addr) {
  return {smem_addr, 16, kSwizzleAtomBytes};
}

// Operand whose M/N dimension is the contiguous one (V in P V): 64-column
// blocks `block_bytes` apart, 8-row groups of the reduction dim at 1024 B.
template <bool kAdd>
__device__ inline TileDesc<kAdd> desc_mn_major(uint32_t smem_addr, uint32_t block_bytes) {
  return {smem_addr, block_bytes, kSwizzleAtomBytes};
}

// One wgmma: 64 x kN x (32 bytes of Element); 8-bit types take only K-major B.
template <class Element>
using MmaKShape = cute::Int<kMmaKBytes / static_cast<int>(sizeof(Element))>;
template <class Element, int kN, gmma::Major kMajorB, gmma::Major kMajorA = gmma::Major::K>
using MmaSS =
    decltype(gmma::ss_op_selector<Element, Element, float,
                                  cute::Shape<cute::_64, cute::Int<kN>, MmaKShape<Element>>,
                                  kMajorA, kMajorB>());
template <class Element, int kN, gmma::Major kMajorB>
using MmaRS =
    decltype(gmma::rs_op_selector<Element, Element, float,
                                  cute::Shape<cute::_64, cute::Int<kN>, MmaKShape<Element>>,
                                  gmma::Major::K, kMajorB>());

namespace detail {
template <class Op, size_t... I>
__device__ __forceinline__ void mma_ss(uint64_t a, uint64_t b, float* d, gmma::ScaleOut scale,
                                       std::index_sequence<I...>) {
  Op::fma(a, b, d[I]..., scale);
}
template <class Op, size_t... I>
__device__ __forceinline__ void mma_rs(const uint32_t* a, uint64_t b, float* d,
                                       gmma::ScaleOut scale, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., scale);
}
}  // namespace detail

// d (64 x kN per warpgroup, kN/2 floats per thread) (+)= A(smem) * B(smem);
// A is K-major unless kMajorA says MN-major (16-bit types only).
template <class Element, int kN, gmma::Major kMajorB, int kRegs,
          gmma::Major kMajorA = gmma::Major::K>
__device__ __forceinline__ void mma_ss(uint64_t desc_a, uint64_t desc_b, float (&d)[kRegs],
                                       bool accumulate) {
  using Op = MmaSS<Element, kN, kMajorB, kMajorA>;
  static_assert(sizeof(typename Op::CRegisters) / sizeof(float) == kRegs, "wgmma N mismatch");
  detail::mma_ss<Op>(desc_a, desc_b, d, accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero,
                     std::make_index_sequence<kRegs>{});
}

// d += A(registers: 4 x 32-bit, one 64x16 fragment) * B(smem).
template <class Element, int kN, gmma::Major kMajorB, int kRegs>
__device__ __forceinline__ void mma_rs(const uint32_t* a, uint64_t desc_b, float (&d)[kRegs]) {
  using Op = MmaRS<Element, kN, kMajorB>;
  static_assert(sizeof(typename Op::CRegisters) / sizeof(float) == kRegs, "wgmma N mismatch");
  detail::mma_rs<Op>(a, desc_b, d, gmma::ScaleOut::One, std::make_index_sequence<kRegs>{});
}

// d's registers [kFirst, kFirst + kN / 2) += A * B: one wgmma of kN columns
// into part of a wider accumulator (the fragment of N columns is that of
// its 8-column groups in order, so N = 96 is N = 64's registers then N = 32's).
template <class Element, int kN, gmma::Major kMajorB, int kFirst, int kRegs>
__device__ __forceinline__ void mma_rs_cols(const uint32_t* a, uint64_t desc_b,
                                            float (&d)[kRegs]) {
  using Op = MmaRS<Element, kN, kMajorB>;
  static_assert(kFirst % 4 == 0 && kFirst + kN / 2 <= kRegs, "whole 8-column groups of d");
  detail::mma_rs<Op>(a, desc_b, d + kFirst, gmma::ScaleOut::One,
                     std::make_index_sequence<kN / 2>{});
}

// The same with A from shared memory: d's registers [kFirst, kFirst + kN / 2)
// (+)= A * B.
template <class Element, int kN, gmma::Major kMajorB, gmma::Major kMajorA, int kFirst, int kRegs>
__device__ __forceinline__ void mma_ss_cols(uint64_t desc_a, uint64_t desc_b, float (&d)[kRegs],
                                            bool accumulate) {
  using Op = MmaSS<Element, kN, kMajorB, kMajorA>;
  static_assert(kFirst % 4 == 0 && kFirst + kN / 2 <= kRegs, "whole 8-column groups of d");
  detail::mma_ss<Op>(desc_a, desc_b, d + kFirst,
                     accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero,
                     std::make_index_sequence<kN / 2>{});
}

// Keeps the compiler from moving register reads/writes across wgmma issue/wait.
template <class T, int kRegs>
__device__ __forceinline__ void fence_operands(T (&regs)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    cute::warpgroup_fence_operand(regs[i]);
  }
}

__device__ __forceinline__ void mma_fence() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void mma_commit() { cute::warpgroup_commit_batch(); }
template <int kPending>
__device__ __forceinline__ void mma_wait() {
  cute::warpgroup_wait<kPending>();
}

}  // namespace flash3::sm90
