// forward_kvcache against the float64 reference under the tolerance rule:
// each batch's used cache rows gathered into a packed varlen batch for
// ref::attention_forward_varlen (reference/serving_ref.hpp). Lengths from 0
// to the capacity, a shuffled cache_batch_idx into a larger cache, decoding
// (one query, GQA: packed and split over the SMs) and several queries,
// causal and not, every head dim, contiguous and paged caches (shuffled
// page tables into a pool with unused pages), left padding; out and lse
// poisoned first.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "hopper_test.hpp"
#include "reference/serving_ref.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

struct KvCacheCase {
  DType dtype = DType::kBFloat16;
  int headdim = 128;
  bool causal = false;
  int seqlen_q = 1;
  int capacity = 1;
  std::vector<int> seqlens;    // per query batch, <= capacity
  std::vector<int> batch_idx;  // empty: none; else per query batch, into kv_batch
  int kv_batch = 0;            // cache batches (with batch_idx)
  int heads_q = 8, heads_k = 2;
  int page_size = 0;  // 0: contiguous; else paged, capacity a multiple of it
  std::vector<int> leftpad;  // empty: none; else per query batch, <= seqlens[b]
};

KvCacheCase make_case(DType dtype, int headdim, bool causal, int seqlen_q, int capacity,
                      std::vector<int> seqlens) {
  KvCacheCase c;
  c.dtype = dtype;
  c.headdim = headdim;
  c.causal = causal;
  c.seqlen_q = seqlen_q;
  c.capacity = capacity;
  c.seqlens = std::move(seqlens);
  return c;
}

