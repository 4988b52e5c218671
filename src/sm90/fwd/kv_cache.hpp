// A KV cache's keys per batch (Sequences::kKvCache), host and device so that
// the CPU tests check them: batch b's queries attend to the first
// cache_seqlens[b] of its `capacity` key slots, FlashAttention's
// flash_attn_with_kvcache layout:
//  - contiguous: slot s is row s of K/V batch cache_batch_idx[b] (b without
//    it);
//  - paged (page_table non-null): K and V are a pool of pages (kv_batch
//    pages of page_size rows), and slot s is row s % page_size of page
//    page_table[r * pages_per_batch + s / page_size] of the table's row r =
//    cache_batch_idx[b] (b without it); capacity is pages_per_batch x
//    page_size.
// The arrays live on the device, so the host cannot check them: each value is
// clamped into the cache (a bad length, index or page gives wrong keys, never
// an access outside K and V).
#pragma once

#include "../problem.hpp"  // FLASH3_HOST_DEVICE, FastDivisor

namespace flash3::sm90::fwd {

struct CacheKeys {
  int batch;   // K/V batch (contiguous caches), or page table row (paged)
  int length;  // keys used, in [0, capacity - begin]
  int begin;   // the first key's slot (left padding; 0 without it)
};

// Where a paged cache's key slot lives: row `row` of page `page`.
struct PageRow {
  int page;
  int row;
};

// Rows of K and V per TMA box in a paged cache: a page size must be a
// multiple of it (a box never crosses a page), and so is every key block.
inline constexpr int kPageBoxRows = 16;

// The box a paged cache's key blocks of block_n rows load in: the most rows
// (a power of two from kPageBoxRows) that divide both the page size and
// block_n, so a block takes as few TMA loads as its pages allow (16-row
// boxes made a 256-key-page decode read K and V at half the contiguous
// cache's rate on the H200).
FLASH3_HOST_DEVICE constexpr int paged_box_rows(int page_size, int block_n) {
  int rows = kPageBoxRows;
  while (rows * 2 <= block_n && block_n % (rows * 2) == 0 && page_size % (rows * 2) == 0) {
    rows *= 2;
  }
  return rows;
}

struct KvCacheSequences {
  const int* seqlens = nullptr;    // batch entries, device
  const int* batch_idx = nullptr;  // batch entries, device, or null
  int kv_batch = 0;                // K/V batches, or pages of a paged cache
  int capacity = 0;                // key slots per batch
  const int* page_table = nullptr;  // (page_table_rows, pages_per_batch), device, or null
  int page_table_rows = 0;
  int pages_per_batch = 0;
  int page_size = 0;
  flash3::detail::FastDivisor by_page_size;
  int box_rows = kPageBoxRows;  // paged_box_rows(page_size, the kernel's block_n)
  const int* leftpad = nullptr;  // batch entries, device, or null (contiguous caches only)

  // Batch b's keys: slots [begin, begin + length), cache_seqlens and the left
  // padding clamped into the capacity.
  FLASH3_HOST_DEVICE CacheKeys keys(int b) const {
    int end = seqlens[b];
    end = end < 0 ? 0 : (end > capacity ? capacity : end);
    int begin = leftpad != nullptr ? leftpad[b] : 0;
    begin = begin < 0 ? 0 : (begin > end ? end : begin);
    int kv = batch_idx != nullptr ? batch_idx[b] : b;
    const int rows = page_table != nullptr ? page_table_rows : kv_batch;
    kv = kv < 0 ? 0 : (kv >= rows ? rows - 1 : kv);
    return {kv, end - begin, begin};
  }

  // Slot `slot` (>= 0; past the capacity in a key block's tail, whose rows
  // the mask hides) of page table row `row` (keys().batch) of a paged cache.
  // A slot past the last page stays in that page's row range only if it
  // fits: else its row is past page_size, which the tensor map reads as
  // zeros.
  FLASH3_HOST_DEVICE PageRow page_row(int row, int slot) const {
    int index = by_page_size.divide(slot);
    index = index < pages_per_batch ? index : pages_per_batch - 1;
    int page = page_table[static_cast<long long>(row) * pages_per_batch + index];
    page = page < 0 ? 0 : (page >= kv_batch ? kv_batch - 1 : page);
    return {page, slot - index * page_size};
  }
};

}  // namespace flash3::sm90::fwd
