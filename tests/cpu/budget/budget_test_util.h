// treemla tests: helpers shared by the budget tests -- synthetic cost tables (analytic and random),
// synthetic path scores, and a brute-force budget search written independently of the library's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "treemla/budget.h"

namespace treemla::budget_test {

inline double uniform(std::mt19937& rng, double lo, double hi) {
  return lo + (hi - lo) * std::generate_canonical<double, 53>(rng);
}

// A table on the given grid whose entries are f(n, L).
inline CostTable make_table(const std::vector<int32_t>& n, const std::vector<int64_t>& L,
                            const std::function<double(double, double)>& f) {
  CostTable t;
  t.gpu = "synthetic";
  t.date = "2026-12-01";
  t.commit = "0000000";
  t.heads = 8;
  t.page_size = 64;
  t.n = n;
  t.L = L;
  for (const int32_t ni : n) {
    std::vector<double> row;
    for (const int64_t lj : L) row.push_back(f(ni, static_cast<double>(lj)));
    t.us.push_back(row);
  }
  return t;
}

inline std::vector<int32_t> default_n() {
  std::vector<int32_t> n;
  for (const int32_t b : kCostTableBudgets) n.push_back(b + 1);
  return n;
}

inline std::vector<int64_t> default_L() {
  return {kCostTablePrefixLens.begin(), kCostTablePrefixLens.end()};
}

// The cost shape verify has: a launch-bound floor plus work proportional to rows and to rows x L.
struct Affine {
  double a = 0, b = 0, c = 0, d = 0;  // C_v = a + b n + c L + d n L
  double operator()(double n, double L) const { return a + b * n + c * L + d * n * L; }
};

inline Affine random_affine(std::mt19937& rng) {
  return {uniform(rng, 5, 40), uniform(rng, 0, 0.5), uniform(rng, 0, 1e-3),
          uniform(rng, 1e-6, 1e-4)};
}

// Independent positive entries: not monotone, not smooth; the picker must not care.
inline CostTable random_table(std::mt19937& rng) {
  return make_table(default_n(), default_L(),
                    [&rng](double, double) { return uniform(rng, 1.0, 5000.0); });
}

// `count` path log-probabilities in pop order: non-increasing, <= 0, sometimes with a -inf tail
// (a draft whose top-K ran out of probability mass).
inline std::vector<double> random_scores(std::mt19937& rng, int count) {
  std::vector<double> s(static_cast<size_t>(count));
  const double scale = uniform(rng, 0.05, 4.0);  // confident to diffuse drafters
  for (auto& x : s) x = -scale * uniform(rng, 0.0, 6.0);
  std::sort(s.begin(), s.end(), std::greater<>());
  if (count > 0 && rng() % 4 == 0)
    std::fill(s.begin() + static_cast<std::ptrdiff_t>(rng() % count), s.end(), -INFINITY);
  return s;
}

// C_v on the table by a linear scan and the textbook bilinear formula.
inline double reference_interp(const CostTable& t, double n, double L) {
  auto cell = [](const auto& axis, double x, size_t& i, double& w) {
    i = 0;
    while (i + 1 < axis.size() && static_cast<double>(axis[i + 1]) <= x) ++i;
    if (i + 1 == axis.size()) {
      i = axis.size() >= 2 ? axis.size() - 2 : 0;
      w = axis.size() >= 2 ? 1.0 : 0.0;
      return;
    }
    w = (x - static_cast<double>(axis[i])) / static_cast<double>(axis[i + 1] - axis[i]);
  };
  size_t i = 0, j = 0;
  double u = 0, v = 0;
  cell(t.n, n, i, u);
  cell(t.L, L, j, v);
  auto at = [&](size_t a, size_t b) {
    return t.us[std::min(a, t.n.size() - 1)][std::min(b, t.L.size() - 1)];
  };
  return (1 - u) * (1 - v) * at(i, j) + (1 - u) * v * at(i, j + 1) + u * (1 - v) * at(i + 1, j) +
         u * v * at(i + 1, j + 1);
}

struct BruteResult {
  int32_t budget = -1;
  double tokens_per_s = -1;
  std::vector<double> rates;  // per candidate, in the given order
};

// Every candidate evaluated from scratch: E = 1 + sum of clamped probabilities, cost from `cv`.
inline BruteResult brute_force(const std::vector<int32_t>& candidates,
                               const std::vector<double>& scores, double calibration,
                               const RoundCost& cost, const std::function<double(int32_t)>& cv) {
  BruteResult r;
  for (const int32_t b : candidates) {
    double e = 1.0;
    for (int32_t i = 0; i < b; ++i) e += std::min(1.0, calibration * std::exp(scores[i]));
    const double round = cost.fixed_us + cost.per_node_us * (b + 1) + cost.layers * cv(b + 1);
    const double rate = e / round * 1e6;
    r.rates.push_back(rate);
    if (rate > r.tokens_per_s || (rate == r.tokens_per_s && b < r.budget)) {
      r.budget = b;
      r.tokens_per_s = rate;
    }
  }
  return r;
}

}  // namespace treemla::budget_test
