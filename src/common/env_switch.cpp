// treemla: measurement and test switches read from the environment (common/env_switch.h).
#include "common/env_switch.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "treemla/error.h"

namespace treemla::detail {

namespace {

const char* env_value(const char* var) {
  const char* e = std::getenv(var);
  return e != nullptr && *e != '\0' ? e : nullptr;
}

// One decimal integer spanning [s, end of the number); false when none starts at s or it
// overflows a long. `next` is set past the number.
bool parse_long(const char* s, long& out, const char*& next) {
  const char* d = *s == '-' ? s + 1 : s;
  if (*d < '0' || *d > '9') return false;  // strtol would skip white space and take a '+'
  errno = 0;
  char* end = nullptr;
  out = std::strtol(s, &end, 10);
  next = end;
  return end != s && errno == 0;
}

}  // namespace

bool env_set(const char* var) { return env_value(var) != nullptr; }

int env_choice(const char* var, std::initializer_list<const char*> names, int unset_index) {
  const char* e = env_value(var);
  if (e == nullptr) return unset_index;
  int i = 0;
  std::string list;
  for (const char* n : names) {
    if (std::string(e) == n) return i;
    list += (i == 0 ? "" : (i + 1 == static_cast<int>(names.size()) ? " or " : ", "));
    list += n;
    ++i;
  }
  TREEMLA_FAIL(var << " must be " << list << " (got \"" << e << "\")");
  return unset_index;  // not reached
}

long env_int(const char* var, long lo, long hi, long unset_value) {
  const char* e = env_value(var);
  if (e == nullptr) return unset_value;
  long v = 0;
  const char* next = nullptr;
  TREEMLA_CHECK(parse_long(e, v, next) && *next == '\0' && v >= lo && v <= hi,
                var << " must be an integer in [" << lo << ", " << hi << "] (got \"" << e << "\")");
  return v;
}

std::vector<long> env_ints(const char* var, int count, long lo, long hi) {
  const char* e = env_value(var);
  if (e == nullptr) return {};
  std::vector<long> out;
  const char* s = e;
  bool ok = true;
  while (ok && static_cast<int>(out.size()) < count) {
    long v = 0;
    const char* next = nullptr;
    ok = parse_long(s, v, next) && v >= lo && v <= hi;
    if (!ok) break;
    out.push_back(v);
    const bool last = static_cast<int>(out.size()) == count;
    ok = last ? *next == '\0' : *next == ',';
    s = next + 1;
  }
  TREEMLA_CHECK(ok, var << " must be " << count << " comma-separated integers in [" << lo << ", "
                        << hi << "] (got \"" << e << "\")");
  return out;
}

}  // namespace treemla::detail
