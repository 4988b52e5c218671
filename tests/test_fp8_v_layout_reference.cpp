// ref::fp8_v_layout, the specification of the FP8 forward's V layout that
// the fp8_v_layout kernel must reproduce bit for bit.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "flash3/flash3.hpp"
#include "reference/fp8.hpp"

namespace flash3::ref {
namespace {

// Code of (key, d) in the hand-checked case: distinct, and never 0.
uint8_t hand_code(int key, int d) { return static_cast<uint8_t>(1 + key + 64 * d); }

TEST(Fp8VLayoutReference, KeyOrderIsAPermutationOfAGroup) {
  std::vector<int> order(std::begin(kFp8VKeyOrder), std::end(kFp8VKeyOrder));
  std::sort(order.begin(), order.end());
  std::vector<int> identity(kFp8VKeyGroup);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(order, identity);
}

TEST(Fp8VLayoutReference, PaddedSeqlenRoundsUpToAGroup) {
  for (const auto& [seqlen, padded] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {16, 16}, {17, 32}, {21, 32}, {1000, 1008}}) {
    const Fp8V v{nullptr, 2, seqlen, 3, 64};
    EXPECT_EQ(v.padded_seqlen(), padded) << seqlen;
    EXPECT_EQ(v.bytes(), 2 * 3 * 64 * padded) << seqlen;
  }
}

// seqlen 21 (one full group, a group of 5 keys and 11 zero slots), head dim
// 2, written out by hand from kFp8VKeyOrder = {0, 1, 8, 9, 2, 3, 10, 11, 4,
// 5, 12, 13, 6, 7, 14, 15}.
TEST(Fp8VLayoutReference, HandCheckedTail) {
  const TensorDims dims{1, 21, 1, 2};
  std::vector<uint8_t> codes(dims.size());
  for (int key = 0; key < dims.seqlen; ++key) {
    for (int d = 0; d < dims.headdim; ++d) {
      codes[key * dims.headdim + d] = hand_code(key, d);
    }
  }
  // Keys of each slot; -1 for a zero slot.
  const int keys[32] = {0,  1,  8,  9,  2,  3,  10, 11, 4,  5,  12, 13, 6,  7,  14, 15,
                        16, 17, -1, -1, 18, 19, -1, -1, 20, -1, -1, -1, -1, -1, -1, -1};
  std::vector<uint8_t> want;
  for (int d = 0; d < dims.headdim; ++d) {
    for (int key : keys) {
      want.push_back(key < 0 ? 0 : hand_code(key, d));
    }
  }
  EXPECT_EQ(fp8_v_layout(dims, codes), want);
}

// Batch and heads index the layout's outer dimensions; every key of every
// (batch, head, column) row appears exactly once, the rest is zero.
TEST(Fp8VLayoutReference, EveryKeyOnceInItsRow) {
  const TensorDims dims{2, 37, 3, 64};
  const int padded = 48;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> codes(dims.size());
  for (uint8_t& c : codes) {
    c = static_cast<uint8_t>(byte(rng));
  }
  const std::vector<uint8_t> got = fp8_v_layout(dims, codes);
  ASSERT_EQ(got.size(), static_cast<size_t>(dims.batch) * dims.heads * dims.headdim * padded);
  for (int b = 0; b < dims.batch; ++b) {
    for (int h = 0; h < dims.heads; ++h) {
      for (int d = 0; d < dims.headdim; ++d) {
        const uint8_t* row = &got[((b * dims.heads + h) * dims.headdim + d) * size_t{padded}];
        std::vector<int> seen(dims.seqlen, 0);
        for (int slot = 0; slot < padded; ++slot) {
          const int key = slot / 16 * 16 + kFp8VKeyOrder[slot % 16];
          if (key >= dims.seqlen) {
            EXPECT_EQ(row[slot], 0) << "pad slot " << slot;
            continue;
          }
          ++seen[key];
          const size_t at = ((static_cast<size_t>(b) * dims.seqlen + key) * dims.heads + h) *
                                dims.headdim + d;
          ASSERT_EQ(row[slot], codes[at]) << "b " << b << " h " << h << " d " << d << " slot "
                                          << slot;
        }
        EXPECT_EQ(seen, std::vector<int>(dims.seqlen, 1));
      }
    }
  }
}

TEST(Fp8VLayoutReference, RefusesMismatchedCodes) {
  EXPECT_THROW(fp8_v_layout({1, 21, 1, 64}, std::vector<uint8_t>(21 * 64 - 1)),
               std::invalid_argument);
}

}  // namespace
}  // namespace flash3::ref
