// DDTree builder: argument checks, hand cases, structural properties over random drafts, the
// global pop order, and optimality against a brute force over all prefix-closed trees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "treemla/error.h"
#include "treemla/tree.h"

using namespace treemla;
using namespace treemla::tree;

namespace {

struct Draft {
  int D = 0, K = 0;
  std::vector<int32_t> tokens;
  std::vector<float> lp;
  DraftTopK view() const { return {D, K, tokens, lp}; }
  double at(int depth, int rank) const { return lp[static_cast<size_t>(depth - 1) * K + rank]; }
};

enum class LpMode { kRandom, kTies, kNegInf };

// Per depth: K distinct tokens and sorted log-probs. kRandom: top-K of a random distribution
// over K + 8 outcomes. kTies: values from {0, -0.5, .., -2.5}, exact in float and in double sums,
// so equal scores really tie. kNegInf: random, with a -inf tail in some rows.
Draft make_draft(int D, int K, LpMode mode, std::mt19937& rng) {
  Draft d;
  d.D = D;
  d.K = K;
  std::vector<int32_t> vocab(std::max(4 * K, 50));
  std::iota(vocab.begin(), vocab.end(), 0);
  for (int depth = 0; depth < D; ++depth) {
    std::shuffle(vocab.begin(), vocab.end(), rng);
    d.tokens.insert(d.tokens.end(), vocab.begin(), vocab.begin() + K);
    std::vector<float> row(K);
    if (mode == LpMode::kTies) {
      for (auto& x : row) x = -0.5f * static_cast<float>(rng() % 6);
    } else {
      std::vector<double> w(K + 8);
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(4.0 * std::generate_canonical<double, 53>(rng)));
      std::sort(w.begin(), w.end(), std::greater<>());
      for (int r = 0; r < K; ++r) row[r] = static_cast<float>(std::log(w[r] / sum));
      if (mode == LpMode::kNegInf && rng() % 2)
        for (int r = static_cast<int>(rng() % K); r < K; ++r) row[r] = -INFINITY;
    }
    std::sort(row.begin(), row.end(), std::greater<>());
    d.lp.insert(d.lp.end(), row.begin(), row.end());
  }
  return d;
}

using Ranks = std::vector<int32_t>;

double path_score(const Draft& d, const Ranks& r) {
  double s = 0;  // the documented summation order: depth 1 first
  for (size_t k = 0; k < r.size(); ++k) s += d.at(static_cast<int>(k) + 1, r[k]);
  return s;
}

// The documented total order: higher score, then shorter, then lexicographically smaller ranks.
bool before(double sa, const Ranks& a, double sb, const Ranks& b) {
  if (sa != sb) return sa > sb;
  if (a.size() != b.size()) return a.size() < b.size();
  return a < b;
}

Ranks node_ranks(const DDTree& t, int i) {
  Ranks r;
  for (; i > 0; i = t.parents[i]) r.push_back(t.ranks[i]);
  std::reverse(r.begin(), r.end());
  return r;
}

int64_t num_paths(int K, int D) {
  int64_t total = 0, level = 1;
  for (int d = 1; d <= D; ++d) {
    level = std::min<int64_t>(level * K, int64_t{1} << 40);
    total += level;
  }
  return total;
}

using test::expect_error;

