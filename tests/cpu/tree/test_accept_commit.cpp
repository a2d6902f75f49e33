// Acceptance walk (greedy and sampled targets), target-token helpers and the commit plan.
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

using test::expect_error;

std::vector<int32_t> random_tree(int n, int shape, std::mt19937& rng) {
  std::vector<int32_t> p(n);
  p[0] = -1;
  for (int i = 1; i < n; ++i) {
    switch (shape) {
      case 0:
        p[i] = i - 1;
        break;  // chain
      case 1:
        p[i] = 0;
        break;  // star
      case 2:
        p[i] = static_cast<int32_t>(rng() % i);
        break;  // random
      default:
        p[i] = (rng() % 6) ? i - 1 : static_cast<int32_t>(rng() % i);
        break;  // deep
    }
  }
  return p;
}

// Independent walk over explicit child lists.
Acceptance ref_accept(const std::vector<int32_t>& p, const std::vector<int32_t>& tok,
                      const std::vector<int32_t>& target) {
  const int n = static_cast<int>(p.size());
  std::vector<std::vector<int>> kids(n);
  for (int i = 1; i < n; ++i) kids[p[i]].push_back(i);
  Acceptance a;
  int u = 0;
  a.nodes.push_back(0);
  for (;;) {
    int next = -1;
    for (int c : kids[u])
      if (tok[c] == target[u] && (next < 0 || c < next)) next = c;
    if (next < 0) break;
    u = next;
    a.nodes.push_back(u);
  }
  a.length = static_cast<int32_t>(a.nodes.size());
  a.bonus_token = target[u];
  return a;
}

}  // namespace

TEST(Accept, HandCases) {
  // Chain 0-1-2-3 carrying tokens 5, 6, 7 below the root.
  const std::vector<int32_t> chain = {-1, 0, 1, 2};
  const std::vector<int32_t> ctok = {100, 5, 6, 7};
  Acceptance a = accept_path(chain, ctok, std::vector<int32_t>{5, 6, 7, 8});
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(a.length, 4);
  EXPECT_EQ(a.bonus_token, 8);
  a = accept_path(chain, ctok, std::vector<int32_t>{9, 6, 7, 8});  // root's target misses
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(a.length, 1);
  EXPECT_EQ(a.bonus_token, 9);
  a = accept_path(chain, ctok, std::vector<int32_t>{5, 6, 1, 8});  // stops at node 2
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.bonus_token, 1);

  // 0 -> {1: a=10, 2: b=11}; 1 -> {3: 20}; 2 -> {4: 20, 5: 21}; 5 -> {6: 30}.
  const std::vector<int32_t> p = {-1, 0, 0, 1, 2, 2, 5};
  const std::vector<int32_t> tok = {0, 10, 11, 20, 20, 21, 30};
  a = accept_path(p, tok, std::vector<int32_t>{11, 0, 21, 0, 0, 30, 31});
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0, 2, 5, 6}));
  EXPECT_EQ(a.bonus_token, 31);
  // Token 20 under node 1 (node 3) must not be taken from node 2: only children count.
  a = accept_path(p, tok, std::vector<int32_t>{11, 0, 99, 0, 0, 0, 0});
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(a.bonus_token, 99);
  // The root's own token is never compared.
  a = accept_path(p, tok, std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0});
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0}));

  // Two children of the root carry 7 (nodes 1 and 3): the lower index, 1, is taken, and the walk
  // goes on below it (taking 3 would stop there).
  const std::vector<int32_t> dup = {-1, 0, 0, 0, 2, 1};
  const std::vector<int32_t> dtok = {0, 7, 8, 7, 1, 2};
  a = accept_path(dup, dtok, std::vector<int32_t>{7, 2, 1, 0, 0, 4});
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0, 1, 5}));
  EXPECT_EQ(a.bonus_token, 4);
  // Single-node tree.
  a = accept_path(std::vector<int32_t>{-1}, std::vector<int32_t>{3}, std::vector<int32_t>{42});
  EXPECT_EQ(a.nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(a.bonus_token, 42);
}

