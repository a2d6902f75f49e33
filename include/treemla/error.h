// treemla: errors. A library never exits; it throws treemla::Error, which
// carries the function, file and line where a check failed and a message that
// names the argument and the bound it broke.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace treemla {

class Error : public std::runtime_error {
 public:
  Error(const char* func, const char* file, int line, const std::string& message);
  const std::string& message() const noexcept { return message_; }
  const char* func() const noexcept { return func_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string message_;
  const char* func_;
  const char* file_;
  int line_;
};

}  // namespace treemla

// TREEMLA_CHECK(cond, a << b << c): throw treemla::Error with the streamed message.
#define TREEMLA_CHECK(cond, msg)                                               \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::ostringstream treemla_os_;                                          \
      treemla_os_ << msg;                                                      \
      throw ::treemla::Error(__func__, __FILE__, __LINE__, treemla_os_.str()); \
    }                                                                          \
  } while (0)

#define TREEMLA_FAIL(msg) TREEMLA_CHECK(false, msg)
