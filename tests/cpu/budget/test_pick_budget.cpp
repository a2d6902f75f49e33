// Budget picker: the expected-tokens model by hand, argument errors, agreement with a brute-force
// argmax over every candidate, the monotone responses the model guarantees (and the one it does
// not), and the DDTree prefix property the picker relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "cpu/budget/budget_test_util.h"
#include "treemla/budget.h"
#include "treemla/tree.h"

using namespace treemla;
using namespace treemla::budget_test;
using treemla::test::expect_error;

namespace {

TEST(PickBudget, ExpectedTokensByHand) {
  const std::vector<double> s = {std::log(0.5), std::log(0.25), -INFINITY};
  EXPECT_EQ(expected_tokens(s, 0), 1.0);
  EXPECT_DOUBLE_EQ(expected_tokens(s, 1), 1.5);
  EXPECT_DOUBLE_EQ(expected_tokens(s, 2), 1.75);
  EXPECT_DOUBLE_EQ(expected_tokens(s, 3), 1.75);      // -inf: probability 0
  EXPECT_DOUBLE_EQ(expected_tokens(s, 2, 2.0), 2.5);  // 2 * 0.5 = 1, 2 * 0.25 = 0.5
  EXPECT_DOUBLE_EQ(expected_tokens(s, 2, 4.0), 3.0);  // clamped to 1 each
  EXPECT_EQ(expected_tokens(s, 3, 0.0), 1.0);
  EXPECT_EQ(expected_tokens({}, 0), 1.0);
  expect_error([&] { expected_tokens(s, 4); }, {"budget = 4", "0..3", "path_logprobs.size()"});
  expect_error([&] { expected_tokens(s, -1); }, {"budget = -1"});
}

TEST(PickBudget, ScoreAndCalibrationErrors) {
  const CostTable t = make_table({1, 4}, {1024, 2048}, [](double n, double) { return n; });
  auto both = [&](const std::vector<double>& s, double calibration,
                  const std::vector<std::string>& parts) {
    expect_error([&] { expected_tokens(s, 0, calibration); }, parts);
    PickOptions o;
    o.calibration = calibration;
    expect_error([&] { pick_budget(t, s, 1024, {}, o); }, parts);
  };
  both({-0.1, NAN, -1, -2}, 1.0, {"path_logprobs[1] = nan", "<= 0, not NaN"});
  both({INFINITY, -1, -1, -2}, 1.0, {"path_logprobs[0] = inf"});
  both({-0.1, 0.5, -1, -2}, 1.0, {"path_logprobs[1] = 0.5", "log-probability"});
  both({-0.1, -0.2, -0.1, -2}, 1.0,
       {"path_logprobs[2] = -0.1", "<= path_logprobs[1] = -0.2", "never increase"});
  both({-0.1, -0.2, -0.3, -2}, -1.0, {"calibration = -1", "finite and >= 0"});
  both({-0.1, -0.2, -0.3, -2}, NAN, {"calibration = nan"});
  both({-0.1, -0.2, -0.3, -2}, INFINITY, {"calibration = inf"});
  EXPECT_NO_THROW(pick_budget(t, std::vector<double>{0, -1, -INFINITY, -INFINITY}, 1024, {}));
}

TEST(PickBudget, ArgumentErrors) {
  const CostTable t = make_table({1, 16, 64}, {1024, 4096}, Affine{10, 0, 0, 1e-3});
  const std::vector<double> s(40, -1.0);
  expect_error([&] { pick_budget(t, s, 512, {}); }, {"prefix_len = 512", "L range [1024, 4096]"});
  expect_error([&] { pick_budget(t, s, 8192, {}); }, {"prefix_len = 8192"});
  RoundCost c;
  c.layers = -3;
  expect_error([&] { pick_budget(t, s, 2048, c); }, {"cost.layers = -3"});
  c = {};
  c.per_node_us = -0.5;
  expect_error([&] { pick_budget(t, s, 2048, c); }, {"cost.per_node_us = -0.5"});
  c = {};
  c.fixed_us = -2;
  expect_error([&] { pick_budget(t, s, 2048, c); }, {"cost.fixed_us = -2"});

  PickOptions o;
  o.candidates = {0, 15, 41};
  expect_error([&] { pick_budget(t, s, 2048, {}, o); },
               {"options.candidates[2] = 41", "exceeds the 40 scored draft nodes"});
  o.candidates = {15, 64};
  expect_error([&] { pick_budget(t, s, 2048, {}, o); },
               {"options.candidates[1] = 64", "outside the cost table's budgets [0, 63]"});
  o.candidates = {-1};
  expect_error([&] { pick_budget(t, s, 2048, {}, o); }, {"options.candidates[0] = -1"});
  o.candidates = {15};
  o.every_budget = true;
  expect_error([&] { pick_budget(t, s, 2048, {}, o); }, {"every_budget", "exclusive"});

  CostTable from16 = t;
  from16.n = {16, 32, 64};
  const std::vector<double> three(3, -1.0);
  expect_error([&] { pick_budget(from16, three, 2048, {}); },
               {"smallest B = 15", "fits the 3 scored draft nodes"});
  PickOptions every;
  every.every_budget = true;
  expect_error([&] { pick_budget(from16, three, 2048, {}, every); }, {"smallest B = 15"});

  tree::DDTree bad;
  bad.parents = {-1, 0};
  bad.scores = {0.0};
  expect_error([&] { pick_budget(t, bad, 2048, {}); },
               {"tree.scores has 1 entries", "tree.size() = 2"});
}

TEST(PickBudget, HandCases) {
  // Per-layer cost 10, 20, 80 us for B = 0, 15, 63; fifteen sure nodes, then nothing.
  const CostTable t = make_table({1, 16, 64}, {1024}, [](double n, double) {
    return n == 1 ? 10.0 : n == 16 ? 20.0 : 80.0;
  });
  std::vector<double> s(63, -INFINITY);
  std::fill(s.begin(), s.begin() + 15, 0.0);
  PickOptions o;
  o.report_all = true;
  BudgetChoice c = pick_budget(t, s, 1024, {}, o);
  EXPECT_EQ(c.best.budget, 15);  // rates 1/10, 16/20, 16/80 tokens per us
  EXPECT_DOUBLE_EQ(c.best.expected_tokens, 16.0);
  EXPECT_DOUBLE_EQ(c.best.round_us, 20.0);
  EXPECT_DOUBLE_EQ(c.best.tokens_per_s, 0.8e6);
  ASSERT_EQ(c.all.size(), 3u);
  EXPECT_EQ(c.all[0].budget, 0);
  EXPECT_EQ(c.all[2].budget, 63);
  EXPECT_DOUBLE_EQ(c.all[2].tokens_per_s, 0.2e6);

  // 78 layers and the outside cost: 1000 + 5 n + 78 C_v.
  RoundCost rc{78, 1000.0, 5.0};
  c = pick_budget(t, s, 1024, rc, o);
  EXPECT_DOUBLE_EQ(c.all[1].verify_us, 78 * 20.0);
  EXPECT_DOUBLE_EQ(c.all[1].round_us, 1000 + 5 * 16 + 78 * 20.0);

  // Nothing can be accepted: every budget gives 1 token, the cheapest round wins.
  const std::vector<double> none(63, -INFINITY);
  EXPECT_EQ(pick_budget(t, none, 1024, {}).best.budget, 0);
  // A flat table and equal rates: the tie goes to the smaller tree.
  const CostTable flat = make_table({1, 16, 64}, {1024}, [](double, double) { return 50.0; });
  EXPECT_EQ(pick_budget(flat, none, 1024, {}).best.budget, 0);
  // Calibration 0 believes nothing either.
  PickOptions zero;
  zero.calibration = 0.0;
  EXPECT_EQ(pick_budget(flat, s, 1024, {}, zero).best.budget, 0);
  // Without report_all the list stays empty.
  EXPECT_TRUE(pick_budget(t, s, 1024, {}).all.empty());
  // Explicit candidates, in any order, duplicates ignored.
  o.candidates = {63, 0, 63};
  c = pick_budget(t, s, 1024, {}, o);
  ASSERT_EQ(c.all.size(), 2u);
  EXPECT_EQ(c.best.budget, 63);  // 16/80 beats 1/10
}

// The picker against a brute force over the same candidates, on random tables (analytic and
// arbitrary), random scores, costs, calibrations and candidate sets.
TEST(PickBudget, MatchesBruteForce) {
  const uint32_t seed = 20261201;
  std::mt19937 rng(seed);
  int near_ties = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::string ctx = "seed " + std::to_string(seed) + " trial " + std::to_string(trial);
    SCOPED_TRACE(ctx);
    const bool affine = trial % 2 == 0;
    const Affine f = random_affine(rng);
    const CostTable t = affine ? make_table(default_n(), default_L(), f) : random_table(rng);
    const int count = static_cast<int>(rng() % (trial % 5 == 0 ? 100 : 1024));
    const std::vector<double> s = random_scores(rng, count);
    const int64_t L = trial % 3 == 0 ? t.L[rng() % t.L.size()]
                                     : static_cast<int64_t>(1024 + rng() % (262144 - 1024 + 1));
    const auto layers = static_cast<int32_t>(1 + rng() % 80);
    RoundCost cost{layers, uniform(rng, 0, 5000), uniform(rng, 0, 50)};
    PickOptions o;
    o.report_all = true;
    o.calibration = trial % 4 == 0 ? 1.0 : uniform(rng, 0.0, 3.0);
    std::vector<int32_t> cands;
    switch (trial % 3) {
      case 0:  // the table's grid
        for (const int32_t n : t.n)
          if (n - 1 <= count) cands.push_back(n - 1);
        break;
      case 1:  // every budget
        o.every_budget = true;
        cands.resize(static_cast<size_t>(std::min(count, 1023)) + 1);
        std::iota(cands.begin(), cands.end(), 0);
        break;
      default:  // a random set
        for (int k = 0; k < 6; ++k) cands.push_back(static_cast<int32_t>(rng() % (count + 1)));
        o.candidates = cands;
        std::sort(cands.begin(), cands.end());
        cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
    }
    auto cv = [&](int32_t n) {
      return affine ? f(n, static_cast<double>(L)) : reference_interp(t, n, static_cast<double>(L));
    };
    const BruteResult want = brute_force(cands, s, o.calibration, cost, cv);
    const BudgetChoice got = pick_budget(t, s, L, cost, o);

    EXPECT_NEAR(got.best.tokens_per_s, want.tokens_per_s, 1e-12 * want.tokens_per_s);
    if (got.best.budget != want.budget) {
      // Only a tie within rounding may pick another budget.
      const auto k = std::find(cands.begin(), cands.end(), got.best.budget) - cands.begin();
      ASSERT_LT(static_cast<size_t>(k), cands.size()) << "picked B " << got.best.budget;
      EXPECT_NEAR(want.rates[k], want.tokens_per_s, 1e-12 * want.tokens_per_s)
          << "picked B " << got.best.budget << ", brute force B " << want.budget;
      ++near_ties;
    }
    ASSERT_EQ(got.all.size(), cands.size());
    for (size_t k = 0; k < cands.size(); ++k) {
      const BudgetPoint& p = got.all[k];
      EXPECT_EQ(p.budget, cands[k]);
      EXPECT_NEAR(p.tokens_per_s, want.rates[k], 1e-12 * want.rates[k]) << "B " << p.budget;
      EXPECT_EQ(p.expected_tokens, expected_tokens(s, p.budget, o.calibration)) << "B " << p.budget;
      EXPECT_NEAR(p.round_us, round_cost_us(t, p.budget, L, cost), 1e-12 * p.round_us);
    }
  }
  EXPECT_LE(near_ties, 4) << "seed " << seed;
}