TEST(Accept, ArgumentErrors) {
  const std::vector<int32_t> p = {-1, 0, 1};
  expect_error(
      [&] {
        accept_path(p, std::vector<int32_t>{1, 2}, std::vector<int32_t>{1, 2, 3});
      },
      {"node_tokens has 2", "3"});
  expect_error(
      [&] {
        accept_path(p, std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{1});
      },
      {"target_tokens has 1", "3"});
  expect_error(
      [&] {
        accept_path(std::vector<int32_t>{-1, 2}, std::vector<int32_t>{1, 2},
                    std::vector<int32_t>{1, 2});
      },
      {"parents[1] = 2"});
}

TEST(Accept, RandomTreesMatchReference) {
  const uint32_t seed = 31;
  std::mt19937 rng(seed);
  int long_paths = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int sizes[] = {1, 2, 17, 64, 65, 129, 1025};
    const int n = sizes[rng() % std::size(sizes)];
    const auto p = random_tree(n, static_cast<int>(rng() % 4), rng);
    const int vocab = 1 + static_cast<int>(rng() % 4);  // tiny vocab: many matches and duplicates
    std::vector<int32_t> tok(n), target(n);
    for (auto& x : tok) x = static_cast<int32_t>(rng() % vocab);
    for (auto& x : target) x = static_cast<int32_t>(rng() % vocab);
    const Acceptance want = ref_accept(p, tok, target);
    const Acceptance got = accept_path(p, tok, target);
    ASSERT_EQ(got.nodes, want.nodes) << "seed " << seed << " trial " << trial;
    ASSERT_EQ(got.length, want.length) << "seed " << seed << " trial " << trial;
    ASSERT_EQ(got.bonus_token, want.bonus_token) << "seed " << seed << " trial " << trial;
    const auto depth = compute_depths(p);
    for (int k = 0; k < got.length; ++k) ASSERT_EQ(depth[got.nodes[k]], k);
    long_paths += got.length >= 4;
  }
  EXPECT_GT(long_paths, 50) << "seed " << seed;  // the walk is exercised beyond the first levels
}

TEST(Accept, DDTreeWithTargetsFollowingAPath) {
  // Targets that agree with a random branch of a DDTree: the walk follows that branch to a leaf.
  const uint32_t seed = 41;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const int K = 1 + static_cast<int>(rng() % 8), D = 1 + static_cast<int>(rng() % 15);
    std::vector<int32_t> tokens;
    std::vector<float> lp;
    for (int d = 0; d < D; ++d) {
      for (int r = 0; r < K; ++r) {
        tokens.push_back(d * 1000 + r);
        lp.push_back(-0.3f * static_cast<float>(r) - 0.01f * static_cast<float>(d));
      }
    }
    const DDTree t = build_ddtree({D, K, tokens, lp}, 7, 1 + static_cast<int>(rng() % 1024));
    const int n = t.size();
    std::vector<std::vector<int>> kids(n);
    for (int i = 1; i < n; ++i) kids[t.parents[i]].push_back(i);
    std::vector<int32_t> target(n, -5);  // -5 matches no draft token
    std::vector<int32_t> path = {0};
    while (!kids[path.back()].empty()) {
      const auto& k = kids[path.back()];
      const int c = k[rng() % k.size()];
      target[path.back()] = t.tokens[c];
      path.push_back(c);
    }
    target[path.back()] = 12345;
    const Acceptance a = accept_path(t.parents, t.tokens, target);
    ASSERT_EQ(a.nodes, path) << "seed " << seed << " trial " << trial;
    ASSERT_EQ(a.bonus_token, 12345);
  }
}

