// treemla tests: check_invariants notices every kind of corruption it claims to detect. Each
// test corrupts a copy of a healthy pool through KvPoolTestAccess (declared a friend in
// kvpool.h, defined only here) and expects the error naming what broke.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "cpu/kvpool/kvpool_test_util.h"

namespace treemla::kvpool {

struct KvPoolTestAccess {
  static std::vector<int32_t>& pages(KvPool& p, int64_t id) { return p.requests_.at(id).pages; }
  static int64_t& num_tokens(KvPool& p, int64_t id) { return p.requests_.at(id).num_tokens; }
  static std::deque<int32_t>& free_fifo(KvPool& p) { return p.free_fifo_; }
  static std::set<int32_t>& free_sorted(KvPool& p) { return p.free_sorted_; }
};

namespace test {
namespace {

using Access = KvPoolTestAccess;

// Request 1 holds pages 3, 0; request 2 page 5; pages 1, 2, 4, 6, 7 are free (page_size 4).
KvPool healthy(FreePolicy policy) {
  if (policy == FreePolicy::kAsFreed) return make_layout(8, 4, {{1, {3, 0}}, {2, {5}}});
  KvPool pool(make_config(8, 4, FreePolicy::kSorted));
  pool.alloc(1, 8);  // pages 0, 1
  pool.alloc(2, 4);  // page 2
  Access::pages(pool, 1) = {3, 0};
  Access::pages(pool, 2) = {5};
  Access::free_sorted(pool) = {1, 2, 4, 6, 7};
  return pool;
}

void expect_corruption_caught(FreePolicy policy, const std::function<void(KvPool&)>& corrupt,
                              const std::vector<std::string>& message) {
  const KvPool original = healthy(policy);
  ASSERT_NO_THROW(original.check_invariants());
  ASSERT_TRUE(ownership_ok(original));
  KvPool copy = original;
  corrupt(copy);
  ::treemla::test::expect_error([&] { copy.check_invariants(); }, message);
  EXPECT_NO_THROW(original.check_invariants());
}

// The free list of either policy, as one editable list.
void edit_free_list(KvPool& pool, const std::function<void(std::vector<int32_t>&)>& edit) {
  std::vector<int32_t> list = pool.free_list();
  edit(list);
  if (pool.config().policy == FreePolicy::kAsFreed) {
    Access::free_fifo(pool).assign(list.begin(), list.end());
  } else {
    Access::free_sorted(pool) = std::set<int32_t>(list.begin(), list.end());
  }
}

class KvPoolInvariants : public ::testing::TestWithParam<FreePolicy> {};

TEST_P(KvPoolInvariants, PageCountThatDoesNotMatchTheTokens) {
  expect_corruption_caught(GetParam(), [](KvPool& p) { Access::num_tokens(p, 1) = 9; },
                           {"request 1 holds 2 pages for 9 tokens"});
  expect_corruption_caught(GetParam(), [](KvPool& p) { Access::num_tokens(p, 2) = 0; },
                           {"request 2 holds 1 pages for 0 tokens"});
}

TEST_P(KvPoolInvariants, HeldPageOutOfRange) {
  expect_corruption_caught(GetParam(), [](KvPool& p) { Access::pages(p, 2)[0] = 8; },
                           {"request 2 holds page 8 outside [0, 8)"});
  expect_corruption_caught(GetParam(), [](KvPool& p) { Access::pages(p, 1)[1] = -1; },
                           {"request 1 holds page -1 outside [0, 8)"});
}

TEST_P(KvPoolInvariants, PageHeldTwice) {
  expect_corruption_caught(GetParam(), [](KvPool& p) { Access::pages(p, 2)[0] = 3; },
                           {"page 3 is held by request 2 and by request 1"});
  expect_corruption_caught(GetParam(),
                           [](KvPool& p) {
                             Access::pages(p, 1) = {3, 3};
                           },
                           {"page 3 is held by request 1 and by request 1"});
}

TEST_P(KvPoolInvariants, FreePageOutOfRange) {
  expect_corruption_caught(GetParam(),
                           [](KvPool& p) { edit_free_list(p, [](auto& l) { l.push_back(8); }); },
                           {"free page 8 outside [0, 8)"});
}

TEST_P(KvPoolInvariants, PageFreeAndHeld) {
  expect_corruption_caught(GetParam(),
                           [](KvPool& p) { edit_free_list(p, [](auto& l) { l.push_back(5); }); },
                           {"page 5 is free and held by request 2"});
}

TEST_P(KvPoolInvariants, LostPage) {
  expect_corruption_caught(GetParam(),
                           [](KvPool& p) {
                             edit_free_list(
                                 p, [](auto& l) { l.erase(std::find(l.begin(), l.end(), 6)); });
                           },
                           {"page 6 is neither free nor held (lost)"});
  expect_corruption_caught(GetParam(),
                           [](KvPool& p) {
                             Access::pages(p, 1) = {3};
                             Access::num_tokens(p, 1) = 4;
                           },
                           {"page 0 is neither free nor held (lost)"});
}

INSTANTIATE_TEST_SUITE_P(Policies, KvPoolInvariants,
                         ::testing::Values(FreePolicy::kAsFreed, FreePolicy::kSorted),
                         [](const auto& info) {
                           return std::string(free_policy_name(info.param)) == "sorted" ? "sorted"
                                                                                        : "asfreed";
                         });

TEST(KvPoolInvariantsAsFreed, PageFreeTwice) {
  // Only the as-freed list can hold a page twice (the sorted one is a set).
  expect_corruption_caught(FreePolicy::kAsFreed,
                           [](KvPool& p) { Access::free_fifo(p).push_back(1); },
                           {"page 1 is free twice"});
}

}  // namespace
}  // namespace test
}  // namespace treemla::kvpool