struct MonotoneCase {
  CostTable table;
  std::vector<double> scores;
  int64_t L = 0;
  RoundCost cost;
  PickOptions options;
};

MonotoneCase random_case(std::mt19937& rng, bool affine) {
  MonotoneCase m;
  m.table = affine ? make_table(default_n(), default_L(), random_affine(rng)) : random_table(rng);
  m.scores = random_scores(rng, 1023);
  m.L = static_cast<int64_t>(1024 + rng() % (262144 - 1024 + 1));
  m.cost = {static_cast<int32_t>(1 + rng() % 80), uniform(rng, 0, 3000), uniform(rng, 0, 20)};
  m.options.calibration = uniform(rng, 0.2, 2.5);
  m.options.every_budget = rng() % 2 == 0;
  return m;
}

// A larger per-node cost adds a cost proportional to 1 + B; since every p_i <= 1 and the p_i do
// not increase, (1 + B) / E[tokens](B) never decreases, so the best B can only shrink.
TEST(PickBudget, LargerPerNodeCostNeverPicksLargerBudget) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    MonotoneCase m = random_case(rng, trial % 2 == 0);
    int32_t prev = tree::kMaxBudget + 1;
    for (const double per_node : {0.0, 0.1, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0}) {
      m.cost.per_node_us = per_node;
      const int32_t b = pick_budget(m.table, m.scores, m.L, m.cost, m.options).best.budget;
      EXPECT_LE(b, prev) << "seed " << seed << " trial " << trial << " per_node_us " << per_node;
      prev = b;
    }
  }
}

