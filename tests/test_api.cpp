// The C ABI's own calls (last error, status names, version) and the answer
// to a valid call on a machine without a GPU.
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "host_problem.hpp"

namespace flash3::test {
namespace {

constexpr const char* kNoDeviceMessage = "no usable CUDA device";

void skip_if_gpu_present() {
  if (cuda_device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is present: this checks the answer without one";
  }
}

TEST(CAbi, NullArgsAreRefused) {
  EXPECT_EQ(flash3_forward(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "args is null", flash3_last_error());
}

TEST(CAbi, ZeroInitializedArgsNameQ) {
  const flash3_forward_args args{};
  EXPECT_EQ(flash3_forward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "q.data is null", flash3_last_error());
}

TEST(CAbi, LastErrorFollowsTheLatestCall) {
  HostProblem p;
  p.q.data = nullptr;
  flash3_forward_args args = p.c_args();
  EXPECT_EQ(flash3_forward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "q.data is null", flash3_last_error());
  args.q.data = p.q_buffer.data();
  args.v.data = nullptr;
  EXPECT_EQ(flash3_forward(&args, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "v.data is null", flash3_last_error());
}

TEST(CAbi, LastErrorIsPerThread) {
  EXPECT_EQ(flash3_forward(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  std::string fresh_thread_error;
  std::thread([&] {
    fresh_thread_error = flash3_last_error();
    const flash3_forward_args args{};
    flash3_forward(&args, nullptr);
  }).join();
  EXPECT_EQ(fresh_thread_error, "");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "args is null", flash3_last_error());
}

TEST(CAbi, StatusNames) {
  EXPECT_STREQ(flash3_status_name(FLASH3_OK), "FLASH3_OK");
  EXPECT_STREQ(flash3_status_name(FLASH3_ERROR_INVALID_ARGUMENT), "FLASH3_ERROR_INVALID_ARGUMENT");
  EXPECT_STREQ(flash3_status_name(FLASH3_ERROR_UNSUPPORTED), "FLASH3_ERROR_UNSUPPORTED");
  EXPECT_STREQ(flash3_status_name(FLASH3_ERROR_NO_DEVICE), "FLASH3_ERROR_NO_DEVICE");
  EXPECT_STREQ(flash3_status_name(FLASH3_ERROR_CUDA), "FLASH3_ERROR_CUDA");
  EXPECT_STREQ(flash3_status_name(FLASH3_ERROR_INTERNAL), "FLASH3_ERROR_INTERNAL");
  EXPECT_STREQ(flash3_status_name(static_cast<flash3_status>(99)), "FLASH3_UNKNOWN_STATUS");
}

TEST(CAbi, VersionMatchesTheHeader) {
  const std::string expected = std::to_string(FLASH3_VERSION_MAJOR) + "." +
                               std::to_string(FLASH3_VERSION_MINOR) + "." +
                               std::to_string(FLASH3_VERSION_PATCH);
  EXPECT_EQ(flash3_version(), expected);
  EXPECT_EQ(flash3::version(), expected);
}

TEST(NoDevice, ValidCallSaysSo) {
  skip_if_gpu_present();
  HostProblem p;
  const Status s = p.call();
  EXPECT_EQ(s.code, StatusCode::kNoDevice) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, kNoDeviceMessage, s.message);
  EXPECT_TRUE(p.untouched());
}

TEST(NoDevice, ValidCallSaysSoThroughTheCAbi) {
  skip_if_gpu_present();
  HostProblem p;
  const flash3_forward_args args = p.c_args();
  EXPECT_EQ(flash3_forward(&args, nullptr), FLASH3_ERROR_NO_DEVICE);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, kNoDeviceMessage, flash3_last_error());
  EXPECT_TRUE(p.untouched());
}

}  // namespace
}  // namespace flash3::test
