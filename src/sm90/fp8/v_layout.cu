// The FP8 forward's V layout (flash3::Fp8V): each (batch, head)'s (seqlen x
// headdim) e4m3 matrix transposed into (headdim x padded_seqlen) bytes, keys
// permuted within groups of 16 (kFp8VKeyOrder), pad slots zero.
// Memory-bound: 1 byte read and 1 written per element.
//
// One CTA of 128 threads per tile of 128 keys of one (batch, head), heads
// fastest so that the CTAs running together read neighbouring memory; a
// grid-stride loop covers any number of tiles.
//   load:      16-byte coalesced loads of the tile's key rows into shared
//              memory (keys past seqlen as zeros), row-major (key, headdim)
//              with each 128-byte line's 16-byte units XOR-swizzled by the
//              key's group of 16 (key / 16 % 8);
//   transpose: a thread takes 4 head-dim columns x one group of 16 keys: 16
//              4-byte shared loads (keys in slot order), a 4x4 byte transpose
//              per 4 slots (prmt), and 4 16-byte global stores (one per
//              column, the group's 16 slots).
// The eight key groups of a tile sit on eight consecutive lanes, so every
// store instruction writes whole 128-byte lines, and the swizzle puts those
// lanes' shared loads on distinct banks at every head dim.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "sm90/head_dims.hpp"
#include "sm90/launch.hpp"

namespace flash3::sm90::fp8 {

constexpr int kVLayoutThreads = 128;
constexpr int kVLayoutKeys = 128;  // keys per tile: 8 groups of kFp8VKeyGroup
constexpr int kKeyGroup = kFp8VKeyGroup;
constexpr int kGroupsPerTile = kVLayoutKeys / kKeyGroup;  // 8: the swizzle's range
constexpr int kChunkBytes = 16;                           // one vector access
constexpr int kWordBytes = 4;
constexpr int kColumnsPerThread = kWordBytes;  // head-dim columns of one transpose item
// Enough tiles for every SM many times over; the rest come from the loop.
constexpr int64_t kMaxVLayoutCtas = int64_t{1} << 16;

static_assert(kGroupsPerTile == 8, "the swizzle XORs a 16-byte unit index of a 128-byte line");
static_assert(kVLayoutThreads % kGroupsPerTile == 0);

// Slot s of a group of 16 holds key key_order(s): bits (b3 b2 b1 b0) of s
// give key (b1 b3 b2 b0). Same table as kFp8VKeyOrder, computed so that
// device code needs no host array.
__host__ __device__ constexpr int key_order(int slot) {
  return (slot & 1) | ((slot >> 2) << 1) | (((slot >> 1) & 1) << 3);
}

constexpr bool key_order_matches_the_api() {
  for (int s = 0; s < kKeyGroup; ++s) {
    if (key_order(s) != kFp8VKeyOrder[s]) {
      return false;
    }
  }
  return true;
}
static_assert(key_order_matches_the_api(), "key_order() must be kFp8VKeyOrder");

struct VLayoutArgs {
  const uint8_t* v;             // e4m3 bits, strided
  uint8_t* v_out;               // the Fp8V layout
  detail::Strides3 v_stride;    // elements (= bytes)
  int seqlen;
  int heads;
  int padded_seqlen;
  int tiles_per_head;           // ceil(seqlen / kVLayoutKeys)
  int64_t num_tiles;            // batch * heads * tiles_per_head
};

// Byte offset in the tile of (key row `key`, byte `byte` of the row): row
// major, the 16-byte unit within each 128-byte line XORed with key / 16 % 8.
template <int kHeadDim>
__device__ __forceinline__ int swizzled(int key, int byte) {
  const int linear = key * kHeadDim + byte;
  return linear ^ (((key / kKeyGroup) % kGroupsPerTile) * kChunkBytes);
}

// Rows (a, b, c, d) of 4 bytes each -> columns: result r holds byte r of each.
__device__ __forceinline__ void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                             uint32_t (&col)[4]) {
  const uint32_t ab_lo = __byte_perm(a, b, 0x5140);  // a0 b0 a1 b1
  const uint32_t ab_hi = __byte_perm(a, b, 0x7362);  // a2 b2 a3 b3
  const uint32_t cd_lo = __byte_perm(c, d, 0x5140);  // c0 d0 c1 d1
  const uint32_t cd_hi = __byte_perm(c, d, 0x7362);  // c2 d2 c3 d3
  col[0] = __byte_perm(ab_lo, cd_lo, 0x5410);        // a0 b0 c0 d0
  col[1] = __byte_perm(ab_lo, cd_lo, 0x7632);        // a1 b1 c1 d1
  col[2] = __byte_perm(ab_hi, cd_hi, 0x5410);        // a2 b2 c2 d2
  col[3] = __byte_perm(ab_hi, cd_hi, 0x7632);        // a3 b3 c3 d3
}

