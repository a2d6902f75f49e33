// Cost table: validation errors name the field and the bound; interpolation is exact at grid
// points, reproduces the affine-in-(n, L, nL) cost, stays monotone between neighbours, matches an
// independent bilinear formula, and refuses to extrapolate.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "common/expect_error.h"
#include "cpu/budget/budget_test_util.h"
#include "treemla/budget.h"

using namespace treemla;
using namespace treemla::budget_test;
using treemla::test::expect_error;

namespace {

CostTable small_table() {
  return make_table({1, 16, 64}, {1024, 4096, 16384},
                    [](double n, double L) { return 10.0 + 0.01 * n * L; });
}

TEST(CostTable, DefaultGridIsTheIssueGrid) {
  EXPECT_EQ(kCostTableBudgets.front(), 0);
  EXPECT_EQ(kCostTableBudgets.back(), tree::kMaxBudget - 1);
  EXPECT_EQ(kCostTablePrefixLens.front(), 1024);
  EXPECT_EQ(kCostTablePrefixLens.back(), 262144);
  for (size_t j = 1; j < kCostTablePrefixLens.size(); ++j)
    EXPECT_EQ(kCostTablePrefixLens[j], 2 * kCostTablePrefixLens[j - 1]);
  const CostTable t = make_table(default_n(), default_L(), Affine{1, 1, 1, 1});
  EXPECT_NO_THROW(validate_cost_table(t));
  EXPECT_EQ(t.min_budget(), 0);
  EXPECT_EQ(t.max_budget(), 1023);
}

TEST(CostTable, ValidationNamesFieldAndBound) {
  auto broken = [](const std::function<void(CostTable&)>& edit,
                   const std::vector<std::string>& parts) {
    CostTable t = small_table();
    edit(t);
    expect_error([&] { validate_cost_table(t); }, parts);
  };
  broken([](CostTable& t) { t.heads = 0; }, {"heads = 0", "1..128"});
  broken([](CostTable& t) { t.heads = 129; }, {"heads = 129"});
  broken([](CostTable& t) { t.page_size = 48; }, {"page_size = 48", "power of two"});
  broken([](CostTable& t) { t.page_size = 0; }, {"page_size = 0"});
  broken([](CostTable& t) { t.n.clear(); }, {"n is empty"});
  broken([](CostTable& t) { t.L.clear(); }, {"L is empty"});
  broken([](CostTable& t) { t.n[0] = 0; }, {"n[0] = 0", ">= 1"});
  broken([](CostTable& t) { t.n[2] = 16; }, {"n[2] = 16", "> n[1] = 16", "strictly increases"});
  broken([](CostTable& t) { t.n[2] = 1026; }, {"n[2] = 1026", "<= 1025"});
  broken([](CostTable& t) { t.L[0] = -1; }, {"L[0] = -1", ">= 0"});
  broken([](CostTable& t) { t.L[1] = 512; }, {"L[1] = 512", "> L[0] = 1024"});
  broken([](CostTable& t) { t.us.pop_back(); }, {"us has 2 rows", "n.size() = 3"});
  broken([](CostTable& t) { t.us[1].push_back(1.0); }, {"us[1] has 4 entries", "L.size() = 3"});
  broken([](CostTable& t) { t.us[2][1] = NAN; },
         {"us[2][1] = nan", "n = 64", "L = 4096", "finite and > 0"});
  broken([](CostTable& t) { t.us[0][0] = INFINITY; }, {"us[0][0] = inf"});
  broken([](CostTable& t) { t.us[1][2] = 0.0; }, {"us[1][2] = 0", "> 0"});
  broken([](CostTable& t) { t.us[1][0] = -5.0; }, {"us[1][0] = -5"});
  // Every entry point validates the table.
  CostTable t = small_table();
  t.us[0][0] = -1.0;
  expect_error([&] { verify_cost_us(t, 16, 2048); }, {"us[0][0] = -1"});
  expect_error([&] { round_cost_us(t, 15, 2048, {}); }, {"us[0][0] = -1"});
  const std::vector<double> scores(63, -1.0);
  expect_error([&] { pick_budget(t, scores, 2048, {}); }, {"us[0][0] = -1"});
}

TEST(CostTable, ExactAtGridPoints) {
  const uint32_t seed = 17;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    const CostTable t = random_table(rng);
    for (size_t i = 0; i < t.n.size(); ++i)
      for (size_t j = 0; j < t.L.size(); ++j)
        EXPECT_EQ(verify_cost_us(t, t.n[i], t.L[j]), t.us[i][j]);
  }
}

TEST(CostTable, ReproducesAffineCostOffGrid) {
  const uint32_t seed = 5;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const Affine f = random_affine(rng);
    const CostTable t = make_table(default_n(), default_L(), f);
    const auto n = static_cast<int32_t>(1 + rng() % tree::kMaxBudget);
    const auto L = static_cast<int64_t>(1024 + rng() % (262144 - 1024 + 1));
    const double got = verify_cost_us(t, n, L);
    EXPECT_NEAR(got, f(n, static_cast<double>(L)), 1e-12 * got)
        << "seed " << seed << " trial " << trial << " n " << n << " L " << L;
  }
}

