// treemla tests: expect a call to throw treemla::Error whose message contains every given part
// (the argument's name, the bound it broke, ...).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "treemla/error.h"

namespace treemla::test {

inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected treemla::Error containing '" << parts[0] << "'";
  } catch (const Error& e) {
    for (const auto& s : parts)
      EXPECT_NE(e.message().find(s), std::string::npos)
          << "message: " << e.message() << "\nmissing: " << s;
  }
}

}  // namespace treemla::test
