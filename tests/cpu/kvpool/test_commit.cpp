// treemla tests: commit of accepted tree rows and applying plans to a host buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/kvpool/kvpool_test_util.h"

namespace treemla::kvpool::test {
namespace {

using Pages = std::vector<int32_t>;

// The model of a commit: rows [0, prefix) stay, then the accepted tail rows in path order.
std::vector<uint64_t> committed(const std::vector<uint64_t>& rows, int64_t prefix,
                                const std::vector<int32_t>& accepted) {
  std::vector<uint64_t> out(rows.begin(), rows.begin() + prefix);
  for (int32_t a : accepted) out.push_back(rows[static_cast<size_t>(prefix + a)]);
  return out;
}

bool same_slot(RowSlot a, RowSlot b) { return a.page == b.page && a.slot == b.slot; }

TEST(KvPoolCommit, MovesRowsAndReleasesPages) {
  // prefix 5 + q_len 7 = 12 rows on pages 6, 1, 3 (page_size 4).
  KvPool pool = make_layout(8, 4, {{1, {6, 1, 3}}});
  TaggedCache cache(pool.config());
  uint64_t tag = 100;
  std::map<int64_t, std::vector<uint64_t>> model;
  cache.fill(pool, 1, &tag, &model[1]);
  const std::vector<int32_t> accepted{0, 2, 5};
  const CommitPlan plan = pool.commit_accepted(1, 5, accepted);
  EXPECT_EQ(plan.request, 1);
  EXPECT_EQ(plan.num_tokens, 8);
  // Row 7 -> row 6 (page 1 slot 3 -> slot 2), then row 10 -> row 7 (page 3 slot 2 -> page 1
  // slot 3), which must wait for the first: two waves.
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_TRUE(same_slot(plan.moves[0].src, {1, 3}) && same_slot(plan.moves[0].dst, {1, 2}));
  EXPECT_TRUE(same_slot(plan.moves[1].src, {3, 2}) && same_slot(plan.moves[1].dst, {1, 3}));
  EXPECT_EQ(plan.wave_offsets, (Pages{0, 1, 2}));
  EXPECT_EQ(plan.released_pages, (Pages{3}));
  EXPECT_EQ(pool.pages(1), (Pages{6, 1}));
  EXPECT_EQ(pool.num_tokens(1), 8);
  EXPECT_EQ(pool.free_list().back(), 3);  // as-freed: appended at the tail
  apply_plan(pool.config(), plan, cache.bytes.data());
  model[1] = committed(model[1], 5, accepted);
  EXPECT_TRUE(cache.matches(pool, model));
  EXPECT_TRUE(ownership_ok(pool));
}

TEST(KvPoolCommit, IdentityAndNonMonotonePaths) {
  KvPool pool(make_config(16, 2, FreePolicy::kSorted));
  pool.alloc(1, 9);  // prefix 3 + q_len 6
  pool.alloc(2, 9);
  TaggedCache cache(pool.config());
  uint64_t tag = 1;
  std::map<int64_t, std::vector<uint64_t>> model;
  cache.fill(pool, 1, &tag, &model[1]);
  cache.fill(pool, 2, &tag, &model[2]);

  const CommitPlan same = pool.commit_accepted(1, 3, std::vector<int32_t>{0, 1, 2});
  EXPECT_TRUE(same.moves.empty());
  EXPECT_EQ(same.wave_offsets, (Pages{0}));
  EXPECT_EQ(same.released_pages, (Pages{3, 4}));  // 6 rows need 3 of the 5 pages
  model[1].resize(6);

  // accepted[k] >= k and distinct, but not increasing.
  const std::vector<int32_t> path{0, 4, 2, 5};
  const CommitPlan plan = pool.commit_accepted(2, 3, path);
  EXPECT_EQ(plan.moves.size(), 2u);  // node 2 is already at row 3 + 2
  EXPECT_TRUE(waves_independent(plan));
  apply_plan(pool.config(), plan, cache.bytes.data());
  model[2] = committed(model[2], 3, path);
  EXPECT_TRUE(cache.matches(pool, model));
  // The root alone: the request keeps prefix + 1 rows.
  pool.alloc(3, 4);
  cache.fill(pool, 3, &tag, &model[3]);
  pool.commit_accepted(3, 0, std::vector<int32_t>{0});
  model[3].resize(1);
  EXPECT_TRUE(cache.matches(pool, model));
  EXPECT_TRUE(ownership_ok(pool));
}

TEST(KvPoolCommit, BadArgumentsLeaveThePoolUnchanged) {
  KvPool pool(make_config(8, 4));
  pool.alloc(1, 10);  // prefix 6 + q_len 4, say
  using V = std::vector<int32_t>;
  auto commit = [&](int64_t id, int64_t prefix, V a) {
    return [&pool, id, prefix, a] { pool.commit_accepted(id, prefix, a); };
  };
  expect_error_unchanged(pool, commit(2, 6, V{0}), "unknown request 2");
  expect_error_unchanged(pool, commit(1, -1, V{0}), "prefix_len");
  expect_error_unchanged(pool, commit(1, 10, V{0}), "prefix_len");
  expect_error_unchanged(pool, commit(1, 6, V{}), "accepted.size()");
  expect_error_unchanged(pool, commit(1, 6, V{0, 1, 2, 3, 3}), "accepted.size()");
  expect_error_unchanged(pool, commit(1, 6, V{1, 2}), "accepted[0] must be 0");
  expect_error_unchanged(pool, commit(1, 6, V{0, 2, 1}), "accepted[2] must be in [2, q_len = 4)");
  expect_error_unchanged(pool, commit(1, 6, V{0, 4}), "accepted[1] must be in [1, q_len = 4)");
  expect_error_unchanged(pool, commit(1, 6, V{0, -1}), "accepted[1]");
  expect_error_unchanged(pool, commit(1, 6, V{0, 3, 3}), "repeats accepted[1]");
}

// Random accepted path over q_len tail nodes: root first, then distinct nodes with a[k] >= k;
// increasing (as DDTree produces) or shuffled where the bound allows.
std::vector<int32_t> random_path(std::mt19937* rng, int64_t q_len, int64_t max_n) {
  const int64_t n =
      1 + static_cast<int64_t>((*rng)() % static_cast<uint32_t>(std::min(q_len, max_n)));
  std::vector<int32_t> nodes(static_cast<size_t>(q_len - 1));
  std::iota(nodes.begin(), nodes.end(), 1);
  std::shuffle(nodes.begin(), nodes.end(), *rng);
  std::vector<int32_t> a{0};
  a.insert(a.end(), nodes.begin(), nodes.begin() + (n - 1));
  std::sort(a.begin(), a.end());
  if ((*rng)() % 3 == 0) {
    for (int t = 0; t < 8 && n > 2; ++t) {
      const size_t i = 1 + (*rng)() % static_cast<uint32_t>(n - 1);
      const size_t j = 1 + (*rng)() % static_cast<uint32_t>(n - 1);
      // Swapping keeps a[k] >= k only if both values stay at or above their new index.
      if (a[j] >= static_cast<int32_t>(i) && a[i] >= static_cast<int32_t>(j)) std::swap(a[i], a[j]);
    }
  }
  return a;
}

// The fewest waves a commit can take (kvpool.h): move k must precede move accepted[k], so the
// longest chain k, accepted[k], accepted[accepted[k]], ... of moves (k >= 1, accepted[k] != k,
// k < n) sets the number of waves. Counted here without the plan's own bookkeeping.
int32_t longest_move_chain(const std::vector<int32_t>& accepted) {
  const int32_t n = static_cast<int32_t>(accepted.size());
  auto is_move = [&](int32_t k) {
    return k >= 1 && k < n && accepted[static_cast<size_t>(k)] != k;
  };
  int32_t longest = 0;
  for (int32_t k = 1; k < n; ++k) {
    int32_t len = 0;
    for (int32_t j = k; is_move(j); j = accepted[static_cast<size_t>(j)]) ++len;
    longest = std::max(longest, len);
  }
  return longest;
}

TEST(KvPoolCommit, PlansUseTheFewestWaves) {
  struct Case {
    std::vector<int32_t> accepted;
    int32_t q_len;
    Pages want_offsets;
  } cases[] = {
      {{0, 5, 6, 7}, 8, {0, 3}},              // no move reads a row another writes: one wave
      {{0, 2, 4, 6}, 8, {0, 2, 3}},           // move 1 reads row 2, which move 2 overwrites
      {{0, 2, 3, 4, 5}, 6, {0, 1, 2, 3, 4}},  // one node skipped, then a chain: one wave per move
      {{0, 1, 2}, 5, {0}},                    // nothing moves
  };
  for (const Case& c : cases) {
    KvPool pool(make_config(64, 4));
    pool.alloc(1, 10 + c.q_len);
    const CommitPlan plan = pool.commit_accepted(1, 10, c.accepted);
    EXPECT_EQ(plan.wave_offsets, c.want_offsets) << ::testing::PrintToString(c.accepted);
    EXPECT_EQ(static_cast<int32_t>(plan.wave_offsets.size()) - 1, longest_move_chain(c.accepted));
    EXPECT_TRUE(waves_independent(plan));
  }
}

TEST(KvPoolCommit, RandomPathsMatchTheModel) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    const int32_t ps = 1 << (rng() % 7);
    const FreePolicy policy = (rng() % 2) ? FreePolicy::kSorted : FreePolicy::kAsFreed;
    KvPool pool(make_config(4096 / ps + 8, ps, policy));
    // Scatter the pages: allocate filler requests and free every other one.
    for (int i = 0; i < 8; ++i) pool.alloc(100 + i, ps * (1 + rng() % 3));
    for (int i = 0; i < 8; i += 2) pool.free(100 + i);
    const int64_t prefix = rng() % 300;
    const int64_t q_len = 1 + rng() % 300;
    pool.alloc(1, prefix + q_len);
    TaggedCache cache(pool.config());
    uint64_t tag = 1;
    std::map<int64_t, std::vector<uint64_t>> model;
    for (int64_t id : pool.request_ids()) cache.fill(pool, id, &tag, &model[id]);
    const std::vector<int32_t> path = random_path(&rng, q_len, 40);
    const std::vector<int32_t> old_pages = pool.pages(1);
    const CommitPlan plan = pool.commit_accepted(1, prefix, path);
    model[1] = committed(model[1], prefix, path);
    ASSERT_TRUE(waves_independent(plan));
    EXPECT_EQ(static_cast<int32_t>(plan.wave_offsets.size()) - 1, longest_move_chain(path));
    TaggedCache other = cache;
    apply_plan(pool.config(), plan, cache.bytes.data());
    ASSERT_TRUE(cache.matches(pool, model));
    apply_row_moves(pool.config(), reversed_within_waves(plan), other.bytes.data());
    ASSERT_TRUE(other.matches(pool, model));
    const auto kept = static_cast<std::ptrdiff_t>(pool.pages(1).size());
    const Pages released(old_pages.begin() + kept, old_pages.end());
    EXPECT_EQ(plan.released_pages, released);
    ASSERT_TRUE(ownership_ok(pool));
  }
}

