// The decoding plans (src/sm90/fwd/decode.hpp): the packed GQA view reaches
// exactly the elements of q, out and the log-sum-exp the call describes, and
// which launches take the split-KV variant; a paged cache's TMA boxes.
#include <gtest/gtest.h>

#include "src/sm90/fwd/decode.hpp"
#include "src/sm90/fwd/kv_cache.hpp"

namespace {

using flash3::DType;
using flash3::detail::ForwardParams;
using flash3::detail::pack_gqa;
using flash3::detail::Strides3;
using flash3::detail::wants_split_kv;

ForwardParams decode_call(int batch, int seqlen_q, int heads_q, int heads_k, int headdim) {
  ForwardParams p;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = 4096;
  p.heads_q = heads_q;
  p.heads_k = heads_k;
  p.headdim = headdim;
  p.causal = true;
  p.dtype = DType::kBFloat16;
  // q padded along the heads (a strided view, as from a fused QKV projection).
  p.q_stride = {static_cast<int64_t>(seqlen_q) * (heads_q + 2 * heads_k) * headdim,
                static_cast<int64_t>(heads_q + 2 * heads_k) * headdim, headdim};
  p.out_stride = {static_cast<int64_t>(seqlen_q) * heads_q * headdim,
                  static_cast<int64_t>(heads_q) * headdim, headdim};
  return p;
}

TEST(DecodePlan, PackedGqaViewIsTheSameMemory) {
  for (const auto& [heads_q, heads_k] : {std::pair{32, 8}, {8, 1}, {6, 2}, {64, 8}}) {
    const ForwardParams call = decode_call(3, 1, heads_q, heads_k, 128);
    ForwardParams p = call;
    ASSERT_TRUE(pack_gqa(&p)) << heads_q << "/" << heads_k;
    const int group = heads_q / heads_k;
    EXPECT_EQ(p.seqlen_q, group);
    EXPECT_EQ(p.heads_q, heads_k);
    EXPECT_EQ(p.heads_k, heads_k);
    EXPECT_FALSE(p.causal);  // one query sees every key
    EXPECT_EQ(p.batch, call.batch);
    EXPECT_EQ(p.seqlen_k, call.seqlen_k);
    for (int b = 0; b < call.batch; ++b) {
      for (int h = 0; h < heads_q; ++h) {
        const int kv = h / group, row = h % group;  // head h reads K/V head h / group
        EXPECT_EQ(p.q_stride.offset(b, row, kv), call.q_stride.offset(b, 0, h));
        EXPECT_EQ(p.out_stride.offset(b, row, kv), call.out_stride.offset(b, 0, h));
        // The log-sum-exp, contiguous (batch, heads_q, seqlen_q).
        EXPECT_EQ((static_cast<int64_t>(b) * p.heads_q + kv) * p.seqlen_q + row,
                  (static_cast<int64_t>(b) * call.heads_q + h) * call.seqlen_q + 0);
      }
    }
  }
}

TEST(DecodePlan, PacksOnlySingleQueryGqa) {
  const auto unchanged = [](ForwardParams p) {
    const ForwardParams before = p;
    EXPECT_FALSE(pack_gqa(&p));
    EXPECT_EQ(p.seqlen_q, before.seqlen_q);
    EXPECT_EQ(p.heads_q, before.heads_q);
    EXPECT_EQ(p.causal, before.causal);
    EXPECT_EQ(p.q_stride.seq, before.q_stride.seq);
  };
  unchanged(decode_call(2, 2, 32, 8, 128));  // two queries: rows of two strides
  unchanged(decode_call(2, 1, 8, 8, 128));   // MHA: nothing to pack
  ForwardParams fp8 = decode_call(2, 1, 32, 8, 128);
  fp8.dtype = DType::kFloat8E4M3;  // descales are per (batch, head) blocks of rows
  unchanged(fp8);
  ForwardParams varlen = decode_call(1, 1, 32, 8, 128);
  varlen.varlen_batch = 1;
  unchanged(varlen);
}

TEST(DecodePlan, SplitKvForOneQueryBlockOfLongKeys) {
  // d128's long non-causal tile: 128 rows, 176 keys; pieces need 16 key blocks.
  EXPECT_TRUE(wants_split_kv(4, 8192, 128, 176));
  EXPECT_TRUE(wants_split_kv(128, 16 * 176, 128, 176));
  EXPECT_FALSE(wants_split_kv(128, 15 * 176, 128, 176));
  EXPECT_FALSE(wants_split_kv(129, 8192, 128, 176));  // two query blocks: not decoding
  EXPECT_FALSE(wants_split_kv(1, 1024, 192, 128));
}

}  // namespace

// A paged cache's TMA boxes: as many rows as both the page and the key
// block allow, never across a page, never fewer than kPageBoxRows.
TEST(DecodePlan, PagedBoxesAreAsLargeAsThePagesAllow) {
  using flash3::sm90::fwd::kPageBoxRows;
  using flash3::sm90::fwd::paged_box_rows;
  EXPECT_EQ(paged_box_rows(256, 128), 128);
  EXPECT_EQ(paged_box_rows(256, 64), 64);
  EXPECT_EQ(paged_box_rows(64, 128), 64);
  EXPECT_EQ(paged_box_rows(48, 128), 16);
  EXPECT_EQ(paged_box_rows(16, 128), kPageBoxRows);
  EXPECT_EQ(paged_box_rows(256, 176), 16);
  for (int page = kPageBoxRows; page <= 1024; page += kPageBoxRows) {
    for (const int block_n : {64, 128}) {
      const int rows = paged_box_rows(page, block_n);
      EXPECT_EQ(page % rows, 0) << page;
      EXPECT_EQ(block_n % rows, 0) << page;
      EXPECT_GE(rows, kPageBoxRows);
    }
  }
}
