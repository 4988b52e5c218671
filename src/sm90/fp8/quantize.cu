// FP8 quantization (issue 4): fp16/bf16 rows to e4m3 codes with one scale
// per block of rows of one (batch, head), optionally after the randomized
// Hadamard transform. Memory-bound: 2 bytes read and 1 written per element.
//
// Blocks of up to kSliceRows rows (the default 128): one CTA per (batch,
// row block, head), heads fastest so that the CTAs running together read
// neighbouring memory. The CTA walks its block in kCachedPasses passes of
// kRowsPerPass rows (row.cuh says how a row lies on 4 lanes):
//   amax pass:   load, transform (the Hadamard transform unnormalised),
//                |max|; the rows stay in registers
//   scale:       warp max, then across warps through shared memory;
//                scale = amax norm / 448 (norm = 1 / sqrt(d) after the
//                transform, else 1), factor = norm / scale
//   encode pass: e4m3(x factor) of the rows in registers
// (ref::quantize_e4m3 computes the same floats in the same order.)
// Longer blocks (one scale per head: block_rows = seqlen) are cut into
// slices of kSliceRows rows, one CTA each, in three launches after zeroing
// the descales: every slice's amax into its block's descale word
// (atomicMax on the bits: amax >= 0), every slice encoded with its block's
// scale, then each word turned from amax into scale. (One CTA per such
// block gave 16 CTAs to a d128 16k tensor: 1.63 ms against 0.16 ms with
// 128-row blocks.) Both paths give the same bits: max is exact.
// Rows past seqlen are neither read nor written nor counted in amax.
// kVLayout (quantize_fp8_v): the encode pass puts the codes into a shared
// tile, key-major per column and with the slots of every 16 keys permuted as
// the FP8 forward reads V (flash3::Fp8V), and the CTA writes the tile's
// columns out as rows of the Fp8V tensor, zeros in the slots past seqlen of
// the last 16 (a CTA's rows start at a multiple of 16: validate_quantize).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "sm90/launch.hpp"
#include "hadamard_sign.hpp"
#include "row.cuh"

namespace flash3::sm90::fp8 {

struct QuantizeArgs {
  const uint16_t* x;                        // fp16 or bf16 bits
  uint8_t* x_fp8;                           // e4m3 bits
  float* descale;                           // (batch, heads, blocks_per_head)
  detail::Strides3 x_stride, x_fp8_stride;  // elements
  int seqlen;
  int heads;
  int block_rows;
  int blocks_per_head;
  float norm;  // float(1 / sqrt(headdim)) after the Hadamard transform (as the reference rounds it), else 1
  uint8_t* v_out;    // kVLayout: the Fp8V tensor
  int64_t v_padded;  // its padded seqlen
  uint32_t sign_bits[kMaxHeadDim / kBitsPerWord];  // bit j: column j's Hadamard sign is -1
};

// What one CTA of quantize_kernel does (see the top of the file).
enum class QuantizePass {
  kWhole,   // a block of up to kSliceRows rows: amax, scale, encode
  kAmax,    // a slice of a longer block: its amax into the block's descale word
  kEncode,  // the same slice: encode with the scale of the block's amax
};

// The scale of a block whose rows' (unnormalised) |max| is amax: amax norm
// / 448 (IEEE rounding each), 1 where that is 0, at least kMinScale (so
// that norm / scale is finite: row.cuh).
__device__ __forceinline__ float scale_of_amax(float amax, float norm) {
  const float scale = __fdiv_rn(__fmul_rn(amax, norm), kE4m3Max);
  return scale == 0.0f ? kUnitScale : fmaxf(scale, kMinScale);
}
// What the encode pass multiplies by: norm / scale.
__device__ __forceinline__ float factor_of_scale(float scale, float norm) {
  return __fdiv_rn(norm, scale);
}

// The CTA's amax from every thread's. The order of the maxima does not
// matter: max is exact.
template <class T>
__device__ float cta_amax(float amax, float* warp_amax) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, offset));
  }
  if (lane == 0) {
    warp_amax[warp] = amax;
  }
  __syncthreads();
