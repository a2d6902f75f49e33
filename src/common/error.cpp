#include "treemla/error.h"

namespace treemla {

namespace {
std::string format(const char* func, const char* file, int line, const std::string& message) {
  std::ostringstream os;
  os << "treemla: " << message << " [" << func << " at " << file << ":" << line << "]";
  return os.str();
}
}  // namespace

Error::Error(const char* func, const char* file, int line, const std::string& message)
    : std::runtime_error(format(func, file, line, message)),
      message_(message),
      func_(func),
      file_(file),
      line_(line) {}

}  // namespace treemla
