// FP8 quantization (issue 4): fp16/bf16 rows to e4m3 codes with one scale
// per block of rows of one (batch, head), optionally after the randomized
// Hadamard transform. Memory-bound: 2 bytes read and 1 written per element.
//
// Blocks of up to kSliceRows rows (the default 128), one work item per
// (batch, row block, head), heads fastest so that the CTAs running together
// read neighbouring memory; a thread holds one row (row.cuh says how a row
// lies on 4 lanes):
//   load:        the item's rows, copied into shared memory (cp.async) while
//                the CTA works on the item before
//   transform:   the Hadamard transform (unnormalised), |max|
//   scale:       warp max, then across warps through shared memory;
//                scale = amax norm / 448 (norm = 1 / sqrt(d) after the
//                transform, else 1), factor = norm / scale
//   encode:      e4m3(x factor) of the rows in registers
// The CTAs are persistent (kMinBlocksPerSm an SM, items blockIdx.x, +
// gridDim.x, ...), so that an SM's loads stay in flight through its
// arithmetic and its CTA's barriers (each CTA's load, then compute, left
// the memory idle in between: on the H100 head dims 64 / 128 / 256 went
// from 0.70 / 0.88 / 0.73 of the copy's bandwidth to 0.81 / 0.90 / 0.87).
// (ref::quantize_e4m3 computes the same floats in the same order.)
// Longer blocks (one scale per head: block_rows = seqlen) are cut into
// slices of kSliceRows rows, one CTA each, in three launches after zeroing
// the descales: every slice's amax into its block's descale word
// (atomicMax on the bits: amax >= 0), every slice encoded with its block's
// scale, then each word turned from amax into scale. (One CTA per such
// block gave 16 CTAs to a d128 16k tensor: 1.63 ms against 0.16 ms with
// 128-row blocks.) Both paths give the same bits: max is exact.
// Rows past seqlen are neither read nor written nor counted in amax.
// kVLayout (quantize_fp8_v): the encode step puts the codes into a shared
// tile, key-major per column and with the slots of every 16 keys permuted as
// the FP8 forward reads V (flash3::Fp8V), and the CTA writes the tile's
// columns out as rows of the Fp8V tensor, zeros in the slots past seqlen of
// the last 16 (a CTA's rows start at a multiple of 16: validate_quantize).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "sm90/common/launch.hpp"
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
  int num_blocks;  // batch * heads * blocks_per_head: kWhole's items
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
// What the encode step multiplies by: norm / scale.
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

// The rows one CTA covers (one a thread, in registers from load to encode): a
// whole block, or one slice of a longer one.
template <class T>
inline constexpr int kSliceRows = T::kRows;

// How many slices a block of block_rows rows is cut into (1: one kWhole CTA).
template <class T>
__host__ __device__ constexpr int slices_per_block(int block_rows) {
  return block_rows <= kSliceRows<T> ? 1 : (block_rows + kSliceRows<T> - 1) / kSliceRows<T>;
}

// kVLayout's shared tile: a row of kSliceRows codes (+ 8 bytes, so that the
// 4 lanes of a row, 8 columns apart, hit at most 2 banks) per column.
template <class T>
inline constexpr int kVTilePitch = kSliceRows<T> + 8;

// The rows one CTA of kAmax / kEncode covers, or one work item of kWhole
// (quantize.cu's top).
struct QuantizeItem {
  int batch, head, block, slice;
  int first_row;  // of the sequence
  int rows;       // 0: a slice past the end of a short last block
};
template <class T>
__device__ QuantizeItem quantize_item(const QuantizeArgs& args, int index, int slices) {
  QuantizeItem it;
  it.head = index % args.heads;
  it.slice = index / args.heads % slices;
  it.block = index / args.heads / slices % args.blocks_per_head;
  it.batch = index / args.heads / slices / args.blocks_per_head;
  const int block_first_row = it.block * args.block_rows;
  const int block_rows = min(args.block_rows, args.seqlen - block_first_row);
  it.first_row = block_first_row + it.slice * kSliceRows<T>;
  it.rows = max(0, min(kSliceRows<T>, block_rows - it.slice * kSliceRows<T>));
  return it;
}