void expect_kvcache_matches_reference(const KvCacheCase& c) {
  const ref::HalfType type = half_type(c.dtype);
  const int batch = static_cast<int>(c.seqlens.size());
  const int kv_batch = c.batch_idx.empty() ? batch : c.kv_batch;
  const int d = c.headdim;
  std::mt19937_64 rng(99 + d + 3 * c.seqlen_q + 5 * c.causal);
  const auto draw = [&](size_t n) { return random_halves(type, n, rng); };
  const size_t q_row = static_cast<size_t>(c.heads_q) * d, kv_row = static_cast<size_t>(c.heads_k) * d;
  const size_t q_elems = static_cast<size_t>(batch) * c.seqlen_q * q_row;
  const size_t cache_elems = static_cast<size_t>(kv_batch) * c.capacity * kv_row;
  const std::vector<float> q = draw(q_elems), k_cache = draw(cache_elems), v_cache = draw(cache_elems);

  // The same problem as a packed varlen batch: q as it is, each batch's used
  // cache rows gathered.
  ref::VarlenShape shape;
  shape.heads_q = c.heads_q;
  shape.heads_k = c.heads_k;
  shape.headdim = d;
  std::vector<float> k_used, v_used;
  for (int b = 0; b < batch; ++b) {
    const int kv = c.batch_idx.empty() ? b : c.batch_idx[b];
    const int pad = c.leftpad.empty() ? 0 : c.leftpad[b];  // the keys from slot `pad`
    const size_t first = (static_cast<size_t>(kv) * c.capacity + pad) * kv_row;
    const size_t count = static_cast<size_t>(c.seqlens[b] - pad) * kv_row;
    k_used.insert(k_used.end(), k_cache.begin() + first, k_cache.begin() + first + count);
    v_used.insert(v_used.end(), v_cache.begin() + first, v_cache.begin() + first + count);
    shape.cu_seqlens_q.push_back(shape.cu_seqlens_q.back() + c.seqlen_q);
    shape.cu_seqlens_k.push_back(shape.cu_seqlens_k.back() + c.seqlens[b] - pad);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const ref::Reference expected =
      ref::attention_forward_varlen(shape, q, k_used, v_used, scale, c.causal);
  // Same-dtype arithmetic, for the tolerance rule.
  const std::vector<float> plain = ref::attention_forward_varlen_plain(
      type, shape, q, k_used, v_used, static_cast<float>(scale), c.causal);
  const size_t lse_elems = static_cast<size_t>(batch) * c.heads_q * c.seqlen_q;
  // Paged: batch b's page i of the logical cache above goes to pool page
  // page_table[b][i], a shuffle of more pages than the batches use (the rest
  // hold other random values).
  const bool paged = c.page_size > 0;
  const int pages_per_batch = paged ? c.capacity / c.page_size : 0;
  const int num_pages = paged ? kv_batch * pages_per_batch + 3 : 0;  // a table row per cache batch
  const size_t page_elems = static_cast<size_t>(c.page_size) * kv_row;
  const size_t pool_elems = paged ? num_pages * page_elems : cache_elems;
  DeviceBuffer d_q(q_elems * 2), d_k(pool_elems * 2), d_v(pool_elems * 2), d_out(q_elems * 2),
      d_lse(lse_elems * 4), d_seqlens(sizeof(int) * batch), d_idx(sizeof(int) * batch),
      d_leftpad(sizeof(int) * batch);
  upload_halves(d_q.get(), type, q, "q");
  std::vector<int> page_table(static_cast<size_t>(kv_batch) * pages_per_batch);
  if (paged) {
    std::vector<int> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<float> k_pool = draw(num_pages * page_elems), v_pool = draw(num_pages * page_elems);
    for (int b = 0; b < kv_batch; ++b) {
      for (int i = 0; i < pages_per_batch; ++i) {
        const int page = perm[static_cast<size_t>(b) * pages_per_batch + i];
        page_table[static_cast<size_t>(b) * pages_per_batch + i] = page;
        const size_t from = (static_cast<size_t>(b) * c.capacity + static_cast<size_t>(i) * c.page_size) * kv_row;
        std::copy(k_cache.begin() + from, k_cache.begin() + from + page_elems,
                  k_pool.begin() + page * page_elems);
        std::copy(v_cache.begin() + from, v_cache.begin() + from + page_elems,
                  v_pool.begin() + page * page_elems);
      }
    }
    upload_halves(d_k.get(), type, k_pool, "k pool");
    upload_halves(d_v.get(), type, v_pool, "v pool");
  } else {
    upload_halves(d_k.get(), type, k_cache, "k_cache");
    upload_halves(d_v.get(), type, v_cache, "v_cache");
  }
  DeviceBuffer d_pages(sizeof(int) * std::max<size_t>(page_table.size(), 1));
  if (paged) {
    check_cuda(cudaMemcpy(d_pages.get(), page_table.data(), sizeof(int) * page_table.size(),
                          cudaMemcpyHostToDevice), "page_table");
  }
  check_cuda(cudaMemset(d_out.get(), 0xFF, q_elems * 2), "poison out");
  check_cuda(cudaMemset(d_lse.get(), 0xFF, lse_elems * 4), "poison lse");
  check_cuda(cudaMemcpy(d_seqlens.get(), c.seqlens.data(), sizeof(int) * batch,
                        cudaMemcpyHostToDevice), "cache_seqlens");
  if (!c.batch_idx.empty()) {
    check_cuda(cudaMemcpy(d_idx.get(), c.batch_idx.data(), sizeof(int) * batch,
                          cudaMemcpyHostToDevice), "cache_batch_idx");
  }
  if (!c.leftpad.empty()) {
    check_cuda(cudaMemcpy(d_leftpad.get(), c.leftpad.data(), sizeof(int) * batch,
                          cudaMemcpyHostToDevice), "cache_leftpad");
  }
  const Tensor tq = Tensor::contiguous(d_q.get(), c.dtype, batch, c.seqlen_q, c.heads_q, d);
  const int pool_batch = paged ? num_pages : kv_batch, pool_rows = paged ? c.page_size : c.capacity;
  const Tensor tk = Tensor::contiguous(d_k.get(), c.dtype, pool_batch, pool_rows, c.heads_k, d);
  const Tensor tv = Tensor::contiguous(d_v.get(), c.dtype, pool_batch, pool_rows, c.heads_k, d);
  const Tensor to = Tensor::contiguous(d_out.get(), c.dtype, batch, c.seqlen_q, c.heads_q, d);
  const KvCache cache{static_cast<const int*>(d_seqlens.get()),
                      c.batch_idx.empty() ? nullptr : static_cast<const int*>(d_idx.get()),
                      paged ? static_cast<const int*>(d_pages.get()) : nullptr, pages_per_batch,
                      paged && !c.batch_idx.empty() ? kv_batch : 0,
                      c.leftpad.empty() ? nullptr : static_cast<const int*>(d_leftpad.get())};
  ForwardOptions options;
  options.causal = c.causal;
  const Status s = flash3::forward_kvcache(tq, tk, tv, to, static_cast<float*>(d_lse.get()), cache,
                                           options, nullptr);
  if (s.code == StatusCode::kUnsupported) {
    GTEST_SKIP() << s.message;
  }
  ASSERT_TRUE(s.ok()) << s.message;
  check_cuda(cudaDeviceSynchronize(), "forward_kvcache");
  const std::vector<float> got = download_halves(d_out.get(), type, q_elems, "out");
  const ref::Verdict out_verdict = ref::check_output(got, plain, expected.out);
  EXPECT_TRUE(out_verdict.ok) << out_verdict.message;
  // flash3's (batch, heads_q, seqlen_q) against the reference's (heads_q, total_q).
  std::vector<float> lse(lse_elems);
  check_cuda(cudaMemcpy(lse.data(), d_lse.get(), lse_elems * 4, cudaMemcpyDeviceToHost), "lse");
  std::vector<double> lse_ref(lse_elems);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < c.heads_q; ++h) {
      for (int r = 0; r < c.seqlen_q; ++r) {
        lse_ref[(static_cast<size_t>(b) * c.heads_q + h) * c.seqlen_q + r] =
            expected.lse[static_cast<size_t>(h) * batch * c.seqlen_q + b * c.seqlen_q + r];
      }
    }
  }
  const ref::Verdict lse_verdict = ref::check_lse(lse, lse_ref);
  EXPECT_TRUE(lse_verdict.ok) << lse_verdict.message;
}