// Every property the builder promises; `ctx` goes into failure messages.
void check_tree(const Draft& d, int budget, const DDTree& t, const std::string& ctx) {
  SCOPED_TRACE(ctx);
  const int64_t expect_n = 1 + std::min<int64_t>(budget, num_paths(d.K, d.D));
  ASSERT_EQ(t.size(), expect_n);
  ASSERT_EQ(t.tokens.size(), t.parents.size());
  ASSERT_EQ(t.depths.size(), t.parents.size());
  ASSERT_EQ(t.ranks.size(), t.parents.size());
  ASSERT_EQ(t.scores.size(), t.parents.size());
  ASSERT_NO_THROW(validate_parents(t.parents));
  ASSERT_EQ(t.depths[0], 0);
  ASSERT_EQ(t.ranks[0], -1);
  ASSERT_EQ(t.scores[0], 0.0);
  std::vector<std::vector<int32_t>> child_ranks(t.size());
  std::vector<Ranks> paths(t.size());
  for (int i = 1; i < t.size(); ++i) {
    const int p = t.parents[i];
    ASSERT_LT(p, i) << "node " << i;
    ASSERT_EQ(t.depths[i], t.depths[p] + 1) << "node " << i;
    ASSERT_LE(t.depths[i], d.D) << "node " << i;
    ASSERT_GE(t.ranks[i], 0);
    ASSERT_LT(t.ranks[i], d.K);
    ASSERT_EQ(t.tokens[i], d.tokens[(t.depths[i] - 1) * d.K + t.ranks[i]]) << "node " << i;
    paths[i] = node_ranks(t, i);
    ASSERT_EQ(t.scores[i], path_score(d, paths[i])) << "node " << i;  // bit-exact, same order
    // Siblings appear in rank order 0, 1, 2, ..: each node's previous sibling came before it.
    ASSERT_EQ(t.ranks[i], static_cast<int>(child_ranks[p].size())) << "node " << i;
    child_ranks[p].push_back(t.ranks[i]);
    if (i >= 2) {
      ASSERT_TRUE(before(t.scores[i - 1], paths[i - 1], t.scores[i], paths[i]))
          << "pop order broken at node " << i;
    }
  }
  // Optimality in the total order: every path outside the tree whose parent path is inside (the
  // boundary; any other outside path comes after its boundary ancestor) follows the last node.
  const int last = t.size() - 1;
  for (int u = 0; u < t.size(); ++u) {
    if (t.depths[u] == d.D) continue;
    for (int r = static_cast<int>(child_ranks[u].size()); r < d.K; ++r) {
      Ranks y = paths[u];
      y.push_back(r);
      ASSERT_TRUE(before(t.scores[last], paths[last], path_score(d, y), y))
          << "boundary path below node " << u << " rank " << r << " beats the last node";
    }
  }
}

// All paths of the draft's full tree, in the documented total order.
std::vector<Ranks> sorted_paths(const Draft& d) {
  std::vector<std::pair<double, Ranks>> all;
  Ranks cur;
  std::function<void()> rec = [&] {
    if (!cur.empty()) all.push_back({path_score(d, cur), cur});
    if (static_cast<int>(cur.size()) == d.D) return;
    for (int r = 0; r < d.K; ++r) {
      cur.push_back(r);
      rec();
      cur.pop_back();
    }
  };
  rec();
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return before(a.first, a.second, b.first, b.second);
  });
  std::vector<Ranks> out;
  for (auto& x : all) out.push_back(x.second);
  return out;
}

// Brute force: the largest sum of exp(score) over prefix-closed sets of exactly `budget` paths;
// `count` receives the number of such sets.
double brute_force_best(const Draft& d, int budget, int64_t* count) {
  std::vector<double> weight;
  std::vector<std::vector<int>> children;
  std::vector<int> roots;
  std::function<int(Ranks&)> add = [&](Ranks& r) {
    const int id = static_cast<int>(weight.size());
    weight.push_back(std::exp(path_score(d, r)));
    children.emplace_back();
    if (static_cast<int>(r.size()) < d.D) {
      for (int k = 0; k < d.K; ++k) {
        r.push_back(k);
        const int c = add(r);
        children[id].push_back(c);
        r.pop_back();
      }
    }
    return id;
  };
  for (int k = 0; k < d.K; ++k) {
    Ranks r = {k};
    roots.push_back(add(r));
  }
  double best = -1;
  *count = 0;
  // Each set is reached once: the frontier's last entry is either taken (its children join the
  // frontier) or excluded for good together with its whole subtree.
  std::function<void(std::vector<int>, int, double)> rec = [&](std::vector<int> frontier, int taken,
                                                               double sum) {
    if (taken == budget) {
      ++*count;
      best = std::max(best, sum);
      return;
    }
    if (frontier.empty()) return;
    const int f = frontier.back();
    frontier.pop_back();
    std::vector<int> with = frontier;
    with.insert(with.end(), children[f].begin(), children[f].end());
    rec(with, taken + 1, sum + weight[f]);
    rec(frontier, taken, sum);
  };
  rec(roots, 0, 0.0);
  return best;
}

}  // namespace