// A larger fixed cost adds the same to every budget; E[tokens] never decreases in B, so the best
// B can only grow (the fixed cost is shared by more tokens).
TEST(PickBudget, LargerFixedCostNeverPicksSmallerBudget) {
  const uint32_t seed = 78;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    MonotoneCase m = random_case(rng, trial % 2 == 0);
    int32_t prev = -1;
    for (const double fixed : {0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6}) {
      m.cost.fixed_us = fixed;
      const int32_t b = pick_budget(m.table, m.scores, m.L, m.cost, m.options).best.budget;
      EXPECT_GE(b, prev) << "seed " << seed << " trial " << trial << " fixed_us " << fixed;
      prev = b;
    }
  }
}

CostTable scaled(const CostTable& t, double s) {
  CostTable out = t;
  for (auto& row : out.us)
    for (auto& v : row) v *= s;
  return out;
}

// A costlier verify never picks a larger B when verify cost per expected token, C_v / E[tokens],
// does not decrease in B over the candidates. Tables proportional to n (no size-independent
// floor) always qualify; for others the test checks the condition first.
TEST(PickBudget, CostlierVerifyNeverPicksLargerBudget) {
  const uint32_t seed = 79;
  std::mt19937 rng(seed);
  int checked = 0;
  for (int trial = 0; trial < 90; ++trial) {
    MonotoneCase m = random_case(rng, true);
    if (trial % 3 == 0) {  // proportional to n: C_v = n (b + d L)
      const double b = uniform(rng, 0.01, 0.5), d = uniform(rng, 1e-6, 1e-4);
      m.table = make_table(default_n(), default_L(),
                           [b, d](double n, double L) { return n * (b + d * L); });
    }
    m.options.report_all = true;
    const BudgetChoice base = pick_budget(m.table, m.scores, m.L, m.cost, m.options);
    bool qualifies = true;
    // Within rounding: where every p_i is 1, C_v / E[tokens] is constant up to the last bit.
    for (size_t k = 1; k < base.all.size(); ++k)
      qualifies &= base.all[k].verify_us / base.all[k].expected_tokens >=
                   (1 - 1e-12) * base.all[k - 1].verify_us / base.all[k - 1].expected_tokens;
    if (trial % 3 == 0) EXPECT_TRUE(qualifies) << "seed " << seed << " trial " << trial;
    if (!qualifies) continue;
    ++checked;
    int32_t prev = base.best.budget;
    for (const double s : {1.25, 2.0, 4.0, 10.0, 100.0}) {
      const BudgetChoice c = pick_budget(scaled(m.table, s), m.scores, m.L, m.cost, m.options);
      if (c.best.budget > prev) {  // only a tie within rounding may do that
        const auto at_prev = std::find_if(
            c.all.begin(), c.all.end(), [prev](const BudgetPoint& p) { return p.budget == prev; });
        ASSERT_NE(at_prev, c.all.end());
        EXPECT_NEAR(at_prev->tokens_per_s, c.best.tokens_per_s, 1e-12 * c.best.tokens_per_s)
            << "seed " << seed << " trial " << trial << " scale " << s << " B " << c.best.budget
            << " > " << prev;
      }
      prev = c.best.budget;
    }
  }
  EXPECT_GE(checked, 20) << "seed " << seed;
}