class ForwardKvCache : public HopperTest {};

// Decoding: one query per batch, lengths from empty to the whole cache
// (long enough to split over the SMs at every head dim).
TEST_F(ForwardKvCache, DecodingMatchesTheReference) {
  const std::vector<int> seqlens = {3000, 0, 1, 2999, 177, 3000, 1280, 64};
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("headdim " + std::to_string(headdim) + (causal ? " causal" : ""));
      expect_kvcache_matches_reference(
          make_case(DType::kBFloat16, headdim, causal, 1, 3000, seqlens));
    }
  }
  // MHA and MQA, fp16.
  KvCacheCase mha = make_case(DType::kFloat16, 128, false, 1, 5000, {5000, 4097, 2});
  mha.heads_q = mha.heads_k = 4;
  expect_kvcache_matches_reference(mha);
  KvCacheCase mqa = make_case(DType::kFloat16, 64, true, 1, 4000, {1, 3999, 2048});
  mqa.heads_q = 8;
  mqa.heads_k = 1;
  expect_kvcache_matches_reference(mqa);
}

// Several queries per batch (speculative decoding, chunked prefill): causal
// rows see the cache up to their own position; rows before the cache's
// length see nothing when the cache is shorter than the queries.
TEST_F(ForwardKvCache, SeveralQueriesMatchTheReference) {
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("headdim " + std::to_string(headdim) + (causal ? " causal" : ""));
      expect_kvcache_matches_reference(
          make_case(DType::kBFloat16, headdim, causal, 7, 1000, {1000, 3, 0, 513, 999}));
      expect_kvcache_matches_reference(
          make_case(DType::kBFloat16, headdim, causal, 300, 700, {700, 100, 299}));
    }
  }
}

