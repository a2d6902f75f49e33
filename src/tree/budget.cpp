// Budget picker: cost-table validation and interpolation.
#include "treemla/budget.h"

#include <algorithm>
#include <cmath>

#include "treemla/error.h"

namespace treemla {

namespace {

template <typename T>
void validate_axis(const std::vector<T>& axis, const char* name, T lo, T hi) {
  TREEMLA_CHECK(!axis.empty(), "cost table: " << name << " is empty; the grid needs >= 1 point");
  TREEMLA_CHECK(axis.front() >= lo, "cost table: " << name << "[0] = " << axis.front()
                                                   << " must be >= " << lo);
  for (size_t i = 1; i < axis.size(); ++i)
    TREEMLA_CHECK(axis[i] > axis[i - 1],
                  "cost table: " << name << "[" << i << "] = " << axis[i] << " must be > " << name
                                 << "[" << i - 1 << "] = " << axis[i - 1]
                                 << " (the axis strictly increases)");
  TREEMLA_CHECK(axis.back() <= hi, "cost table: " << name << "[" << axis.size() - 1
                                                  << "] = " << axis.back() << " must be <= " << hi);
}

// Where x falls on a strictly increasing axis: value = (1 - t) * f[lo] + t * f[hi]. On a grid
// point lo == hi and t == 0, so the result is that point's value bit for bit.
struct Bracket {
  size_t lo = 0;
  size_t hi = 0;
  double t = 0.0;
};

template <typename T>
Bracket bracket(const std::vector<T>& axis, int64_t x) {
  const auto it = std::upper_bound(axis.begin(), axis.end(), static_cast<T>(x));
  const size_t lo = static_cast<size_t>(it - axis.begin()) - 1;  // axis[lo] <= x, x in range
  if (axis[lo] == x) return {lo, lo, 0.0};
  const double t = static_cast<double>(x - axis[lo]) / static_cast<double>(axis[lo + 1] - axis[lo]);
  return {lo, lo + 1, t};
}

double lerp(double a, double b, double t) { return (1.0 - t) * a + t * b; }

void check_prefix_len(const CostTable& table, int64_t prefix_len) {
  TREEMLA_CHECK(prefix_len >= table.L.front() && prefix_len <= table.L.back(),
                "prefix_len = " << prefix_len << " is outside the cost table's L range ["
                                << table.L.front() << ", " << table.L.back()
                                << "] (no extrapolation)");
}

void check_n(const CostTable& table, int32_t n) {
  TREEMLA_CHECK(n >= table.n.front() && n <= table.n.back(),
                "n = " << n << " is outside the cost table's n range [" << table.n.front() << ", "
                       << table.n.back() << "] (B = n - 1 in [" << table.min_budget() << ", "
                       << table.max_budget() << "]; no extrapolation)");
}

// C_v on a validated table, n and prefix_len inside its ranges.
double interpolate(const CostTable& table, int32_t n, int64_t prefix_len) {
  const Bracket bn = bracket(table.n, n);
  const Bracket bl = bracket(table.L, prefix_len);
  auto row = [&](size_t i) { return lerp(table.us[i][bl.lo], table.us[i][bl.hi], bl.t); };
  return lerp(row(bn.lo), row(bn.hi), bn.t);
}

}  // namespace

void validate_cost_table(const CostTable& table) {
  TREEMLA_CHECK(table.heads >= 1 && table.heads <= kMaxHeads,
                "cost table: heads = " << table.heads << " must be in 1.." << kMaxHeads);
  TREEMLA_CHECK(table.page_size >= 1 && (table.page_size & (table.page_size - 1)) == 0,
                "cost table: page_size = " << table.page_size << " must be a power of two");
  validate_axis<int32_t>(table.n, "n", 1, kMaxTreeNodes);
  validate_axis<int64_t>(table.L, "L", 0, kMaxPrefixLen);
  TREEMLA_CHECK(table.us.size() == table.n.size(),
                "cost table: us has " << table.us.size() << " rows; must be n.size() = "
                                      << table.n.size() << " (one row per n)");
  for (size_t i = 0; i < table.us.size(); ++i) {
    TREEMLA_CHECK(table.us[i].size() == table.L.size(),
                  "cost table: us[" << i << "] has " << table.us[i].size()
                                    << " entries; must be L.size() = " << table.L.size());
    for (size_t j = 0; j < table.us[i].size(); ++j) {
      const double v = table.us[i][j];
      TREEMLA_CHECK(std::isfinite(v) && v > 0.0,
                    "cost table: us[" << i << "][" << j << "] = " << v << " (n = " << table.n[i]
                                      << ", L = " << table.L[j] << ") must be finite and > 0");
    }
  }
}

double verify_cost_us(const CostTable& table, int32_t n, int64_t prefix_len) {
  validate_cost_table(table);
  check_n(table, n);
  check_prefix_len(table, prefix_len);
  return interpolate(table, n, prefix_len);
}

}  // namespace treemla