TEST(TargetTokens, ArgmaxTiesAndErrors) {
  const std::vector<float> rows = {1, 3, 3, 0, -1, -2, -1, -9, 5, 5, 5, 5};
  EXPECT_EQ(argmax_rows(rows, 3, 4), (std::vector<int32_t>{1, 0, 0}));
  const std::vector<float> inf_rows = {-INFINITY, -INFINITY, INFINITY, 0};
  EXPECT_EQ(argmax_rows(inf_rows, 2, 2), (std::vector<int32_t>{0, 0}));
  std::vector<float> nan_rows = rows;
  nan_rows[6] = NAN;
  expect_error([&] { argmax_rows(nan_rows, 3, 4); }, {"rows[1][2] is NaN"});
  expect_error([&] { argmax_rows(rows, 4, 4); }, {"rows has 12", "4 * 4 = 16"});
  expect_error([&] { argmax_rows(rows, 3, 0); }, {"vocab = 0"});
}

TEST(TargetTokens, SamplingIsSeededAndFollowsTheDocumentedDraw) {
  const uint32_t seed = 1234;
  std::mt19937 rng(seed);
  const int n = 300, vocab = 7;
  std::vector<float> probs(n * vocab);
  for (auto& x : probs) x = (rng() % 3 == 0) ? 0.f : static_cast<float>(rng() % 100) / 7.f;
  for (int i = 0; i < n; ++i) probs[i * vocab + (i % vocab)] += 0.5f;  // every row positive
  const auto a = sample_rows(probs, n, vocab, 77u);
  std::mt19937 eng(77);
  EXPECT_EQ(sample_rows(probs, n, vocab, eng), a);
  EXPECT_NE(sample_rows(probs, n, vocab, 78u), a);
  // The documented draw, written out independently: u from two raw outputs, inverse CDF.
  std::mt19937 e2(77);
  for (int i = 0; i < n; ++i) {
    const float* r = &probs[i * vocab];
    const double total = std::accumulate(r, r + vocab, 0.0);
    const double hi = static_cast<double>(e2() >> 5), lo = static_cast<double>(e2() >> 6);
    const double u = (hi * 67108864.0 + lo) / 9007199254740992.0;
    double cum = 0;
    int pick = -1;
    for (int v = 0; v < vocab && pick < 0; ++v)
      if ((cum += r[v]) > u * total) pick = v;
    ASSERT_EQ(a[i], pick) << "seed 77 row " << i;
    ASSERT_GT(r[a[i]], 0.f) << "seed 77 row " << i << " drew a zero-probability column";
  }
}

TEST(TargetTokens, SamplingFrequencies) {
  const std::vector<float> row = {0.1f, 0.f, 0.6f, 0.3f};
  const int n = 40000;
  std::vector<float> probs;
  for (int i = 0; i < n; ++i) probs.insert(probs.end(), row.begin(), row.end());
  const auto s = sample_rows(probs, n, 4, 5u);
  std::vector<int> count(4, 0);
  for (int x : s) ++count[x];
  EXPECT_EQ(count[1], 0);
  // Standard deviation of a frequency is at most 0.0025 here; allow 4 of them.
  EXPECT_NEAR(count[0] / double(n), 0.1, 0.01) << "seed 5";
  EXPECT_NEAR(count[2] / double(n), 0.6, 0.01) << "seed 5";
  EXPECT_NEAR(count[3] / double(n), 0.3, 0.01) << "seed 5";
  // One-hot rows always give their column; unnormalized rows are fine.
  EXPECT_EQ(sample_rows(std::vector<float>{0, 0, 9, 0, 1e-30f, 0}, 2, 3, 1u),
            (std::vector<int32_t>{2, 1}));
}