// cache_batch_idx: each query batch reads a cache batch of its own, in a
// cache of more batches than queries.
TEST_F(ForwardKvCache, CacheBatchIndexPicksTheCache) {
  for (const bool causal : {false, true}) {
    KvCacheCase c =
        make_case(DType::kBFloat16, 128, causal, 1, 3000, {3000, 17, 2000, 0, 2500});
    c.batch_idx = {6, 0, 3, 2, 4};
    c.kv_batch = 7;
    expect_kvcache_matches_reference(c);
    c.seqlen_q = 5;
    expect_kvcache_matches_reference(c);
  }
}

// cache_leftpad: batch b attends to slots [leftpad[b], seqlens[b]), causal
// bottom-right over them; with a batch index, decoding and several queries.
TEST_F(ForwardKvCache, LeftPaddingSkipsTheFirstSlots) {
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("headdim " + std::to_string(headdim) + (causal ? " causal" : ""));
      KvCacheCase c =
          make_case(DType::kBFloat16, headdim, causal, 1, 3000, {3000, 17, 2000, 0, 2500});
      c.leftpad = {1000, 17, 1, 0, 2433};
      expect_kvcache_matches_reference(c);
      c.seqlen_q = 7;
      c.batch_idx = {6, 0, 3, 2, 4};
      c.kv_batch = 7;
      expect_kvcache_matches_reference(c);
    }
  }
}

// A paged cache: page sizes from the box size (16) to past a key block,
// decoding (split over the SMs) and several queries, every head dim.
TEST_F(ForwardKvCache, PagedCacheMatchesTheReference) {
  for (const int headdim : {64, 96, 128, 192, 256}) {
    for (const int page_size : {16, 48, 256}) {
      for (const bool causal : {false, true}) {
        SCOPED_TRACE("headdim " + std::to_string(headdim) + " page " + std::to_string(page_size) +
                     (causal ? " causal" : ""));
        const int capacity = page_size * (3072 / page_size);
        KvCacheCase c = make_case(DType::kBFloat16, headdim, causal, 1, capacity,
                                  {capacity, 0, 1, capacity - 1, 177, 1281});
        c.page_size = page_size;
        expect_kvcache_matches_reference(c);
        c.seqlen_q = 9;
        c.seqlens = {capacity, 9, 0, 500};
        expect_kvcache_matches_reference(c);
      }
    }
  }
  // cache_batch_idx picks the page table's row (a table of more rows than batches).
  KvCacheCase c = make_case(DType::kBFloat16, 128, true, 1, 2048, {2048, 17, 0, 1000});
  c.page_size = 64;
  c.batch_idx = {5, 0, 3, 2};
  c.kv_batch = 6;
  expect_kvcache_matches_reference(c);
}

// Small cases for compute-sanitizer: --gtest_filter='SanitizeForward*'.
class SanitizeForwardKvCache : public HopperTest {};

TEST_F(SanitizeForwardKvCache, Bf16D128DecodeWithBatchIndex) {
  KvCacheCase c = make_case(DType::kBFloat16, 128, false, 1, 3000, {3000, 0, 1500});
  c.batch_idx = {2, 1, 0};
  c.kv_batch = 3;
  expect_kvcache_matches_reference(c);
}

TEST_F(SanitizeForwardKvCache, Bf16D128PagedDecode) {
  KvCacheCase c = make_case(DType::kBFloat16, 128, false, 1, 3072, {3072, 0, 1500});
  c.page_size = 16;
  expect_kvcache_matches_reference(c);
}

TEST_F(SanitizeForwardKvCache, Fp16D64LeftPaddedCausal) {
  KvCacheCase c = make_case(DType::kFloat16, 64, true, 3, 700, {700, 5, 300});
  c.leftpad = {129, 5, 1};
  expect_kvcache_matches_reference(c);
}

}  // namespace
}  // namespace flash3::test
