// kvcache_append (FlashAttention-3's flash_attn_with_kvcache with k and v):
// each batch's new keys and values written into its KV cache after its
// cache_seqlens[b] keys, the keys rotated (rotary embedding) on the way, q
// rotated into q_rotated, and each batch's new length. A memory-bound pass
// over the new tokens only, before the attention kernel, which reads the
// rotated q and the new lengths.
//
// One CTA per (batch, token row); its threads walk the row's heads x
// headdim elements, one element each (a rotated element reads its pair's
// partner too; both come from L1). Row s of k_new sits at position
// cache_seqlens[b] + s; query row s at cache_seqlens[b] + s when causal, else
// at cache_seqlens[b] (FlashAttention's convention: the new queries of a
// non-causal call all sit right after the cache); rotary_seqlens[b] replaces
// cache_seqlens[b] in these positions when given. Device arrays are clamped
// as the attention kernels clamp them: a slot past the capacity is not
// written, a bad batch index or page stays inside the cache.
#include <cuda_runtime_api.h>

#include <climits>
#include <string>

#include "sm90/common/element.cuh"
#include "sm90/fwd/kv_cache.hpp"
#include "sm90/launch.hpp"

namespace flash3::sm90::fwd {
namespace {

using flash3::detail::KvAppendParams;
using flash3::detail::kKvAppendCall;

constexpr int kAppendThreads = 128;

template <class Element>
struct Rotary {
  const Element* cos;  // (rows, dim / 2), or null: no rotation
  const Element* sin;
  int dim, rows;
  bool interleaved;

  // Element j of the row x (its headdim elements) placed at `position`:
  // rotated for j < dim, copied after. Pairs (i, i + dim / 2), or (2i,
  // 2i + 1) interleaved; (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos).
  __device__ float at(const Element* x, int j, int position) const {
    const float xj = static_cast<float>(x[j]);
    if (cos == nullptr || j >= dim) {
      return xj;
    }
    const int half = dim / 2;
    const bool first = interleaved ? j % 2 == 0 : j < half;
    const int i = interleaved ? j / 2 : (first ? j : j - half);
    const int partner = interleaved ? (first ? j + 1 : j - 1) : (first ? j + half : j - half);
    const int64_t row = min(max(position, 0), rows - 1);
    const float c = static_cast<float>(cos[row * half + i]);
    const float s = static_cast<float>(sin[row * half + i]);
    const float xp = static_cast<float>(x[partner]);
    return first ? xj * c - xp * s : xp * s + xj * c;
  }
};

// pages: the paged cache's page_row (kv_cache.hpp), when p.page_table.
template <class Element>
__global__ void __launch_bounds__(kAppendThreads)
    kv_append_kernel(const KvAppendParams p, const KvCacheSequences pages, int rows_per_batch) {
  const int b = blockIdx.x / rows_per_batch, s = blockIdx.x % rows_per_batch;
  const int cached = min(max(p.cache_seqlens[b], 0), p.capacity);
  if (s == 0 && threadIdx.x == 0) {
    p.seqlens_out[b] = min(cached + p.seqlen_new, p.capacity);  // both <= 2^30: no overflow
  }
  const Rotary<Element> rotary{static_cast<const Element*>(p.rotary_cos),
                               static_cast<const Element*>(p.rotary_sin), p.rotary_dim,
                               p.rotary_rows, p.rotary_interleaved};
  const int d = p.headdim;

  // Rotary positions start after the cache, or at rotary_seqlens[b].
  const int start = p.rotary_seqlens != nullptr ? p.rotary_seqlens[b] : cached;

  // The new key and value of row s, into slot cached + s of the cache.
  const int slot = cached + s;
  if (s < p.seqlen_new && slot < p.capacity) {
    int cache_batch, cache_row;
    if (p.page_table != nullptr) {
      const PageRow at = pages.page_row(pages.keys(b).batch, slot);
      cache_batch = at.page;
      cache_row = at.row;
    } else {
      const int kv = p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b;
      cache_batch = min(max(kv, 0), p.kv_batch - 1);
      cache_row = slot;
    }
    const Element* k_new = static_cast<const Element*>(p.k_new);
    const Element* v_new = static_cast<const Element*>(p.v_new);
    Element* k_cache = static_cast<Element*>(p.k_cache);
    Element* v_cache = static_cast<Element*>(p.v_cache);
    for (int e = threadIdx.x; e < p.heads_k * d; e += kAppendThreads) {
      const int h = e / d, j = e % d;
      const Element* k_row = k_new + p.k_new_stride.offset(b, s, h);
      k_cache[p.k_cache_stride.offset(cache_batch, cache_row, h) + j] =
          Element(rotary.at(k_row, j, start + s));
    }
    const int dv = p.headdim_v;
    for (int e = threadIdx.x; e < p.heads_k * dv; e += kAppendThreads) {
      const int h = e / dv, j = e % dv;
      v_cache[p.v_cache_stride.offset(cache_batch, cache_row, h) + j] =
          v_new[p.v_new_stride.offset(b, s, h) + j];
    }
  }

  // Query row s, rotated to its position.
  if (p.q_rotated != nullptr && s < p.seqlen_q) {
    const int position = p.causal ? start + s : start;
    const Element* q = static_cast<const Element*>(p.q);
    Element* q_rotated = static_cast<Element*>(p.q_rotated);
    for (int e = threadIdx.x; e < p.heads_q * d; e += kAppendThreads) {
      const int h = e / d, j = e % d;
      q_rotated[p.q_rotated_stride.offset(b, s, h) + j] =
          Element(rotary.at(q + p.q_stride.offset(b, s, h), j, position));
    }
  }
}

template <DType kDType>
Status launch(const KvAppendParams& p, cudaStream_t stream) {
  const int rows = max(p.seqlen_new, p.q_rotated != nullptr ? p.seqlen_q : 1);
  const int64_t ctas = static_cast<int64_t>(p.batch) * rows;
  if (ctas > INT_MAX) {
    return {StatusCode::kInvalidArgument,
            std::string(kKvAppendCall) + ": batch x rows = " + std::to_string(ctas) +
                " exceeds 2^31-1"};
  }
  KvCacheSequences pages{};
  if (p.page_table != nullptr) {
    pages.kv_batch = p.kv_batch;
    pages.capacity = p.capacity;
    pages.seqlens = p.cache_seqlens;
    pages.batch_idx = p.cache_batch_idx;
    pages.page_table = p.page_table;
    pages.page_table_rows = p.page_table_rows;
    pages.pages_per_batch = p.pages_per_batch;
    pages.page_size = p.kv_rows;
    pages.by_page_size = flash3::detail::FastDivisor::of(p.kv_rows);
  }
  kv_append_kernel<typename ElementOf<kDType>::type>
      <<<static_cast<unsigned>(ctas), kAppendThreads, 0, stream>>>(p, pages, rows);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string(kKvAppendCall) + ": launch failed: " +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
  }
  return {};
}

}  // namespace
}  // namespace flash3::sm90::fwd

namespace flash3::detail {

Status launch_kv_append_sm90(const KvAppendParams& params, cudaStream_t stream) {
  return params.dtype == DType::kFloat16
             ? sm90::fwd::launch<DType::kFloat16>(params, stream)
             : sm90::fwd::launch<DType::kBFloat16>(params, stream);
}

}  // namespace flash3::detail