TEST(TargetTokens, SamplingErrors) {
  expect_error(
      [&] {
        sample_rows(std::vector<float>{0.5f, -0.1f}, 1, 2, 1u);
      },
      {"probs[0][1] = -0.1", ">= 0"});
  expect_error(
      [&] {
        sample_rows(std::vector<float>{INFINITY, 1}, 1, 2, 1u);
      },
      {"probs[0][0] = inf"});
  expect_error(
      [&] {
        sample_rows(std::vector<float>{1, 0, 0, 0}, 2, 2, 1u);
      },
      {"probs row 1 sums to 0"});
  expect_error(
      [&] {
        sample_rows(std::vector<float>{1, 0, 0}, 2, 2, 1u);
      },
      {"probs has 3", "2 * 2 = 4"});
}

TEST(Accept, SampledAcceptanceIsReproducible) {
  const uint32_t seed = 55;
  std::mt19937 rng(seed);
  const int n = 200, vocab = 5;
  const auto p = random_tree(n, 2, rng);
  std::vector<int32_t> tok(n);
  for (auto& x : tok) x = static_cast<int32_t>(rng() % vocab);
  std::vector<float> probs(n * vocab);
  for (auto& x : probs) x = static_cast<float>(1 + rng() % 10);
  const auto t1 = sample_rows(probs, n, vocab, 9u);
  const auto t2 = sample_rows(probs, n, vocab, 9u);
  ASSERT_EQ(t1, t2);
  const Acceptance a = accept_path(p, tok, t1);
  const Acceptance b = accept_path(p, tok, t2);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.bonus_token, b.bonus_token);
  const Acceptance want = ref_accept(p, tok, t1);
  EXPECT_EQ(a.nodes, want.nodes) << "seed " << seed;
  EXPECT_EQ(a.bonus_token, want.bonus_token) << "seed " << seed;
}

TEST(Commit, HandCases) {
  // Fully accepted chain: every copy is an identity, nothing to move.
  const std::vector<int32_t> chain = {-1, 0, 1, 2, 3};
  CommitPlan c = plan_commit(chain, std::vector<int32_t>{0, 1, 2, 3, 4}, 100);
  EXPECT_TRUE(c.copies.empty());
  EXPECT_EQ(c.num_identity, 5);
  EXPECT_EQ(c.prefix_len, 100);
  EXPECT_EQ(c.old_len, 105);
  EXPECT_EQ(c.new_len, 105);
  // Star, node 5 accepted: row 105 -> 101.
  const std::vector<int32_t> star = {-1, 0, 0, 0, 0, 0, 0};
  c = plan_commit(star, std::vector<int32_t>{0, 5}, 100);
  ASSERT_EQ(c.copies.size(), 1u);
  EXPECT_EQ(c.copies[0].src, 105);
  EXPECT_EQ(c.copies[0].dst, 101);
  EXPECT_EQ(c.num_identity, 1);
  EXPECT_EQ(c.old_len, 107);
  EXPECT_EQ(c.new_len, 102);
  // Root only, prefix 0.
  c = plan_commit(star, std::vector<int32_t>{0}, 0);
  EXPECT_TRUE(c.copies.empty());
  EXPECT_EQ(c.new_len, 1);
  // Mixed: 0 -> 1 -> 3 -> 6 in {-1, 0, 0, 1, 2, 2, 3}: rows 1 stays, 3 -> 2, 6 -> 3.
  c = plan_commit(std::vector<int32_t>{-1, 0, 0, 1, 2, 2, 3}, std::vector<int32_t>{0, 1, 3, 6}, 7);
  ASSERT_EQ(c.copies.size(), 2u);
  EXPECT_EQ(c.copies[0].src, 10);
  EXPECT_EQ(c.copies[0].dst, 9);
  EXPECT_EQ(c.copies[1].src, 13);
  EXPECT_EQ(c.copies[1].dst, 10);
  EXPECT_EQ(c.num_identity, 2);
}

