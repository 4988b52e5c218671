// Helpers shared by the examples: CUDA error checks in main() and bfloat16
// conversions on the host.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "flash3/flash3.hpp"

// In main(): print the failing call and return 1.
#define CUDA_CHECK(call)                                                              \
  do {                                                                                \
    cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(err_));       \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

#define FLASH3_CHECK(call)                                                            \
  do {                                                                                \
    flash3::Status status_ = (call);                                                  \
    if (!status_.ok()) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #call, status_.message.c_str());        \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

// bfloat16 is the upper half of a float32 (rounded to nearest even).
inline uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}
inline float from_bf16(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// Fills each tensor with bfloat16 N(0, 1) samples.
inline void fill_normal_bf16(std::initializer_list<std::vector<uint16_t>*> tensors,
                             unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (std::vector<uint16_t>* t : tensors) {
    for (uint16_t& x : *t) x = to_bf16(normal(rng));
  }
}

// On a GPU that is not a Hopper, flash3 returns kNoDevice and says why; with
// no GPU at all, cudaMalloc would fail first, less clearly: check here.
inline bool have_cuda_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: flash3 needs a Hopper GPU (H100, H200)\n");
    return false;
  }
  return true;
}