#pragma unroll
  for (int w = 0; w < T::kWarps; ++w) {
    amax = fmaxf(amax, warp_amax[w]);
  }
  return amax;
}

// The rows one CTA covers (all of them in registers between its passes): a
// whole block, or one slice of a longer one.
template <class T>
inline constexpr int kSliceRows = T::kCachedPasses * T::kRowsPerPass;

// How many slices a block of block_rows rows is cut into (1: one kWhole CTA).
template <class T>
__host__ __device__ constexpr int slices_per_block(int block_rows) {
  return block_rows <= kSliceRows<T> ? 1 : (block_rows + kSliceRows<T> - 1) / kSliceRows<T>;
}

// kVLayout's shared tile: a row of kSliceRows codes (+ 8 bytes, so that the
// 4 lanes of a row, 8 columns apart, hit at most 2 banks) per column.
template <class T>
inline constexpr int kVTilePitch = kSliceRows<T> + 8;

template <DType kDType, int kHeadDim, bool kHadamard, bool kVLayout, QuantizePass kPass>
__global__ void __launch_bounds__(QuantizeTraits<kHeadDim>::kThreads,
                                  QuantizeTraits<kHeadDim>::kMinBlocksPerSm)
    quantize_kernel(const __grid_constant__ QuantizeArgs args) {
  using T = QuantizeTraits<kHeadDim>;
  using Fragment = RowFragment<kHeadDim>;
  static_assert(!kVLayout || kPass != QuantizePass::kAmax, "kAmax stores no codes");
  static_assert(kSliceRows<T> % kFp8VKeyGroup == 0, "a CTA's rows are whole key groups");
  __shared__ float warp_amax[T::kWarps];
  __shared__ alignas(sizeof(uint4)) uint32_t sign_masks[kHeadDim / 2];
  __shared__ alignas(sizeof(uint2)) uint8_t v_tile[kVLayout ? kHeadDim * kVTilePitch<T> : 1];

  const int slices = slices_per_block<T>(args.block_rows);
  const int head = blockIdx.x % args.heads;
  const int slice = blockIdx.x / args.heads % slices;
  const int block = blockIdx.x / args.heads / slices % args.blocks_per_head;
  const int batch = blockIdx.x / args.heads / slices / args.blocks_per_head;
  const int block_first_row = block * args.block_rows;
  const int block_rows = min(args.block_rows, args.seqlen - block_first_row);
  const int first_row = block_first_row + slice * kSliceRows<T>;
  const int rows = min(kSliceRows<T>, block_rows - slice * kSliceRows<T>);
  if (rows <= 0) {  // a slice past the end of a short last block
    return;
  }
  float* const descale =
      args.descale + (int64_t{batch} * args.heads + head) * args.blocks_per_head + block;
  const int passes = (rows + T::kRowsPerPass - 1) / T::kRowsPerPass;
  const int slot = threadIdx.x / T::kLanesPerRow;  // the row of each pass
  const int lane_in_row = threadIdx.x % T::kLanesPerRow;

  const uint16_t* x = args.x + batch * args.x_stride.batch + head * args.x_stride.head +
                      first_row * args.x_stride.seq;
  uint8_t* x_fp8 = args.x_fp8 + batch * args.x_fp8_stride.batch + head * args.x_fp8_stride.head +
                   first_row * args.x_fp8_stride.seq;
  if constexpr (kHadamard) {
    fill_sign_masks<kHeadDim>(args.sign_bits, sign_masks);
  }

  // Every lane of a warp runs every pass (the butterflies shuffle); rows past
  // the block load zeros and store nothing.
  const auto row_of = [&](int pass) { return pass * T::kRowsPerPass + slot; };
  const auto load = [&](int pass) {
    const int row = row_of(pass);
    return load_row<kHeadDim>(x + row * args.x_stride.seq, row < rows, lane_in_row);
  };
  const auto transform = [&](RawFragment<kHeadDim> raw) {
    if constexpr (kHadamard) {
      flip_signs(raw, sign_masks, lane_in_row);
    }
    Fragment f = to_floats<kDType, kHeadDim>(raw);
    if constexpr (kHadamard) {
      walsh_hadamard(f, lane_in_row);
    }
    return f;
  };
  const auto store = [&](const Fragment& f, int pass, float factor) {
    const int row = row_of(pass);
    if constexpr (kVLayout) {  // every row of the tile, zeros past the block
      const int slot = row / kFp8VKeyGroup * kFp8VKeyGroup + fp8v_slot(row % kFp8VKeyGroup);
      store_codes_transposed(f, factor, v_tile, kVTilePitch<T>, slot, row < rows, lane_in_row);
    } else {
      store_codes(f, factor, x_fp8 + row * args.x_fp8_stride.seq, row < rows, lane_in_row);
    }
  };
  // kVLayout, after the encode pass: the tile's columns to their Fp8V rows,
  // up to the CTA's last whole group of 16 slots (zeros past seqlen), in
  // 8-byte pieces.
  const auto write_v_tile = [&] {
    if constexpr (kVLayout) {
      __syncthreads();
      const int pieces = (rows + kFp8VKeyGroup - 1) / kFp8VKeyGroup * kFp8VKeyGroup / 8;
      uint8_t* out = args.v_out +
                     (int64_t{batch} * args.heads + head) * kHeadDim * args.v_padded + first_row;
      for (int i = threadIdx.x; i < kHeadDim * pieces; i += T::kThreads) {
        const int column = i / pieces, piece = i % pieces;
        *reinterpret_cast<uint2*>(out + column * args.v_padded + piece * 8) =
            *reinterpret_cast<const uint2*>(v_tile + column * kVTilePitch<T> + piece * 8);
      }
    }
  };

  if constexpr (kPass == QuantizePass::kEncode) {
    // The block's amax, from kAmax.
    const float factor = factor_of_scale(scale_of_amax(*descale, args.norm), args.norm);
    if constexpr (kHadamard) {
      __syncthreads();  // the sign masks
    }
    for (int p = 0; p < passes; ++p) {
      store(transform(load(p)), p, factor);
    }
    write_v_tile();
  } else {
    // Amax pass: all cached loads in flight before the first transform.
    RawFragment<kHeadDim> raw[T::kCachedPasses];
#pragma unroll
    for (int p = 0; p < T::kCachedPasses; ++p) {
      raw[p] = load(p);
    }
    if constexpr (kHadamard) {
      __syncthreads();  // the sign masks
    }
    float amax = 0.0f;
    Fragment cached[T::kCachedPasses];
#pragma unroll
    for (int p = 0; p < T::kCachedPasses; ++p) {
      if (p < passes) {
        cached[p] = transform(raw[p]);
        amax = fragment_amax(cached[p], amax);
      }
    }

    amax = cta_amax<T>(amax, warp_amax);
    if constexpr (kPass == QuantizePass::kAmax) {
      if (threadIdx.x == 0) {  // amax >= 0, so its bits order as unsigned integers
        atomicMax(reinterpret_cast<unsigned*>(descale), __float_as_uint(amax));
      }
    } else {
      const float scale = scale_of_amax(amax, args.norm);
      if (threadIdx.x == 0) {
        *descale = scale;
      }
      const float factor = factor_of_scale(scale, args.norm);

      // Encode pass.
#pragma unroll
      for (int p = 0; p < T::kCachedPasses; ++p) {
        if (p < passes) {
          store(cached[p], p, factor);
        }
      }
      write_v_tile();
    }
  }
}