TEST(DDTree, HandExample) {
  // Depth 1: p = .6, .4; depth 2: p = .7, .3. Paths by probability: (0) .6, (0,0) .42, (1) .4,
  // (1,0) .28, (0,1) .18, (1,1) .12.
  Draft d{2, 2, {10, 11, 20, 21}, {std::log(0.6f), std::log(0.4f), std::log(0.7f), std::log(0.3f)}};
  const DDTree t = build_ddtree(d.view(), 99, 4);
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, 0, 3}));
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{99, 10, 20, 11, 20}));
  EXPECT_EQ(t.depths, (std::vector<int32_t>{0, 1, 2, 1, 2}));
  EXPECT_EQ(t.ranks, (std::vector<int32_t>{-1, 0, 0, 1, 0}));
  EXPECT_NEAR(std::exp(t.scores[4]), 0.28, 1e-6);
  // A budget above the 6 paths returns the full tree (the heap empties).
  const DDTree full = build_ddtree(d.view(), 99, 10);
  EXPECT_EQ(full.parents, (std::vector<int32_t>{-1, 0, 1, 0, 3, 1, 3}));
  const DDTree one = build_ddtree(d.view(), 7, 1);
  EXPECT_EQ(one.parents, (std::vector<int32_t>{-1, 0}));
  EXPECT_EQ(one.tokens, (std::vector<int32_t>{7, 10}));
}

TEST(DDTree, TiesBreakByDepthThenRanks) {
  // All log-probs 0: every path scores 0, so the order is by depth, then lexicographic ranks.
  Draft d{2, 2, {1, 2, 3, 4}, {0.f, 0.f, 0.f, 0.f}};
  const DDTree t = build_ddtree(d.view(), 0, 6);
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.ranks, (std::vector<int32_t>{-1, 0, 1, 0, 1, 0, 1}));
  // Equal scores across depths: (0) = -1, (1) = -2, (0,0) = -2: (1) is shallower, pops first.
  Draft e{2, 2, {1, 2, 3, 4}, {-1.f, -2.f, -1.f, -3.f}};
  const DDTree u = build_ddtree(e.view(), 0, 3);
  EXPECT_EQ(u.ranks, (std::vector<int32_t>{-1, 0, 1, 0}));
  EXPECT_EQ(u.parents, (std::vector<int32_t>{-1, 0, 0, 1}));
}

TEST(DDTree, ArgumentErrors) {
  Draft d{2, 2, {10, 11, 20, 21}, {-0.1f, -0.2f, -0.3f, -0.4f}};
  expect_error([&] { build_ddtree(d.view(), 0, 0); }, {"budget = 0", "1..1024"});
  expect_error([&] { build_ddtree(d.view(), 0, 1025); }, {"budget = 1025", "1..1024"});
  expect_error([&] { build_ddtree(d.view(), -1, 4); }, {"bonus_token = -1"});
  expect_error([&] { build_ddtree(d.view(), 0, 4, 0); }, {"max_depth = 0"});
  expect_error([&] { build_ddtree(d.view(), 0, 4, 1); }, {"draft.num_depths = 2", "max_depth = 1"});
  auto bad = d;
  bad.K = 0;
  expect_error([&] { build_ddtree(bad.view(), 0, 4); }, {"draft.top_k = 0", ">= 1"});
  bad = d;
  bad.tokens.pop_back();
  expect_error([&] { build_ddtree(bad.view(), 0, 4); }, {"draft.tokens has 3", "2 * 2 = 4"});
  bad = d;
  bad.lp.push_back(-1.f);
  expect_error([&] { build_ddtree(bad.view(), 0, 4); }, {"draft.log_probs has 5"});
  bad = d;
  bad.lp[2] = 0.5f;
  expect_error([&] { build_ddtree(bad.view(), 0, 4); },
               {"draft.log_probs[depth 2][rank 0] = 0.5", "<= 0"});
  bad = d;
  bad.lp[1] = NAN;
  expect_error([&] { build_ddtree(bad.view(), 0, 4); }, {"draft.log_probs[depth 1][rank 1]"});
  bad = d;
  bad.lp[3] = -0.2f;
  expect_error([&] { build_ddtree(bad.view(), 0, 4); },
               {"[depth 2][rank 1] = -0.2", "rank 0", "sorted"});
  bad = d;
  bad.tokens[3] = 20;
  expect_error([&] { build_ddtree(bad.view(), 0, 4); },
               {"draft.tokens[depth 2][rank 1] = 20", "repeats rank 0"});
  bad = d;
  bad.tokens[0] = -3;
  expect_error([&] { build_ddtree(bad.view(), 0, 4); }, {"draft.tokens[depth 1][rank 0] = -3"});
  // The depth bound is configurable: 16 depths need max_depth >= 16.
  std::mt19937 rng(3);
  const Draft deep = make_draft(16, 2, LpMode::kRandom, rng);
  expect_error([&] { build_ddtree(deep.view(), 0, 64); }, {"num_depths = 16", "max_depth = 15"});
  check_tree(deep, 64, build_ddtree(deep.view(), 0, 64, 16), "max_depth 16");
}

