// treemla tool: the cost table JSON reader and the default table's lookup (cost_table_file.h).
#include "cost_table_file.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>

#include "treemla/error.h"

#ifndef TREEMLA_DATA_FROM_BIN  // set by tools/CMakeLists.txt from the install directories
#define TREEMLA_DATA_FROM_BIN "../share/treemla"
#endif
#ifndef TREEMLA_COST_TABLE_SOURCE
#define TREEMLA_COST_TABLE_SOURCE "bench/results/"
#endif

namespace treemla::tool {

namespace {

using json = nlohmann::json;

constexpr const char* kDefaultFileName = "default-cost-table.json";
constexpr const char* kRequiredKeys = "gpu, date, commit, heads, page_size, n, L, us";

// Names a value in a message, cut short if long.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

class Reader {
 public:
  Reader(std::string label, std::string path) : prefix_(label + ": '" + path + "': ") {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(prefix_ + what);
  }

  const json& key(const json& doc, const char* name) const {
    const auto it = doc.find(name);
    if (it == doc.end())
      fail(std::string("key \"") + name + "\" is missing (required: " + kRequiredKeys + ")");
    return *it;
  }

  std::string string(const json& doc, const char* name) const {
    const json& v = key(doc, name);
    if (!v.is_string()) fail(std::string("\"") + name + "\" must be a string, not " + shown(v));
    return v.get<std::string>();
  }

  // An integer in [lo, hi] (the range of the field's C++ type; validate_cost_table checks the
  // rules).
  int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(name + " must be an integer, not " + shown(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi)
                               : v.get<int64_t>() > hi)
      fail(name + " = " + shown(v) + " must be <= " + std::to_string(hi));
    if (v.get<int64_t>() < lo) fail(name + " = " + shown(v) + " must be >= " + std::to_string(lo));
    return v.get<int64_t>();
  }

  const json& array(const json& v, const std::string& name, const std::string& of) const {
    if (!v.is_array()) fail(name + " must be an array of " + of + ", not " + shown(v));
    return v;
  }

  double time(const json& v, const std::string& name) const {
    if (v.is_null())
      fail(name +
           " is null; must be a finite number > 0 (JSON writers store NaN and infinity as null)");
    if (!v.is_number()) fail(name + " must be a number, not " + shown(v));
    const double x = v.get<double>();
    if (!std::isfinite(x) || !(x > 0))
      fail(name + " = " + shown(v) + " must be a finite number > 0");
    return x;
  }

 private:
  std::string prefix_;
};

}  // namespace

CostTableFile read_cost_table_file(const std::string& path, const std::string& label) {
  const Reader r(label, path);
  std::ifstream f(path);
  if (!f) throw std::invalid_argument(label + ": '" + path + "' cannot be opened");
  json doc;
  try {
    doc = json::parse(f);
  } catch (const json::exception& e) {
    r.fail(std::string("not a valid JSON file: ") + e.what());
  }
  if (!doc.is_object()) r.fail("the top level must be a JSON object, not " + shown(doc));

  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  CostTableFile out;
  out.path = path;
  CostTable& t = out.table;
  t.gpu = r.string(doc, "gpu");
  t.date = r.string(doc, "date");
  t.commit = r.string(doc, "commit");
  t.heads = static_cast<int32_t>(r.integer(r.key(doc, "heads"), "\"heads\"", 0, kInt32Max));
  t.page_size =
      static_cast<int32_t>(r.integer(r.key(doc, "page_size"), "\"page_size\"", 0, kInt32Max));
  for (const json& v : r.array(r.key(doc, "n"), "\"n\"", "integers (tree sizes 1 + B)"))
    t.n.push_back(
        static_cast<int32_t>(r.integer(v, "n[" + std::to_string(t.n.size()) + "]", 0, kInt32Max)));
  for (const json& v : r.array(r.key(doc, "L"), "\"L\"", "integers (prefix lengths)"))
    t.L.push_back(r.integer(v, "L[" + std::to_string(t.L.size()) + "]", 0,
                            std::numeric_limits<int64_t>::max()));
  const json& us = r.array(r.key(doc, "us"), "\"us\"", "arrays (one per n entry)");
  if (us.size() != t.n.size())
    r.fail("\"us\" has " + std::to_string(us.size()) + " rows; must have len(n) = " +
           std::to_string(t.n.size()) + " (us[i][j] is the time at n[i], L[j])");
  for (size_t i = 0; i < us.size(); ++i) {
    const std::string row = "us[" + std::to_string(i) + "]";
    r.array(us[i], row, "numbers (one per L entry)");
    if (us[i].size() != t.L.size())
      r.fail(row + " has " + std::to_string(us[i].size()) +
             " entries; must have len(L) = " + std::to_string(t.L.size()));
    t.us.emplace_back();
    for (size_t j = 0; j < us[i].size(); ++j)
      t.us.back().push_back(r.time(us[i][j], row + "[" + std::to_string(j) + "]"));
  }
  try {
    validate_cost_table(t);
  } catch (const Error& e) {
    r.fail(e.message());
  }
  for (const char* k : {"family", "tile"}) {
    const auto it = doc.find(k);
    if (it != doc.end() && it->is_string())
      (k[0] == 'f' ? out.family : out.tile) = it->get<std::string>();
  }
  return out;
}

std::vector<std::string> default_cost_table_candidates() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (ec) return {};
  const fs::path dir = exe.parent_path();
  return {(dir / TREEMLA_DATA_FROM_BIN / kDefaultFileName).lexically_normal().string(),
          (dir / "share" / "treemla" / kDefaultFileName).string()};
}

std::string find_default_cost_table() {
  const std::vector<std::string> candidates = default_cost_table_candidates();
  std::string looked;
  for (const std::string& p : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p;
    looked += (looked.empty() ? "" : ", ") + p;
  }
  if (candidates.empty()) looked = "(the binary's own path could not be read from /proc/self/exe)";
  throw std::invalid_argument("no default cost table found (looked in " + looked +
                              "); give one with --cost-table FILE, e.g. " TREEMLA_COST_TABLE_SOURCE
                              " from the source tree");
}

}  // namespace treemla::tool
