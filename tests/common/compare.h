// treemla tests: element-wise comparison of float results with a useful failure message.
//
// all_close first requires the non-finite values to sit at the same positions with the same
// kind (NaN, +inf, -inf): an LSE of -inf for an empty row is part of the contract, and a NaN is
// never close to anything. Then every finite pair must satisfy
//   |got - expected| <= atol + rtol * |expected|,
// and the message reports the worst element (the largest error relative to its bound) with its
// index, both values, and its absolute and relative error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace treemla::test {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
};

// "1234" or, given a row-major shape, "1234 [2, 1, 210]".
inline std::string format_index(int64_t i, const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << i;
  if (!shape.empty()) {
    std::vector<int64_t> idx(shape.size());
    int64_t rest = i;
    for (size_t d = shape.size(); d-- > 0;) {
      idx[d] = shape[d] > 0 ? rest % shape[d] : 0;
      rest = shape[d] > 0 ? rest / shape[d] : rest;
    }
    os << " [";
    for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
    os << "]";
  }
  return os.str();
}

inline int finite_class(float x) {  // 0 finite, 1 NaN, 2 +inf, 3 -inf
  if (std::isnan(x)) return 1;
  if (std::isinf(x)) return x > 0 ? 2 : 3;
  return 0;
}

// Success when every element has the same finite_class in both arrays; otherwise the count and
// the first mismatch.
inline ::testing::AssertionResult nonfinite_positions_match(
    const float* got, const float* expected, int64_t n, const std::string& what = "values",
    const std::vector<int64_t>& shape = {}) {
  int64_t class_mismatches = 0, first_class_mismatch = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (finite_class(got[i]) != finite_class(expected[i])) {
      if (first_class_mismatch < 0) first_class_mismatch = i;
      ++class_mismatches;
    }
  }
  if (class_mismatches > 0) {
    const int64_t i = first_class_mismatch;
    return ::testing::AssertionFailure()
           << what << ": " << class_mismatches << " of " << n
           << " elements differ in inf/NaN position; first at " << format_index(i, shape)
           << ": got " << got[i] << ", expected " << expected[i];
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_close(const float* got, const float* expected, int64_t n,
                                            Tolerance tol, const std::string& what = "values",
                                            const std::vector<int64_t>& shape = {}) {
  if (auto r = nonfinite_positions_match(got, expected, n, what, shape); !r) return r;
  int64_t worst = -1, failures = 0;
  double worst_ratio = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (finite_class(expected[i]) != 0) continue;
    const double err = std::fabs(static_cast<double>(got[i]) - expected[i]);
    const double bound = tol.atol + tol.rtol * std::fabs(static_cast<double>(expected[i]));
    if (err > bound) ++failures;
    // Ratio against the bound; with a zero bound any error is infinitely bad, so compare errors.
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (worst < 0 || ratio > worst_ratio ||
        (ratio == worst_ratio &&
         err > std::fabs(static_cast<double>(got[worst]) - expected[worst]))) {
      worst = i;
      worst_ratio = ratio;
    }
  }
  std::ostringstream os;
  if (worst >= 0) {
    const double err = std::fabs(static_cast<double>(got[worst]) - expected[worst]);
    const double rel =
        expected[worst] != 0 ? err / std::fabs(static_cast<double>(expected[worst])) : INFINITY;
    os << what << ": " << failures << " of " << n << " elements out of tolerance (atol " << tol.atol
       << ", rtol " << tol.rtol << "); worst at " << format_index(worst, shape) << ": got "
       << got[worst] << ", expected " << expected[worst] << ", abs err " << err << ", rel err "
       << rel;
  }
  if (failures > 0) return ::testing::AssertionFailure() << os.str();
  return ::testing::AssertionSuccess() << os.str();
}

inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& expected, Tolerance tol,
                                            const std::string& what = "values",
                                            const std::vector<int64_t>& shape = {}) {
  if (got.size() != expected.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != expected size " << expected.size();
  return all_close(got.data(), expected.data(), static_cast<int64_t>(got.size()), tol, what, shape);
}

// True when no element is NaN or infinite.
inline ::testing::AssertionResult all_finite(const std::vector<float>& v,
                                             const std::string& what = "values") {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << v[i];
  return ::testing::AssertionSuccess();
}

}  // namespace treemla::test
