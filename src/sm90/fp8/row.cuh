// One row of the quantization kernel as 4 lanes hold it: load, the
// randomized Hadamard transform (its 1 / sqrt(d) left to the encoding
// factor), |max|, encode to e4m3. Every float operation
// is the CPU reference's (reference/fp8.cpp), in its order and rounding, so
// the codes and scales match it bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "flash3/flash3.hpp"

namespace flash3::sm90::fp8 {

inline constexpr unsigned kFullWarp = 0xFFFFFFFFu;
inline constexpr int kWarpSize = 32;
inline constexpr float kE4m3Max = 448.0f;  // the largest finite e4m3 value (ref::kE4m3Max)
inline constexpr float kUnitScale = 1.0f;  // the scale of an all-zero block
// The least scale of a block that is not all zeros (ref::kMinScale): FLT_MIN,
// below which norm / scale, the encoding factor, could overflow.
inline constexpr float kMinScale = 1.17549435e-38f;
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kBitsPerWord = 32;
inline constexpr int kHalfBits = 16;

// How one CTA spreads a block of rows over its threads.
//
// A row is spread over kLanesPerRow lanes in 16-byte chunks of kChunkElems
// elements: lane l holds chunks l, l + 4, l + 8, ... So element j of the row
// sits in lane (j / 8) % 4, chunk slot j / 32, position j % 8, and
//  - every load instruction reads 64 contiguous bytes of each row (8 rows a
//    warp), every store 32 (one sector);
//  - the butterflies of h = 1, 2, 4 (position bits) and h = 32, 64, 128 (slot
//    bits) stay inside a lane; only h = 8, 16 cross lanes: 2 shuffles per
//    element at every head dim. The kernel is bound by its instruction issue
//    as much as by memory (a Hadamard element took about 24 instructions with
//    8 lanes a row, an IEEE division and the normalisation each): each
//    cross-lane stage is a shuffle and an FMA, an in-lane one an add.
template <int kHeadDim>
struct QuantizeTraits {
  static constexpr int kWarps = 16;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kLanesPerRow = 4;
  static constexpr int kChunkElems = 8;  // 16 bytes of fp16/bf16 in, 8 bytes of e4m3 out
  static constexpr int kChunks = kHeadDim / (kLanesPerRow * kChunkElems);  // per lane: 2, 4, 8
  static constexpr int kChunkWords = kChunkElems / 2;                      // 32-bit words in
  // A CTA's rows side by side, one a thread's lanes (128): a default block,
  // or a slice of a longer one (quantize.cu), each row read once.
  static constexpr int kRows = kThreads / kLanesPerRow;
  // At head dim 256 the row alone takes 64 registers a thread, more than
  // two CTAs of 512 threads leave, and its staging (quantize.cu: two items'
  // rows, 128 KB) one CTA's shared memory; below it two CTAs share an SM
  // (32 or 64 KB of staging each).
  static constexpr int kMinBlocksPerSm = kHeadDim == kMaxHeadDim ? 1 : 2;

  static_assert(kChunks >= 1 && kChunks * kLanesPerRow * kChunkElems == kHeadDim,
                "head dim must be a multiple of 32");
  static_assert(kHeadDim <= kMaxHeadDim, "the sign table holds kMaxHeadDim columns");
};

// The elements of one row that one lane holds, as floats: v[c][e] is element
// (c * kLanesPerRow + lane_in_row) * kChunkElems + e.
template <int kHeadDim>
struct RowFragment {
  using T = QuantizeTraits<kHeadDim>;
  float v[T::kChunks][T::kChunkElems];
};

// The raw 16-bit elements of a fragment, one 16-byte chunk per slot.
template <int kHeadDim>
struct RawFragment {
  uint4 chunk[QuantizeTraits<kHeadDim>::kChunks];
};

// The XOR masks that flip the sign bit of each raw element whose Hadamard
// sign is -1 (exact negation, as the reference's multiplication by -1): one
// 32-bit word, two elements, per entry, shared by the CTA. Filled from the
// column sign bits (bit j set where column j's sign is -1); the CTA
// synchronises before the first flip_signs.
template <int kHeadDim>
__device__ void fill_sign_masks(const uint32_t* sign_bits, uint32_t* masks) {
  constexpr uint32_t kLowSign = 0x8000u;  // sign bit of the low 16-bit element
  const int word = threadIdx.x;           // elements 2 word and 2 word + 1
  static_assert(kHeadDim / 2 <= QuantizeTraits<kHeadDim>::kThreads, "one word per thread");
  if (word < kHeadDim / 2) {
    const uint32_t pair = sign_bits[word / (kBitsPerWord / 2)] >> (2 * word % kBitsPerWord);
    masks[word] = (pair & 1u) * kLowSign | ((pair >> 1) & 1u) * (kLowSign << kHalfBits);
  }
}

// The lane's chunks of the row at `row` (elements), or zeros where !valid.
template <int kHeadDim>
__device__ RawFragment<kHeadDim> load_row(const void* row, bool valid, int lane_in_row) {
  using T = QuantizeTraits<kHeadDim>;
  RawFragment<kHeadDim> raw;
  const uint4* chunks = static_cast<const uint4*>(row);
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    raw.chunk[c] = valid ? __ldg(chunks + c * T::kLanesPerRow + lane_in_row) : uint4{};
  }
  return raw;
}