// kWhole's staging: each thread's chunks of the next item's row, copied
// with cp.async into a slot of its own while it works on this item's (so a
// thread reads back only what it copied: no barrier, only its own
// cp.async.wait_group), [stage][chunk][thread] so that a warp's 16-byte
// accesses are consecutive.
inline constexpr int kQuantizeStages = 2;
template <int kHeadDim>
inline constexpr int kQuantizeStagingBytes =
    kQuantizeStages * QuantizeTraits<kHeadDim>::kChunks * QuantizeTraits<kHeadDim>::kThreads *
    static_cast<int>(sizeof(uint4));

template <DType kDType, int kHeadDim, bool kHadamard, bool kVLayout, QuantizePass kPass>
__global__ void __launch_bounds__(QuantizeTraits<kHeadDim>::kThreads,
                                  QuantizeTraits<kHeadDim>::kMinBlocksPerSm)
    quantize_kernel(const __grid_constant__ QuantizeArgs args) {
  using T = QuantizeTraits<kHeadDim>;
  using Fragment = RowFragment<kHeadDim>;
  static_assert(!kVLayout || kPass != QuantizePass::kAmax, "kAmax stores no codes");
  static_assert(kSliceRows<T> % kFp8VKeyGroup == 0, "a CTA's rows are whole key groups");
  // Two sets, one per item in turn (kWhole): a thread may write the next
  // item's maxima while another still reads this item's.
  __shared__ float warp_amax[kQuantizeStages][T::kWarps];
  __shared__ alignas(sizeof(uint4)) uint32_t sign_masks[kHeadDim / 2];
  __shared__ alignas(sizeof(uint2)) uint8_t v_tile[kVLayout ? kHeadDim * kVTilePitch<T> : 1];
  extern __shared__ uint4 staging[];  // kWhole: kQuantizeStagingBytes
  const auto staging_of = [&](int stage) { return staging + stage * T::kChunks * T::kThreads; };

  const int slices = slices_per_block<T>(args.block_rows);
  const int row = threadIdx.x / T::kLanesPerRow;  // the thread's row of an item
  const int lane_in_row = threadIdx.x % T::kLanesPerRow;
  if constexpr (kHadamard) {
    fill_sign_masks<kHeadDim>(args.sign_bits, sign_masks);
    __syncthreads();
  }
  const auto row_in = [&](const QuantizeItem& it) {
    return args.x + it.batch * args.x_stride.batch + it.head * args.x_stride.head +
           (it.first_row + row) * args.x_stride.seq;
  };
  const auto descale_of = [&](const QuantizeItem& it) {
    return args.descale + (int64_t{it.batch} * args.heads + it.head) * args.blocks_per_head +
           it.block;
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
  // The item's codes: to the thread's row of x_fp8, or (kVLayout) into the
  // shared tile, whose columns then go out as rows of the Fp8V tensor, up
  // to the item's last whole group of 16 slots (zeros past seqlen), in
  // 8-byte pieces.
  const auto store = [&](const QuantizeItem& it, const Fragment& f, float factor) {
    if constexpr (kVLayout) {  // every row of the tile, zeros past the block
      const int slot = row / kFp8VKeyGroup * kFp8VKeyGroup + fp8v_slot(row % kFp8VKeyGroup);
      store_codes_transposed(f, factor, v_tile, kVTilePitch<T>, slot, row < it.rows,
                             lane_in_row);
      __syncthreads();
      const int pieces = (it.rows + kFp8VKeyGroup - 1) / kFp8VKeyGroup * kFp8VKeyGroup / 8;
      uint8_t* out = args.v_out +
                     (int64_t{it.batch} * args.heads + it.head) * kHeadDim * args.v_padded +
                     it.first_row;
      for (int i = threadIdx.x; i < kHeadDim * pieces; i += T::kThreads) {
        const int column = i / pieces, piece = i % pieces;
        *reinterpret_cast<uint2*>(out + column * args.v_padded + piece * 8) =
            *reinterpret_cast<const uint2*>(v_tile + column * kVTilePitch<T> + piece * 8);
      }
    } else {
      uint8_t* out = args.x_fp8 + it.batch * args.x_fp8_stride.batch +
                     it.head * args.x_fp8_stride.head +
                     (it.first_row + row) * args.x_fp8_stride.seq;
      store_codes(f, factor, out, row < it.rows, lane_in_row);
    }
  };

  if constexpr (kPass == QuantizePass::kWhole) {
    // Persistent: items blockIdx.x, + gridDim.x, ...; the next one's row
    // copied in while this one is transformed, reduced and encoded.
    const int items = args.num_blocks;
    const auto stage_item = [&](int index, int stage) {
      if (index < items) {
        const QuantizeItem it = quantize_item<T>(args, index, 1);
        const bool valid = row < it.rows;  // else no byte is read: x itself stands in
        stage_row<kHeadDim>(staging_of(stage), valid ? row_in(it) : args.x, valid, lane_in_row);
      }
      cp_async_commit();  // an empty group past the last item, so that the wait counts hold
    };
    int stage = 0;
    stage_item(static_cast<int>(blockIdx.x), stage);
    for (int index = static_cast<int>(blockIdx.x); index < items;
         index += static_cast<int>(gridDim.x), stage ^= 1) {
      stage_item(index + static_cast<int>(gridDim.x), stage ^ 1);
      cp_async_wait<1>();  // this item's row
      const QuantizeItem it = quantize_item<T>(args, index, 1);
      const Fragment f = transform(staged_row<kHeadDim>(staging_of(stage)));
      const float amax = cta_amax<T>(fragment_amax(f, 0.0f), warp_amax[stage]);
      const float scale = scale_of_amax(amax, args.norm);
      if (threadIdx.x == 0) {
        *descale_of(it) = scale;
      }
      store(it, f, factor_of_scale(scale, args.norm));
    }
  } else {
    const QuantizeItem it = quantize_item<T>(args, static_cast<int>(blockIdx.x), slices);
    if (it.rows == 0) {  // the whole CTA, after no barrier but the sign masks'
      return;
    }
    const Fragment f = transform(load_row<kHeadDim>(row_in(it), row < it.rows, lane_in_row));
    float* const descale = descale_of(it);
    if constexpr (kPass == QuantizePass::kEncode) {
      // The block's amax, from kAmax.
      store(it, f, factor_of_scale(scale_of_amax(*descale, args.norm), args.norm));
    } else {
      const float amax = cta_amax<T>(fragment_amax(f, 0.0f), warp_amax[0]);
      if (threadIdx.x == 0) {  // amax >= 0, so its bits order as unsigned integers
        atomicMax(reinterpret_cast<unsigned*>(descale), __float_as_uint(amax));
      }
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
  args.num_blocks = p.num_blocks;
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
    // Persistent: kMinBlocksPerSm CTAs an SM (the staging fits them), or one a block.
    constexpr auto kernel = quantize_kernel<kDType, kHeadDim, kHadamard, kVLayout,
                                            QuantizePass::kWhole>;
    constexpr int kSmem = kQuantizeStagingBytes<kHeadDim>;
    const KernelSetup setup = setup_kernel<kernel, 1>(T::kThreads, kSmem, p.device);
    if (setup.err != cudaSuccess) {
      return failed("setting up the kernel", setup.err);
    }
    const int64_t resident = int64_t{p.num_sms} * T::kMinBlocksPerSm;
    kernel<<<static_cast<unsigned>(std::min<int64_t>(p.num_blocks, resident)), T::kThreads, kSmem,
             stream>>>(args);
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