// The case the rule above excludes: a verify cost that does not grow with n (launch-bound, small L)
// acts like a fixed cost, so scaling it up makes the larger tree pay off.
TEST(PickBudget, CostlierFlatVerifyCanPickLargerBudget) {
  const std::vector<double> s(15, std::log(0.1));  // E[tokens] = 1 for B = 0, 2.5 for B = 15
  const RoundCost cost{1, 0.0, 10.0};
  const CostTable cheap = make_table({1, 16}, {1024}, [](double, double) { return 10.0; });
  // B = 0: 1 / 20; B = 15: 2.5 / 170.
  EXPECT_EQ(pick_budget(cheap, s, 1024, cost).best.budget, 0);
  // B = 0: 1 / 1010; B = 15: 2.5 / 1160.
  EXPECT_EQ(pick_budget(scaled(cheap, 100.0), s, 1024, cost).best.budget, 15);
}

// Random drafts: top-K of a random distribution per depth, distinct tokens.
std::vector<float> random_draft(std::mt19937& rng, int D, int K, std::vector<int32_t>& tokens) {
  std::vector<float> lp;
  tokens.clear();
  for (int d = 0; d < D; ++d) {
    std::vector<double> w(static_cast<size_t>(K) + 4);
    for (auto& x : w) x = std::exp(uniform(rng, 0.0, 5.0));
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    std::sort(w.begin(), w.end(), std::greater<>());
    for (int r = 0; r < K; ++r) {
      lp.push_back(static_cast<float>(std::log(w[r] / sum)));
      tokens.push_back(d * 1000 + static_cast<int32_t>(rng() % 10) * 100 + r);
    }
  }
  return lp;
}