TEST(DDTree, RandomDraftsKeepEveryProperty) {
  const uint32_t seed = 2024;
  std::mt19937 rng(seed);
  const int Ks[] = {1, 2, 3, 5, 8, 32};
  const int Ds[] = {1, 2, 3, 5, 15};
  const int Bs[] = {1, 2, 3, 7, 16, 63, 64, 65, 256, 1000, 1024};
  int trial = 0;
  for (int K : Ks) {
    for (int D : Ds) {
      for (LpMode mode : {LpMode::kRandom, LpMode::kTies, LpMode::kNegInf}) {
        const Draft d = make_draft(D, K, mode, rng);
        const bool small = num_paths(K, D) <= 50000;
        const std::vector<Ranks> order = small ? sorted_paths(d) : std::vector<Ranks>{};
        std::vector<int> budgets(std::begin(Bs), std::end(Bs));
        budgets.push_back(1 + static_cast<int>(rng() % kMaxBudget));
        for (int B : budgets) {
          const std::string ctx = "seed " + std::to_string(seed) + " trial " +
                                  std::to_string(trial++) + " K " + std::to_string(K) + " D " +
                                  std::to_string(D) + " B " + std::to_string(B) + " mode " +
                                  std::to_string(static_cast<int>(mode));
          const DDTree t = build_ddtree(d.view(), 5, B);
          check_tree(d, B, t, ctx);
          if (::testing::Test::HasFatalFailure()) return;
          EXPECT_EQ(t.tokens[0], 5);
          // Small drafts: node i must be exactly the i-th path of the sorted list of all paths.
          for (int i = 1; small && i < t.size(); ++i)
            ASSERT_EQ(node_ranks(t, i), order[i - 1]) << ctx << " node " << i;
        }
      }
    }
  }
}

TEST(DDTree, BruteForceEnumeratorCountsSets) {
  // K = 2, D = 2 (paths (0), (1), (0,0), (0,1), (1,0), (1,1)): prefix-closed sets of 2 paths are
  // {(0),(1)}, {(0),(0,0)}, {(0),(0,1)}, {(1),(1,0)}, {(1),(1,1)}.
  Draft d{2, 2, {0, 1, 2, 3}, {-1.f, -2.f, -1.f, -2.f}};
  int64_t count = 0;
  brute_force_best(d, 2, &count);
  EXPECT_EQ(count, 5);
  brute_force_best(d, 6, &count);
  EXPECT_EQ(count, 1);
}

TEST(DDTree, MatchesBruteForceOptimum) {
  const uint32_t seed = 99;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 120; ++trial) {
    const int K = 1 + static_cast<int>(rng() % 3);
    const int D = 1 + static_cast<int>(rng() % 3);
    const int B = 1 + static_cast<int>(rng() % 8);
    const LpMode mode = static_cast<LpMode>(rng() % 3);
    const Draft d = make_draft(D, K, mode, rng);
    const DDTree t = build_ddtree(d.view(), 0, B);
    const int size = static_cast<int>(std::min<int64_t>(B, num_paths(K, D)));
    int64_t count = 0;
    const double best = brute_force_best(d, size, &count);
    double got = 0;
    for (int i = 1; i < t.size(); ++i) got += std::exp(t.scores[i]);
    EXPECT_GE(count, 1);
    EXPECT_NEAR(got, best, 1e-12 * std::max(1.0, best))
        << "seed " << seed << " trial " << trial << " K " << K << " D " << D << " B " << B
        << " sets " << count;
  }
}

TEST(DDTree, Deterministic) {
  std::mt19937 rng(8);
  const Draft d = make_draft(15, 32, LpMode::kTies, rng);
  const DDTree a = build_ddtree(d.view(), 1, 1024);
  const DDTree b = build_ddtree(d.view(), 1, 1024);
  EXPECT_EQ(a.parents, b.parents);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.scores, b.scores);
}
