// Parameterized refusal tests shared by the validation suites: a case breaks
// one valid Host*Problem (host_problem.hpp) and names the status code and
// message the call must return, through the C++ API and the C ABI alike,
// before it touches any memory.
#pragma once

#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "host_problem.hpp"

namespace flash3::test {

template <class Problem>
struct InvalidCase {
  const char* name;
  void (*mutate)(Problem&);
  StatusCode code;
  const char* message;  // must appear in the status message
};

template <class Problem>
std::ostream& operator<<(std::ostream& os, const InvalidCase<Problem>& c) {
  return os << c.name;
}

template <class Problem>
void expect_refused(const InvalidCase<Problem>& c) {
  Problem p;
  c.mutate(p);
  const Status s = p.call();
  EXPECT_EQ(s.code, c.code) << s.message;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, c.message, s.message);
  EXPECT_TRUE(p.untouched());
}

template <class Problem>
void expect_refused_through_c_abi(const InvalidCase<Problem>& c) {
  Problem p;
  c.mutate(p);
  EXPECT_EQ(p.c_call(), static_cast<flash3_status>(c.code));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, c.message, flash3_last_error());
  EXPECT_TRUE(p.untouched());
}

// INSTANTIATE_TEST_SUITE_P's name generator: the case's name.
struct CaseName {
  template <class Info>
  std::string operator()(const Info& info) const {
    return info.param.name;
  }
};

}  // namespace flash3::test
