// treemla tests: a long random replay of pool operations against a trivial model (per request a
// vector of row tags) with a real host cache. After every operation: ownership and conservation
// of pages; periodically and at the end: every live row reads back its tag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu/kvpool/kvpool_test_util.h"

namespace treemla::kvpool::test {
namespace {

using Model = std::map<int64_t, std::vector<uint64_t>>;

struct Replay {
  KvPool pool;
  TaggedCache cache;
  Model model;
  std::mt19937 rng;
  uint64_t next_tag = 1;
  int64_t next_id = -50;  // negative ids too: ids are the caller's
  int64_t capacity;
  int errors = 0, commits = 0, defrags = 0, over_allocations = 0;

  Replay(const PoolConfig& c, uint32_t seed)
      : pool(c), cache(c), rng(seed), capacity(int64_t{c.num_pages} * c.page_size) {}

  int64_t pick_id() {
    if (model.empty() || rng() % 16 == 0) return 1'000'000 + rng() % 4;  // not live
    auto it = model.begin();
    std::advance(it, rng() % model.size());
    return it->first;
  }
  int64_t some_tokens(int64_t scale) { return static_cast<int64_t>(rng() % (scale + 1)); }

  // New rows [from, to) of request id get fresh tags, in the cache and in the model.
  void write_rows(int64_t id, int64_t from) {
    auto& rows = model[id];
    for (int64_t t = from; t < pool.num_tokens(id); ++t) {
      rows.push_back(next_tag++);
      cache.write(pool.locate(id, t), rows.back());
    }
  }

  std::vector<int32_t> random_path(int64_t q_len) {
    const int64_t n = 1 + some_tokens(std::min<int64_t>(q_len, 24) - 1);
    std::vector<int32_t> nodes(static_cast<size_t>(q_len - 1));
    std::iota(nodes.begin(), nodes.end(), 1);
    std::shuffle(nodes.begin(), nodes.end(), rng);
    std::vector<int32_t> a{0};
    a.insert(a.end(), nodes.begin(), nodes.begin() + (n - 1));
    std::sort(a.begin(), a.end());
    for (int t = 0; t < 4 && n > 2 && rng() % 2; ++t) {
      const size_t i = 1 + rng() % (n - 1), j = 1 + rng() % (n - 1);
      if (a[j] >= static_cast<int32_t>(i) && a[i] >= static_cast<int32_t>(j)) std::swap(a[i], a[j]);
    }
    if (rng() % 20 == 0) a.back() = static_cast<int32_t>(q_len);  // out of range: must fail
    return a;
  }

  template <class Plan>
  void apply(const Plan& plan) {
    ASSERT_TRUE(waves_independent(plan));
    // Alternate between the sequential order and reversed waves; both must be correct.
    if (rng() % 2) {
      apply_plan(pool.config(), plan, cache.bytes.data());
    } else if constexpr (std::is_same_v<Plan, DefragPlan>) {
      apply_page_moves(pool.config(), reversed_within_waves(plan), cache.bytes.data());
    } else {
      apply_row_moves(pool.config(), reversed_within_waves(plan), cache.bytes.data());
    }
  }