TEST(CostTable, MatchesIndependentBilinearFormula) {
  const uint32_t seed = 23;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const CostTable t = random_table(rng);
    const auto n = static_cast<int32_t>(1 + rng() % kMaxTreeNodes);
    const auto L = static_cast<int64_t>(1024 + rng() % (262144 - 1024 + 1));
    const double got = verify_cost_us(t, n, L);
    EXPECT_NEAR(got, reference_interp(t, n, static_cast<double>(L)), 1e-12 * got)
        << "seed " << seed << " trial " << trial << " n " << n << " L " << L;
  }
}

// Between two neighbouring grid points the value moves monotonically from one to the other, along
// L (for every n row) and along n (at every L column).
TEST(CostTable, MonotoneBetweenNeighbours) {
  const uint32_t seed = 31;
  std::mt19937 rng(seed);
  const CostTable t = random_table(rng);
  auto check_run = [](const std::vector<double>& v, const std::string& where) {
    const double tol = 1e-12 * std::max(std::abs(v.front()), std::abs(v.back()));
    const double dir = v.back() >= v.front() ? 1.0 : -1.0;
    for (size_t k = 1; k < v.size(); ++k)
      ASSERT_GE(dir * (v[k] - v[k - 1]), -tol) << where << " step " << k << " (seed 31)";
  };
  for (size_t i = 0; i < t.n.size(); ++i)
    for (size_t j = 0; j + 1 < t.L.size(); ++j) {
      std::vector<double> v;
      for (int64_t L = t.L[j]; L <= t.L[j + 1]; L += (t.L[j + 1] - t.L[j]) / 64)
        v.push_back(verify_cost_us(t, t.n[i], L));
      EXPECT_EQ(v.front(), t.us[i][j]);
      EXPECT_EQ(v.back(), t.us[i][j + 1]);
      check_run(v, "n row " + std::to_string(i) + " L cell " + std::to_string(j));
    }
  for (size_t j = 0; j < t.L.size(); ++j)
    for (size_t i = 0; i + 1 < t.n.size(); ++i) {
      std::vector<double> v;
      for (int32_t n = t.n[i]; n <= t.n[i + 1]; ++n) v.push_back(verify_cost_us(t, n, t.L[j]));
      EXPECT_EQ(v.back(), t.us[i + 1][j]);
      check_run(v, "L column " + std::to_string(j) + " n cell " + std::to_string(i));
    }
}

TEST(CostTable, NoExtrapolation) {
  const CostTable t = small_table();
  expect_error([&] { verify_cost_us(t, 16, 1023); },
               {"prefix_len = 1023", "L range [1024, 16384]", "no extrapolation"});
  expect_error([&] { verify_cost_us(t, 16, 16385); }, {"prefix_len = 16385", "[1024, 16384]"});
  expect_error([&] { verify_cost_us(t, 65, 2048); },
               {"n = 65", "n range [1, 64]", "B = n - 1 in [0, 63]"});
  expect_error([&] { verify_cost_us(t, 0, 2048); }, {"n = 0", "[1, 64]"});
  CostTable from16 = small_table();
  from16.n = {16, 32, 64};
  expect_error([&] { verify_cost_us(from16, 1, 2048); }, {"n = 1", "[16, 64]"});
  EXPECT_NO_THROW(verify_cost_us(t, 1, 1024));
  EXPECT_NO_THROW(verify_cost_us(t, 64, 16384));
}

TEST(CostTable, SinglePointAxes) {
  const CostTable t = make_table({65}, {131072}, [](double, double) { return 785.8; });
  EXPECT_EQ(verify_cost_us(t, 65, 131072), 785.8);
  expect_error([&] { verify_cost_us(t, 64, 131072); }, {"n = 64", "[65, 65]"});
  expect_error([&] { verify_cost_us(t, 65, 131073); }, {"prefix_len = 131073", "[131072, 131072]"});
  const CostTable row = make_table({1, 65}, {4096}, [](double n, double) { return 2.0 * n; });
  EXPECT_DOUBLE_EQ(verify_cost_us(row, 33, 4096), 66.0);
}

TEST(CostTable, RoundCost) {
  const CostTable t = small_table();
  RoundCost c;
  c.layers = 78;
  c.fixed_us = 1500;
  c.per_node_us = 12.5;
  // n = 16 at a grid L: 10 + 0.01 * 16 * 4096 per layer.
  EXPECT_DOUBLE_EQ(round_cost_us(t, 15, 4096, c), 1500 + 12.5 * 16 + 78 * (10 + 0.01 * 16 * 4096));
  expect_error([&] { round_cost_us(t, -1, 4096, c); }, {"budget = -1", "0..1024"});
  expect_error([&] { round_cost_us(t, 64, 4096, c); }, {"n = 65", "[1, 64]"});
  RoundCost bad = c;
  bad.layers = 0;
  expect_error([&] { round_cost_us(t, 15, 4096, bad); }, {"cost.layers = 0", ">= 1"});
  bad = c;
  bad.fixed_us = -1;
  expect_error([&] { round_cost_us(t, 15, 4096, bad); }, {"cost.fixed_us = -1", "finite and >= 0"});
  bad = c;
  bad.per_node_us = NAN;
  expect_error([&] { round_cost_us(t, 15, 4096, bad); }, {"cost.per_node_us = nan"});
  bad = c;
  bad.fixed_us = INFINITY;
  expect_error([&] { round_cost_us(t, 15, 4096, bad); }, {"cost.fixed_us = inf"});
}

}  // namespace