// After kAmax and kEncode: each block's descale word from amax to scale.
__global__ void amax_to_scale_kernel(float* descale, int count, float norm) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    descale[i] = scale_of_amax(descale[i], norm);
  }
}

}  // namespace flash3::sm90::fp8

namespace flash3::detail {
namespace {

sm90::fp8::QuantizeArgs quantize_args(const QuantizeParams& p) {
  sm90::fp8::QuantizeArgs args{};
  args.x = static_cast<const uint16_t*>(p.x);
  args.x_fp8 = static_cast<uint8_t*>(p.x_fp8);
  args.descale = p.descale;
  args.x_stride = p.x_stride;
  args.x_fp8_stride = p.x_fp8_stride;
  args.seqlen = p.seqlen;
  args.heads = p.heads;
  args.block_rows = p.block_rows;
  args.blocks_per_head = p.blocks_per_head;
  args.v_out = static_cast<uint8_t*>(p.v_out);
  args.v_padded = fp8_v_padded_seqlen(p.seqlen);
  // The reference's expression (ref::quantize_e4m3), evaluated on the host.
  args.norm = p.hadamard ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.headdim)))
                         : 1.0f;
  for (int j = 0; p.hadamard && j < p.headdim; ++j) {
    if (incoherent::hadamard_sign(p.seed, j) < 0) {
      args.sign_bits[j / sm90::fp8::kBitsPerWord] |= 1u << (j % sm90::fp8::kBitsPerWord);
    }
  }
  return args;
}

}  // namespace

