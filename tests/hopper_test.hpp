// The base of every GPU test: skips, saying why, without a Hopper GPU.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "forward_case.hpp"

namespace flash3::test {

class HopperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::string reason = hopper_missing_reason();
    if (!reason.empty()) {
      GTEST_SKIP() << reason;
    }
  }
};

}  // namespace flash3::test