// The same chunks copied into shared memory without registers (cp.async,
// 16 bytes each; zeros where !valid): slot `c` of chunk c at staging[c *
// kThreads + threadIdx.x]. Complete, for this thread, after its
// cp_async_commit and cp_async_wait; read back with staged_row.
template <int kHeadDim>
__device__ void stage_row(uint4* staging, const void* row, bool valid, int lane_in_row) {
  using T = QuantizeTraits<kHeadDim>;
  const uint4* chunks = static_cast<const uint4*>(row);
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    const uint32_t dst = static_cast<uint32_t>(
        __cvta_generic_to_shared(staging + c * T::kThreads + threadIdx.x));
    const uint4* src = valid ? chunks + c * T::kLanesPerRow + lane_in_row : chunks;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  }
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
template <int kHeadDim>
__device__ RawFragment<kHeadDim> staged_row(const uint4* staging) {
  using T = QuantizeTraits<kHeadDim>;
  RawFragment<kHeadDim> raw;
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    raw.chunk[c] = staging[c * T::kThreads + threadIdx.x];
  }
  return raw;
}

// Two 16-bit elements (the first in the low half) to floats, exactly.
template <DType kDType>
__device__ float2 to_float2(uint32_t word) {
  if constexpr (kDType == DType::kFloat16) {
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  }
}

template <DType kDType, int kHeadDim>
__device__ RowFragment<kHeadDim> to_floats(const RawFragment<kHeadDim>& raw) {
  using T = QuantizeTraits<kHeadDim>;
  RowFragment<kHeadDim> row;
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    const uint32_t words[T::kChunkWords] = {raw.chunk[c].x, raw.chunk[c].y, raw.chunk[c].z,
                                            raw.chunk[c].w};
#pragma unroll
    for (int w = 0; w < T::kChunkWords; ++w) {
      const float2 pair = to_float2<kDType>(words[w]);
      row.v[c][2 * w] = pair.x;
      row.v[c][2 * w + 1] = pair.y;
    }
  }
  return row;
}

template <int kHeadDim>
__device__ void flip_signs(RawFragment<kHeadDim>& raw, const uint32_t* masks, int lane_in_row) {
  using T = QuantizeTraits<kHeadDim>;
  const uint4* chunk_masks = reinterpret_cast<const uint4*>(masks);
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    const uint4 m = chunk_masks[c * T::kLanesPerRow + lane_in_row];
    raw.chunk[c].x ^= m.x;
    raw.chunk[c].y ^= m.y;
    raw.chunk[c].z ^= m.z;
    raw.chunk[c].w ^= m.w;
  }
}

// (a, b) -> (a + b, a - b), rounded to float.
__device__ inline void butterfly(float& a, float& b) {
  const float sum = __fadd_rn(a, b);
  b = __fsub_rn(a, b);
  a = sum;
}

// row <- row H_d (unnormalised: the 1 / sqrt(d) is in the encoding factor,
// as ref::quantize_e4m3 has it): butterflies over the pairs (j, j + h) for
// h = 1, 2, 4, ..., d / 2 in that order.
template <int kHeadDim>
__device__ void walsh_hadamard(RowFragment<kHeadDim>& row, int lane_in_row) {
  using T = QuantizeTraits<kHeadDim>;
  // h = 1, 2, 4: positions e and e + h of a chunk.
#pragma unroll
  for (int h = 1; h < T::kChunkElems; h *= 2) {
#pragma unroll
    for (int c = 0; c < T::kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < T::kChunkElems; ++e) {
        if ((e & h) == 0) {
          butterfly(row.v[c][e], row.v[c][e + h]);
        }
      }
    }
  }
  // h = 8, 16: the same slot of lanes lane_in_row and lane_in_row ^ m.
  // The lower lane holds a and computes a + b; the upper holds b and
  // computes fma(b, -1, a) = a - b (the product is exact: one rounding).