TEST(Commit, ArgumentErrors) {
  const std::vector<int32_t> p = {-1, 0, 0, 1, 2};
  expect_error([&] { plan_commit(p, std::vector<int32_t>{}, 0); },
               {"accepted has 0", "1..tree size 5"});
  expect_error([&] { plan_commit(p, std::vector<int32_t>(6, 0), 0); }, {"accepted has 6"});
  expect_error([&] { plan_commit(p, std::vector<int32_t>{1, 3}, 0); }, {"accepted[0] = 1", "root"});
  expect_error(
      [&] {
        plan_commit(p, std::vector<int32_t>{0, 1, 4}, 0);
      },
      {"accepted[2] = 4 has parent 2", "child of accepted[1] = 1", "depth 2"});
  expect_error(
      [&] {
        plan_commit(p, std::vector<int32_t>{0, 3}, 0);
      },
      {"accepted[1] = 3 has parent 1"});
  // A sibling of the previous node (parent above the path, not on it) is no child either.
  expect_error(
      [&] {
        plan_commit(p, std::vector<int32_t>{0, 1, 2}, 0);
      },
      {"accepted[2] = 2 has parent 0"});
  expect_error([&] { plan_commit(p, std::vector<int32_t>{0, 9}, 0); }, {"accepted[1] = 9", "1..4"});
  expect_error([&] { plan_commit(p, std::vector<int32_t>{0, 0}, 0); }, {"accepted[1] = 0"});
  expect_error([&] { plan_commit(p, std::vector<int32_t>{0}, -2); }, {"prefix_len = -2"});
  expect_error([&] { plan_commit(p, std::vector<int32_t>{0}, kMaxPrefixLen + 1); }, {"prefix_len"});
}

TEST(Commit, InPlaceCopiesLeaveTheAcceptedPathInOrder) {
  // Simulated cache: row t holds a tag; the tail rows hold node ids. Applying the copies in order,
  // in place, must leave rows prefix_len + k = accepted[k] and the prefix untouched.
  const uint32_t seed = 61;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    const int sizes[] = {1, 2, 16, 65, 257, 1025};
    const int n = sizes[rng() % std::size(sizes)];
    const auto p = random_tree(n, static_cast<int>(rng() % 4), rng);
    const int32_t prefix = static_cast<int32_t>(rng() % 3 == 0 ? 0 : rng() % 5000);
    // A random root-to-node path, cut at a random depth.
    std::vector<std::vector<int>> kids(n);
    for (int i = 1; i < n; ++i) kids[p[i]].push_back(i);
    std::vector<int32_t> acc = {0};
    while (!kids[acc.back()].empty() && rng() % 8 != 0)
      acc.push_back(kids[acc.back()][rng() % kids[acc.back()].size()]);
    const CommitPlan c = plan_commit(p, acc, prefix);
    const std::string ctx = "seed " + std::to_string(seed) + " trial " + std::to_string(trial);
    ASSERT_EQ(c.new_len, prefix + static_cast<int32_t>(acc.size())) << ctx;
    ASSERT_EQ(c.old_len, prefix + n) << ctx;
    ASSERT_EQ(c.copies.size() + c.num_identity, acc.size()) << ctx;
    std::vector<int64_t> rows(prefix + n);
    for (int t = 0; t < prefix; ++t) rows[t] = -1 - t;
    for (int j = 0; j < n; ++j) rows[prefix + j] = j;
    int32_t last_dst = -1;
    for (const RowCopy& rc : c.copies) {
      ASSERT_NE(rc.src, rc.dst) << ctx;
      ASSERT_GT(rc.dst, last_dst) << ctx << ": copies not in increasing dst";
      ASSERT_GE(rc.dst, prefix) << ctx;
      ASSERT_LT(rc.src, c.old_len) << ctx;
      last_dst = rc.dst;
      rows[rc.dst] = rows[rc.src];
    }
    for (int t = 0; t < prefix; ++t) ASSERT_EQ(rows[t], -1 - t) << ctx;
    for (size_t k = 0; k < acc.size(); ++k)
      ASSERT_EQ(rows[prefix + k], acc[k]) << ctx << " k " << k;
  }
}