// build_ddtree's pop order makes the budget-B tree a prefix of any larger one, which is what lets
// the picker score once with the largest budget and truncate; its scores are what the picker
// takes.
TEST(PickBudget, DDTreePrefixProperty) {
  const uint32_t seed = 4242;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 12; ++trial) {
    const int D = 1 + static_cast<int>(rng() % 15), K = 1 + static_cast<int>(rng() % 8);
    std::vector<int32_t> tokens;
    const std::vector<float> lp = random_draft(rng, D, K, tokens);
    const tree::DraftTopK draft{D, K, tokens, lp};
    const tree::DDTree full = tree::build_ddtree(draft, 7, tree::kMaxBudget - 1, D);
    const int32_t max_b = full.size() - 1;
    for (int32_t b : {1, 15, 31, 63, 255, 1023, static_cast<int32_t>(1 + rng() % 1023)}) {
      b = std::min(b, max_b);
      SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) + " D " +
                   std::to_string(D) + " K " + std::to_string(K) + " B " + std::to_string(b));
      const tree::DDTree want = tree::build_ddtree(draft, 7, b, D);
      const tree::DDTree got = truncate_ddtree(full, b);
      EXPECT_EQ(got.parents, want.parents);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.depths, want.depths);
      EXPECT_EQ(got.ranks, want.ranks);
      EXPECT_EQ(got.scores, want.scores);
    }
    EXPECT_EQ(truncate_ddtree(full, 0).parents, std::vector<int32_t>{-1});
    // The builder's scores pass the picker's checks, and both overloads agree.
    const CostTable t = make_table(default_n(), default_L(), random_affine(rng));
    PickOptions o;
    o.every_budget = true;
    const RoundCost cost{78, 2000.0, 8.0};
    const BudgetChoice a = pick_budget(t, full, 65536, cost, o);
    const BudgetChoice b = pick_budget(t, std::span(full.scores).subspan(1), 65536, cost, o);
    EXPECT_EQ(a.best.budget, b.best.budget);
    EXPECT_EQ(a.best.tokens_per_s, b.best.tokens_per_s);
  }
  tree::DDTree t;
  t.parents = {-1, 0, 0};
  t.tokens = {1, 2, 3};
  t.depths = {0, 1, 1};
  t.ranks = {-1, 0, 1};
  t.scores = {0.0, -0.1, -0.2};
  expect_error([&] { truncate_ddtree(t, 3); }, {"budget = 3", "0..2"});
  expect_error([&] { truncate_ddtree(t, -1); }, {"budget = -1"});
  t.ranks.pop_back();
  expect_error([&] { truncate_ddtree(t, 1); }, {"3, 3, 3, 2, 3", "tree.size()"});
}

}  // namespace