  int64_t rows_of(int64_t id) const {  // -1: not live
    auto it = model.find(id);
    return it == model.end() ? -1 : static_cast<int64_t>(it->second.size());
  }
  int64_t pages_of(int64_t rows) const {
    return (rows + pool.config().page_size - 1) / pool.config().page_size;
  }
  static bool path_ok(const std::vector<int32_t>& a, int64_t q_len) {
    if (a.empty() || static_cast<int64_t>(a.size()) > q_len || a[0] != 0) return false;
    std::set<int32_t> seen;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k] < static_cast<int32_t>(k) || a[k] >= q_len || !seen.insert(a[k]).second)
        return false;
    }
    return true;
  }

  // One random operation. Whether it must fail is decided from the model, independently of the
  // pool; a failed operation must leave the pool unchanged.
  void step() {
    const KvPool before = pool;
    const Model model_before = model;
    const int64_t free_pages = pool.num_free_pages();
    int op = static_cast<int>(rng() % 100);
    // Under pressure free more often, so that the pool keeps cycling between full and not.
    if (free_pages * 8 < pool.config().num_pages && rng() % 3 == 0) op = 60;
    bool expect_fail = false, failed = false;
    try {
      if (op < 22) {  // alloc: sometimes an existing id, sometimes too big
        const int64_t id = (rng() % 20 == 0 && !model.empty()) ? model.begin()->first : next_id++;
        const int64_t n = some_tokens(capacity / 6);
        expect_fail = model.count(id) || pages_of(n) > free_pages;
        pool.alloc(id, n);
        write_rows(id, 0);
      } else if (op < 44) {  // extend
        const int64_t id = pick_id();
        const int64_t have = rows_of(id), n = some_tokens(capacity / 12);
        expect_fail = have < 0 || pages_of(have + n) - pages_of(have) > free_pages;
        pool.extend(id, n);
        write_rows(id, have);
      } else if (op < 54) {  // truncate, sometimes past the end
        const int64_t id = pick_id();
        const int64_t have = rows_of(id), n = have >= 0 ? some_tokens(have + 1) : 0;
        expect_fail = have < 0 || n > have;
        pool.truncate(id, n);
        model[id].resize(static_cast<size_t>(n));
      } else if (op < 66) {  // free, sometimes of an id not live (double free)
        const int64_t id = pick_id();
        expect_fail = rows_of(id) < 0;
        pool.free(id);
        model.erase(id);
      } else if (op < 92) {  // commit of a random accepted path
        const int64_t id = pick_id();
        const int64_t have = rows_of(id), rows = std::max<int64_t>(have, 1);
        const int64_t prefix = rows - 1 - some_tokens(std::min<int64_t>(rows - 1, 40));
        const auto path = random_path(rows - prefix);
        expect_fail = have < 1 || !path_ok(path, have - prefix);
        const CommitPlan plan = pool.commit_accepted(id, prefix, path);
        apply(plan);
        std::vector<uint64_t>& r = model[id];
        std::vector<uint64_t> next(r.begin(), r.begin() + prefix);
        for (int32_t a : path) next.push_back(r[static_cast<size_t>(prefix + a)]);
        r = std::move(next);
        ++commits;
      } else if (op < 96) {
        // Only a full pool with something to move fails (every relocation there is a cycle).
        for (int64_t id : pool.request_ids()) expect_fail |= free_pages == 0 && pool.runs(id) > 1;
        const DefragPlan plan = pool.defrag();
        apply(plan);
        for (int64_t id : pool.request_ids()) ASSERT_LE(pool.runs(id), 1);
        ++defrags;
      } else {
        const int64_t budget = some_tokens(8);
        const DefragPlan plan = pool.partial_defrag(budget);
        ASSERT_LE(static_cast<int64_t>(plan.moves.size()), budget);
        apply(plan);
        ++defrags;
      }
    } catch (const Error& e) {
      failed = true;
      ++errors;
      over_allocations += e.message().find(" free") != std::string::npos;
      ASSERT_TRUE(expect_fail) << "operation " << op << " failed: " << e.message();
      // The model may have gained an empty entry from model[id] above: restore it.
      model = model_before;
      ASSERT_TRUE(pool == before) << "pool changed by a failed operation: " << e.message();
    }
    ASSERT_EQ(failed, expect_fail) << "operation " << op << " should have failed";
    ASSERT_TRUE(ownership_ok(pool));
    ASSERT_NO_THROW(pool.check_invariants());
    ASSERT_EQ(pool.request_ids().size(), model.size());
    for (const auto& [id, rows] : model) {
      ASSERT_EQ(pool.num_tokens(id), static_cast<int64_t>(rows.size())) << "request " << id;
    }
  }
};

class KvPoolReplay : public ::testing::TestWithParam<std::tuple<int32_t, FreePolicy>> {};

TEST_P(KvPoolReplay, HundredThousandOperations) {
  const auto [page_size, policy] = GetParam();
  // A small pool that fills up: about 1024 rows whatever the page size.
  const int32_t num_pages = page_size == 1 ? 1024 : (page_size == 16 ? 64 : 16);
  const uint32_t seed =
      20240 + static_cast<uint32_t>(page_size) * 3 + static_cast<uint32_t>(policy);
  SCOPED_TRACE("seed " + std::to_string(seed) + " page_size " + std::to_string(page_size) +
               " policy " + free_policy_name(policy));
  Replay r(make_config(num_pages, page_size, policy, 4, 2), seed);
  constexpr int kOps = 100'000;
  for (int i = 0; i < kOps; ++i) {
    r.step();
    if (::testing::Test::HasFatalFailure()) {
      FAIL() << "at operation " << i;
    }
    if (i % 97 == 0) {
      ASSERT_TRUE(r.cache.matches(r.pool, r.model)) << "at operation " << i;
    }
  }
  ASSERT_TRUE(r.cache.matches(r.pool, r.model));
  // The replay must have exercised what it claims to.
  EXPECT_GT(r.commits, kOps / 10);
  EXPECT_GT(r.defrags, kOps / 20);
  EXPECT_GT(r.errors, kOps / 50);
  EXPECT_GT(r.over_allocations, kOps / 100);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KvPoolReplay,
                         ::testing::Combine(::testing::Values(1, 16, 64),
                                            ::testing::Values(FreePolicy::kAsFreed,
                                                              FreePolicy::kSorted)),
                         [](const auto& info) {
                           return "page" + std::to_string(std::get<0>(info.param)) + "_" +
                                  (std::get<1>(info.param) == FreePolicy::kSorted ? "sorted"
                                                                                  : "asfreed");
                         });

}  // namespace
}  // namespace treemla::kvpool::test