TEST(KvPoolApply, ChecksEveryIndexBeforeCopying) {
  const PoolConfig c = make_config(4, 2);
  TaggedCache cache(c);
  for (int32_t p = 0; p < 4; ++p) {
    for (int32_t s = 0; s < 2; ++s) cache.write({p, s}, uint64_t(10 * p + s));
  }
  const std::vector<unsigned char> before = cache.bytes;
  auto expect_bad = [&](auto f, const char* needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
    EXPECT_EQ(cache.bytes, before);
  };
  unsigned char* data = cache.bytes.data();
  using Pm = std::vector<PageMove>;
  using Rm = std::vector<RowMove>;
  expect_bad(
      [&] {
        apply_page_moves(c, Pm{{0, 1}, {1, 4}}, data);
      },
      "moves[1].dst must be in [0, 4)");
  expect_bad([&] { apply_page_moves(c, Pm{{-1, 1}}, data); }, "moves[0].src");
  expect_bad(
      [&] {
        apply_row_moves(c, Rm{{{0, 0}, {1, 1}}, {{0, 2}, {1, 1}}}, data);
      },
      "moves[1].src.slot must be in [0, 2)");
  expect_bad([&] { apply_row_moves(c, Rm{{{0, 0}, {9, 1}}}, data); }, "moves[0].dst.page");
  expect_bad([&] { apply_page_moves(c, std::vector<PageMove>{{0, 1}}, nullptr); }, "null");
  apply_page_moves(c, std::vector<PageMove>{{2, 0}, {3, 2}}, cache.bytes.data());
  EXPECT_EQ(cache.read({0, 1}), 21u);
  EXPECT_EQ(cache.read({2, 0}), 30u);
  apply_row_moves(c, std::vector<RowMove>{{{1, 1}, {3, 0}}}, cache.bytes.data());
  EXPECT_EQ(cache.read({3, 0}), 11u);
  EXPECT_EQ(cache.read({3, 1}), 31u);
}

}  // namespace
}  // namespace treemla::kvpool::test