template <int kHeadDim>
__global__ void __launch_bounds__(kVLayoutThreads)
    v_layout_kernel(const __grid_constant__ VLayoutArgs args) {
  constexpr int kChunksPerRow = kHeadDim / kChunkBytes;
  constexpr int kLoadsPerThread = kVLayoutKeys * kChunksPerRow / kVLayoutThreads;
  // (group, 4-column word) pairs of a tile.
  constexpr int kItemsPerThread =
      kGroupsPerTile * (kHeadDim / kColumnsPerThread) / kVLayoutThreads;
  static_assert(kLoadsPerThread * kVLayoutThreads == kVLayoutKeys * kChunksPerRow);
  static_assert(kItemsPerThread * kVLayoutThreads == kGroupsPerTile * kHeadDim / kColumnsPerThread);
  static_assert(kHeadDim * kKeyGroup % 128 == 0, "a key group must fill whole 128-byte lines");
  __shared__ alignas(kChunkBytes) uint8_t tile[kVLayoutKeys * kHeadDim];

  for (int64_t t = blockIdx.x; t < args.num_tiles; t += gridDim.x) {
    const int head = static_cast<int>(t % args.heads);
    const int key_tile = static_cast<int>(t / args.heads % args.tiles_per_head);
    const int64_t batch = t / args.heads / args.tiles_per_head;
    const int first_key = key_tile * kVLayoutKeys;
    const int keys = min(kVLayoutKeys, args.seqlen - first_key);

    // Load: chunk x of the tile is byte 16 * (x % kChunksPerRow) of key x / kChunksPerRow.
    const uint8_t* v = args.v + batch * args.v_stride.batch + head * args.v_stride.head +
                       int64_t{first_key} * args.v_stride.seq;
    uint4 chunk[kLoadsPerThread];
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int x = i * kVLayoutThreads + threadIdx.x;
      const int key = x / kChunksPerRow;
      const int byte = x % kChunksPerRow * kChunkBytes;
      chunk[i] = key < keys ? __ldg(reinterpret_cast<const uint4*>(
                                  v + int64_t{key} * args.v_stride.seq + byte))
                            : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();  // the previous tile's transpose has read the tile
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int x = i * kVLayoutThreads + threadIdx.x;
      const int key = x / kChunksPerRow;
      const int byte = x % kChunksPerRow * kChunkBytes;
      *reinterpret_cast<uint4*>(&tile[swizzled<kHeadDim>(key, byte)]) = chunk[i];
    }
    __syncthreads();

    // Transpose and store: item = (word column, group), groups fastest.
    uint8_t* out = args.v_out +
                   (batch * args.heads + head) * int64_t{kHeadDim} * args.padded_seqlen +
                   first_key;
#pragma unroll
    for (int i = 0; i < kItemsPerThread; ++i) {
      const int item = i * kVLayoutThreads + threadIdx.x;
      const int group = item % kGroupsPerTile;
      const int column = item / kGroupsPerTile * kColumnsPerThread;
      if (group * kKeyGroup >= keys) {
        continue;  // past padded_seqlen: nothing to write (within it, zeros were loaded)
      }
      uint32_t word[kKeyGroup];
#pragma unroll
      for (int s = 0; s < kKeyGroup; ++s) {
        const int key = group * kKeyGroup + key_order(s);
        word[s] = *reinterpret_cast<const uint32_t*>(&tile[swizzled<kHeadDim>(key, column)]);
      }
      uint32_t col[kColumnsPerThread][kKeyGroup / kWordBytes];  // [column][slot word]
#pragma unroll
      for (int w = 0; w < kKeyGroup / kWordBytes; ++w) {
        uint32_t c[kColumnsPerThread];
        transpose4x4(word[4 * w], word[4 * w + 1], word[4 * w + 2], word[4 * w + 3], c);
#pragma unroll
        for (int r = 0; r < kColumnsPerThread; ++r) {
          col[r][w] = c[r];
        }
      }
#pragma unroll
      for (int r = 0; r < kColumnsPerThread; ++r) {
        *reinterpret_cast<uint4*>(out + int64_t{column + r} * args.padded_seqlen +
                                  group * kKeyGroup) =
            make_uint4(col[r][0], col[r][1], col[r][2], col[r][3]);
      }
    }
  }
}

}  // namespace flash3::sm90::fp8

namespace flash3::detail {

Status launch_fp8_v_layout_sm90(const Fp8VLayoutParams& p, cudaStream_t stream) {
  using namespace sm90::fp8;
  VLayoutArgs args{};
  args.v = static_cast<const uint8_t*>(p.v);
  args.v_out = static_cast<uint8_t*>(p.v_out);
  args.v_stride = p.v_stride;
  args.seqlen = p.seqlen;
  args.heads = p.heads;
  args.padded_seqlen = fp8_v_padded_seqlen(p.seqlen);
  args.tiles_per_head = static_cast<int>((int64_t{p.seqlen} + kVLayoutKeys - 1) / kVLayoutKeys);
  args.num_tiles = int64_t{p.batch} * p.heads * args.tiles_per_head;
  const unsigned ctas =
      static_cast<unsigned>(args.num_tiles < kMaxVLayoutCtas ? args.num_tiles : kMaxVLayoutCtas);
  const bool launched = visit_head_dim(
      HeadDims{}, p.headdim,
      [&](auto headdim) {
        v_layout_kernel<decltype(headdim)::value><<<ctas, kVLayoutThreads, 0, stream>>>(args);
        return true;
      },
      [] { return false; });
  if (!launched) {
    return {StatusCode::kInternal,
            std::string(kFp8VLayoutCall) + ": no kernel for headdim " + std::to_string(p.headdim)};
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string(kFp8VLayoutCall) + ": launch failed: " +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
  }
  return {};
}

}  // namespace flash3::detail