#pragma unroll
  for (int m = 1; m < T::kLanesPerRow; m *= 2) {
    const float flip = (lane_in_row & m) != 0 ? -1.0f : 1.0f;
#pragma unroll
    for (int c = 0; c < T::kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < T::kChunkElems; ++e) {
        const float other = __shfl_xor_sync(kFullWarp, row.v[c][e], m);
        row.v[c][e] = __fmaf_rn(row.v[c][e], flip, other);
      }
    }
  }
  // h = 32, 64, 128: slots c and c + s of a lane.
#pragma unroll
  for (int s = 1; s < T::kChunks; s *= 2) {
#pragma unroll
    for (int c = 0; c < T::kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < T::kChunkElems; ++e) {
        if ((c & s) == 0) {
          butterfly(row.v[c][e], row.v[c + s][e]);
        }
      }
    }
  }
}

// amax = max(amax, |x|) over the fragment; NaN is passed over, as std::max
// with amax first does.
template <int kHeadDim>
__device__ float fragment_amax(const RowFragment<kHeadDim>& row, float amax) {
#pragma unroll
  for (int c = 0; c < QuantizeTraits<kHeadDim>::kChunks; ++c) {
#pragma unroll
    for (int e = 0; e < QuantizeTraits<kHeadDim>::kChunkElems; ++e) {
      amax = fmaxf(amax, fabsf(row.v[c][e]));
    }
  }
  return amax;
}

// Two codes of x times `factor` (norm / scale: quantize.cu), the first in the
// low byte: round to nearest even, saturate at +-448, NaN to 0x7F
// (cvt.rn.satfinite.e4m3x2.f32; __nv_cvt_float2_to_fp8x2 puts .x in the low
// byte).
__device__ inline uint32_t encode_pair(float first, float second, float factor) {
  const float2 pair = make_float2(__fmul_rn(first, factor), __fmul_rn(second, factor));
  return __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
}

// code = e4m3(x factor) for the lane's elements, stored in the row at
// `out_row` (e4m3 bytes) where valid.
template <int kHeadDim>
__device__ void store_codes(const RowFragment<kHeadDim>& row, float factor, void* out_row,
                            bool valid, int lane_in_row) {
  using T = QuantizeTraits<kHeadDim>;
  uint2* chunks = static_cast<uint2*>(out_row);
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    const float* v = row.v[c];
    const uint2 codes = {
        encode_pair(v[0], v[1], factor) | encode_pair(v[2], v[3], factor) << kHalfBits,
        encode_pair(v[4], v[5], factor) | encode_pair(v[6], v[7], factor) << kHalfBits};
    if (valid) {
      chunks[c * T::kLanesPerRow + lane_in_row] = codes;
    }
  }
}

// ---------------------------------------------------------------- Fp8V tile
// Where key p (0..15) of a group of 16 goes in the Fp8V layout: the inverse
// of flash3::kFp8VKeyOrder (checked below), so slot fp8v_slot(p) holds key p.
__host__ __device__ constexpr int fp8v_slot(int p) {
  return 4 * ((p >> 1) & 3) + 2 * (p >> 3) + (p & 1);
}
constexpr bool fp8v_slot_inverts_key_order() {
  for (int p = 0; p < kFp8VKeyGroup; ++p) {
    if (kFp8VKeyOrder[fp8v_slot(p)] != p) {
      return false;
    }
  }
  return true;
}
static_assert(fp8v_slot_inverts_key_order(), "fp8v_slot must invert kFp8VKeyOrder");

// The lane's codes of e4m3(x factor) (zeros where !valid) into a shared
// tile of kHeadDim columns, each a row of `pitch` bytes whose byte `slot`
// is this row's code: the transpose that the Fp8V layout stores.
template <int kHeadDim>
__device__ void store_codes_transposed(const RowFragment<kHeadDim>& row, float factor,
                                       uint8_t* tile, int pitch, int slot, bool valid,
                                       int lane_in_row) {
  using T = QuantizeTraits<kHeadDim>;
#pragma unroll
  for (int c = 0; c < T::kChunks; ++c) {
    const float* v = row.v[c];
    uint8_t* column = tile + (c * T::kLanesPerRow + lane_in_row) * T::kChunkElems * pitch + slot;
#pragma unroll
    for (int e = 0; e < T::kChunkElems; e += 2) {
      const uint32_t pair = valid ? encode_pair(v[e], v[e + 1], factor) : 0u;
      column[e * pitch] = static_cast<uint8_t>(pair);
      column[(e + 1) * pitch] = static_cast<uint8_t>(pair >> 8);
    }
  }
}

}  // namespace flash3::sm90::fp8
