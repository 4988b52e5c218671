// The GPU suites' memory layouts, checked without a GPU: every view stays in
// its buffer, no two elements share a place, and flash3's validation accepts
// the strides (the call then stops at the device check).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "forward_case.hpp"
#include "test_support.hpp"

namespace flash3::test {
namespace {

// Marks each element of `view` in `owners`; false if one lies outside or is taken.
bool claim(const View& view, std::vector<bool>& owners) {
  bool ok = true;
  for_each_element(view, [&](size_t, size_t index) {
    ok = ok && index < owners.size() && !owners[index];
    if (index < owners.size()) {
      owners[index] = true;
    }
  });
  return ok;
}

class GpuLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(GpuLayouts, ViewsAreDisjointAndValid) {
  const ForwardCase c{DType::kFloat16, {2, 33, 33, 4, 2, 64}, true, 0.0f, GetParam()};
  const Placement p = place(c);
  std::vector<bool> inputs(p.inputs_size), outputs(p.out_size);
  EXPECT_TRUE(claim(p.q, inputs));
  EXPECT_TRUE(claim(p.k, inputs));
  EXPECT_TRUE(claim(p.v, inputs));
  EXPECT_TRUE(claim(p.out, outputs));

  PoisonedBuffer input_buffer(p.inputs_size * sizeof(uint16_t));
  PoisonedBuffer out_buffer(p.out_size * sizeof(uint16_t));
  const auto input = [&](const View& view) {
    return view_tensor(input_buffer.data(), c.dtype, view);
  };
  const Status s = flash3::forward(input(p.q), input(p.k), input(p.v),
                                   view_tensor(out_buffer.data(), c.dtype, p.out), nullptr,
                                   {c.causal, c.softmax_scale}, nullptr);
  // Past validation: no device here, or host memory on a GPU machine.
  const bool validated = s.code == StatusCode::kNoDevice ||
                         s.message.find("is not device memory") != std::string::npos;
  EXPECT_TRUE(validated) << s.message;
}

INSTANTIATE_TEST_SUITE_P(All, GpuLayouts,
                         ::testing::Values(Layout::kContiguous, Layout::kPackedQkv,
                                           Layout::kHeadMajor, Layout::kPadded),
                         [](const auto& info) { return std::string(layout_name(info.param)); });

}  // namespace
}  // namespace flash3::test
