// Bulk tensor copies (TMA) between global and shared memory, over the 4-d
// maps of tensor_map.hpp: coordinates are (col, row, head, batch).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flash3::sm90 {

__device__ inline uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Global -> shared; completion is counted in bytes on `bar` (an Mbarrier word).
__device__ inline void tma_load(const CUtensorMap* map, uint64_t* bar, void* smem, int col,
                                int row, int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(col), "r"(row), "r"(head),
      "r"(batch)
      : "memory");
}

// Global -> the same shared offset of every CTA of the cluster in `cta_mask`;
// each destination counts the bytes on its own mbarrier at `bar`'s offset.
__device__ inline void tma_load_multicast(const CUtensorMap* map, uint64_t* bar, void* smem,
                                          uint16_t cta_mask, int col, int row, int head,
                                          int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5, %6, %7}], [%2], %3;" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "h"(cta_mask), "r"(col), "r"(row),
      "r"(head), "r"(batch)
      : "memory");
}

// Shared -> global; rows past the tensor's end are dropped.
__device__ inline void tma_store(const CUtensorMap* map, const void* smem, int col, int row,
                                 int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(smem)), "r"(col), "r"(row), "r"(head), "r"(batch)
      : "memory");
}

// Global -> shared, `bytes` contiguous bytes (a multiple of 16, both ends
// 16-byte aligned), counted on `bar` like tma_load.
__device__ inline void bulk_load(uint64_t* bar, void* smem, const void* gmem, uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(gmem)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// gmem[i] = smem[i] for `bytes` bytes (a multiple of 16, both ends 16-byte
// aligned), as one bulk operation of the async proxy; a bulk group like
// tma_store.
__device__ inline void bulk_store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<uint64_t>(gmem)),
               "r"(smem_u32(smem)), "r"(bytes)
               : "memory");
}

// gmem[i] += smem[i] for `bytes` / 4 floats (a multiple of 16 bytes, both
// ends 16-byte aligned), as one bulk operation of the async proxy (atomic per
// element); a bulk group like tma_store.
__device__ inline void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<uint64_t>(gmem)),
               "r"(smem_u32(smem)), "r"(bytes)
               : "memory");
}

// Four 8x8 tiles of 16-bit values to shared memory (stmatrix): register i of
// a lane holds row lane / 4, columns 2 (lane % 4) and + 1 of tile i (the
// wgmma accumulator fragment, packed), and lane l gives the address of row
// l % 8 of tile l / 8 (16-byte aligned).
__device__ inline void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                   uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The inverse of stmatrix_x4: four 8x8 tiles of 16-bit values from shared
// memory, register i of a lane holding what stmatrix_x4 took from it.
__device__ inline void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                   uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

__device__ inline void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until the committed stores have finished reading shared memory.
__device__ inline void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Waits until the committed bulk operations have completed (their global
// writes performed), not only read shared memory.
__device__ inline void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__device__ inline void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace flash3::sm90