template <DType kDType, int kHeadDim, bool kHadamard, bool kVLayout>
Status launch_quantize_sm90(const QuantizeParams& p, cudaStream_t stream) {
  using namespace sm90::fp8;
  using T = QuantizeTraits<kHeadDim>;
  const QuantizeArgs args = quantize_args(p);
  const auto failed = [](const char* what, cudaError_t err) {
    return Status{StatusCode::kCudaError, std::string(kQuantizeCall) + ": " + what +
                                              " failed: " + cudaGetErrorName(err) + ": " +
                                              cudaGetErrorString(err)};
  };
  const int slices = slices_per_block<T>(p.block_rows);
  if (slices == 1) {
    quantize_kernel<kDType, kHeadDim, kHadamard, kVLayout, QuantizePass::kWhole>
        <<<static_cast<unsigned>(p.num_blocks), T::kThreads, 0, stream>>>(args);
  } else {
    const auto grid = static_cast<unsigned>(int64_t{p.num_blocks} * slices);
    constexpr int kFinishThreads = 256;
    const cudaError_t zeroed = cudaMemsetAsync(p.descale, 0, p.num_blocks * sizeof(float), stream);
    if (zeroed != cudaSuccess) {
      return failed("zeroing the descales", zeroed);
    }
    quantize_kernel<kDType, kHeadDim, kHadamard, false, QuantizePass::kAmax>
        <<<grid, T::kThreads, 0, stream>>>(args);
    quantize_kernel<kDType, kHeadDim, kHadamard, kVLayout, QuantizePass::kEncode>
        <<<grid, T::kThreads, 0, stream>>>(args);
    amax_to_scale_kernel<<<static_cast<unsigned>((p.num_blocks + kFinishThreads - 1) /
                                                 kFinishThreads),
                           kFinishThreads, 0, stream>>>(p.descale, p.num_blocks, args.norm);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return failed("launch", err);
  }
  return {};
}

// The Hadamard option and the V layout are not taken together
// (validate_quantize: V is not transformed).
#define FLASH3_QUANTIZE_INSTANCES(DTYPE, HEADDIM)                                                \
  template Status launch_quantize_sm90<DType::DTYPE, HEADDIM, false, false>(                     \
      const QuantizeParams&, cudaStream_t);                                                      \
  template Status launch_quantize_sm90<DType::DTYPE, HEADDIM, true, false>(const QuantizeParams&, \
                                                                           cudaStream_t);        \
  template Status launch_quantize_sm90<DType::DTYPE, HEADDIM, false, true>(const QuantizeParams&, \
                                                                           cudaStream_t);

FLASH3_QUANTIZE_INSTANCES(kFloat16, 64)
FLASH3_QUANTIZE_INSTANCES(kFloat16, 128)
FLASH3_QUANTIZE_INSTANCES(kFloat16, 256)
FLASH3_QUANTIZE_INSTANCES(kBFloat16, 64)
FLASH3_QUANTIZE_INSTANCES(kBFloat16, 128)
FLASH3_QUANTIZE_INSTANCES(kBFloat16, 256)

#undef FLASH3_QUANTIZE_INSTANCES

}  // namespace flash3::detail
