// treemla tests: defrag plans -- hand-made layouts, random churned pools, partial defrag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/kvpool/kvpool_test_util.h"

namespace treemla::kvpool::test {
namespace {

using Pages = std::vector<int32_t>;
using Model = std::map<int64_t, std::vector<uint64_t>>;

// Applies a plan to the cache, sequentially and (on a copy) wave by wave in reverse order, and
// checks both against the model.
template <class Plan>
void apply_both_ways(const KvPool& pool, const Plan& plan, TaggedCache* cache, const Model& model,
                     const std::string& where) {
  ASSERT_TRUE(waves_independent(plan)) << where;
  TaggedCache other = *cache;
  apply_plan(pool.config(), plan, cache->bytes.data());
  ASSERT_TRUE(cache->matches(pool, model)) << where << " (sequential)";
  auto reversed = reversed_within_waves(plan);
  if constexpr (std::is_same_v<Plan, DefragPlan>) {
    apply_page_moves(pool.config(), reversed, other.bytes.data());
  } else {
    apply_row_moves(pool.config(), reversed, other.bytes.data());
  }
  ASSERT_TRUE(other.matches(pool, model)) << where << " (waves reversed)";
}

Model fill_all(const KvPool& pool, TaggedCache* cache) {
  Model model;
  uint64_t tag = 1;
  for (int64_t id : pool.request_ids()) cache->fill(pool, id, &tag, &model[id]);
  return model;
}

TEST(KvPoolDefrag, ContiguousLayoutNeedsNoMove) {
  KvPool pool = make_layout(10, 4, {{1, {0, 1, 2}}, {2, {5, 6}}, {3, {9}}});
  const KvPool before = pool;
  const DefragPlan plan = pool.defrag();
  EXPECT_TRUE(plan.moves.empty());
  EXPECT_TRUE(plan.tables.empty());
  EXPECT_EQ(plan.wave_offsets, (Pages{0}));
  for (int64_t id : pool.request_ids()) EXPECT_EQ(pool.pages(id), before.pages(id));
}

TEST(KvPoolDefrag, KeepsPagesInPlaceWhereNaiveWouldShiftAll) {
  KvPool pool = make_layout(12, 2, {{1, {1, 2, 3, 4, 5, 6, 7, 9}}});
  TaggedCache cache(pool.config());
  const Model model = fill_all(pool, &cache);
  EXPECT_EQ(naive_moves(pool), 8);
  const DefragPlan plan = pool.defrag();
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].src, 9);
  EXPECT_EQ(plan.moves[0].dst, 8);
  EXPECT_EQ(plan.pages_relocated, 1);
  EXPECT_EQ(pool.pages(1), (Pages{1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_EQ(plan.tables.size(), 1u);
  EXPECT_EQ(plan.tables[0].request, 1);
  EXPECT_EQ(plan.tables[0].pages, pool.pages(1));
  apply_both_ways(pool, plan, &cache, model, "shift");
  // The free list is rebuilt ascending.
  EXPECT_EQ(pool.free_list(), (Pages{0, 9, 10, 11}));
}

TEST(KvPoolDefrag, NeverWorseThanNaivePacking) {
  // The overlap packing keeps requests 2 and 3 in place, finds no 4-page gap for request 1, gives
  // up request 3's place and ends with 8 moves; packing from 0 needs 5 (a chain).
  KvPool pool = make_layout(13, 1, {{1, {0, 1, 10, 11}}, {2, {2, 3, 4}}, {3, {7, 8, 9}}});
  TaggedCache cache(pool.config());
  const Model model = fill_all(pool, &cache);
  EXPECT_EQ(naive_moves(pool), 5);
  const DefragPlan plan = pool.defrag();
  EXPECT_EQ(plan.moves.size(), 5u);
  EXPECT_EQ(pool.pages(1), (Pages{0, 1, 2, 3}));
  EXPECT_EQ(pool.pages(2), (Pages{4, 5, 6}));
  EXPECT_EQ(pool.pages(3), (Pages{7, 8, 9}));
  apply_both_ways(pool, plan, &cache, model, "naive wins");
}

TEST(KvPoolDefrag, ChainRunsFromItsFreeEnd) {
  // Request 1 keeps pages 1, 2 and needs page 3 for its third page; request 2 leaves page 3 for
  // the free page 0 first. Naive packing would move three pages.
  KvPool pool = make_layout(6, 1, {{1, {1, 2, 4}}, {2, {3}}});
  TaggedCache cache(pool.config());
  const Model model = fill_all(pool, &cache);
  EXPECT_EQ(naive_moves(pool), 3);
  const DefragPlan plan = pool.defrag();
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(plan.moves[0].src, 3);
  EXPECT_EQ(plan.moves[0].dst, 0);
  EXPECT_EQ(plan.moves[1].src, 4);
  EXPECT_EQ(plan.moves[1].dst, 3);
  EXPECT_EQ(plan.wave_offsets, (Pages{0, 1, 2}));
  EXPECT_EQ(pool.pages(1), (Pages{1, 2, 3}));
  EXPECT_EQ(pool.pages(2), (Pages{0}));
  apply_both_ways(pool, plan, &cache, model, "chain");
}

TEST(KvPoolDefrag, CycleUsesOneFreePageAsScratch) {
  // Request 1 holds pages 1, 0 and request 2 page 2: every packing swaps two pages.
  KvPool pool = make_layout(4, 8, {{1, {1, 0}}, {2, {2}}});
  TaggedCache cache(pool.config());
  const Model model = fill_all(pool, &cache);
  const DefragPlan plan = pool.defrag();
  EXPECT_EQ(plan.moves.size(), 3u);
  EXPECT_EQ(plan.pages_relocated, 2);
  EXPECT_EQ(plan.wave_offsets, (Pages{0, 1, 2, 3}));
  EXPECT_EQ(plan.moves.front().dst, 3);  // the only free page
  EXPECT_EQ(plan.moves.back().src, 3);
  apply_both_ways(pool, plan, &cache, model, "cycle");
  EXPECT_EQ(pool.metrics().fraction_contiguous, 1.0);
  EXPECT_EQ(pool.free_list(), (Pages{3}));
}

TEST(KvPoolDefrag, FullPoolWithCycleFailsUnchanged) {
  KvPool pool = make_layout(3, 8, {{1, {1, 0}}, {2, {2}}});
  expect_error_unchanged(
      pool, [&] { pool.defrag(); }, "scratch");
  // In a full pool every relocation is part of a cycle; one that needs no move is fine.
  KvPool packed = make_layout(3, 8, {{1, {0}}, {2, {1, 2}}});
  EXPECT_TRUE(packed.defrag().moves.empty());
}

TEST(KvPoolDefrag, PartialDefragRespectsBudgetAndTouchesOnlyMovedRequests) {
  auto layout = [] { return make_layout(8, 4, {{1, {0, 2}}, {2, {1, 3}}}); };
  {
    KvPool pool = layout();
    const KvPool before = pool;
    const DefragPlan plan = pool.partial_defrag(0);
    EXPECT_TRUE(plan.moves.empty());
    EXPECT_TRUE(pool.pages(1) == before.pages(1) && pool.pages(2) == before.pages(2));
  }
  {
    KvPool pool = layout();
    TaggedCache cache(pool.config());
    const Model model = fill_all(pool, &cache);
    const DefragPlan plan = pool.partial_defrag(2);
    EXPECT_EQ(plan.moves.size(), 2u);
    EXPECT_EQ(pool.pages(1), (Pages{4, 5}));
    EXPECT_EQ(pool.pages(2), (Pages{1, 3}));
    apply_both_ways(pool, plan, &cache, model, "partial 2");
  }
  {
    KvPool pool = layout();
    TaggedCache cache(pool.config());
    const Model model = fill_all(pool, &cache);
    // With request 1 out of the way, request 2 keeps page 1 and takes the freed page 2.
    const DefragPlan plan = pool.partial_defrag(100);
    EXPECT_EQ(plan.moves.size(), 3u);
    EXPECT_EQ(pool.pages(1), (Pages{4, 5}));
    EXPECT_EQ(pool.pages(2), (Pages{1, 2}));
    apply_both_ways(pool, plan, &cache, model, "partial 100");
  }
}

TEST(KvPoolDefrag, PartialDefragTakesTheCheapestRequestsFirst) {
  // Requests 1 and 2 each need one move (their third page into the free page after their
  // second), request 3 three (it keeps page 10 and takes 11, 12, 13). With a budget of 3 the
  // cheapest first means requests 1 and 2 (2 moves; request 3 would make 5); the costliest first
  // would have spent the budget on request 3 alone.
  auto layout = [] {
    return make_layout(20, 1, {{1, {0, 1, 3}}, {2, {5, 6, 8}}, {3, {10, 12, 14, 16}}});
  };
  for (int64_t budget : {3, 4}) {
    KvPool pool = layout();
    TaggedCache cache(pool.config());
    const Model model = fill_all(pool, &cache);
    const DefragPlan plan = pool.partial_defrag(budget);
    SCOPED_TRACE("budget " + std::to_string(budget));
    ASSERT_EQ(plan.moves.size(), 2u);
    EXPECT_EQ(plan.moves[0].src, 3);  // request 1 first (equal cost: in id order)
    EXPECT_EQ(plan.moves[0].dst, 2);
    EXPECT_EQ(plan.moves[1].src, 8);
    EXPECT_EQ(plan.moves[1].dst, 7);
    EXPECT_EQ(pool.pages(1), (Pages{0, 1, 2}));
    EXPECT_EQ(pool.pages(2), (Pages{5, 6, 7}));
    EXPECT_EQ(pool.pages(3), (Pages{10, 12, 14, 16}));
    apply_both_ways(pool, plan, &cache, model, "cheapest first");
  }
  KvPool pool = layout();
  TaggedCache cache(pool.config());
  const Model model = fill_all(pool, &cache);
  const DefragPlan plan = pool.partial_defrag(5);  // room for all three, still cheapest first
  ASSERT_EQ(plan.moves.size(), 5u);
  EXPECT_EQ(plan.moves[0].src, 3);
  EXPECT_EQ(plan.moves[1].src, 8);
  EXPECT_EQ(pool.pages(3), (Pages{10, 11, 12, 13}));
  apply_both_ways(pool, plan, &cache, model, "all three");
}

TEST(KvPoolDefrag, PartialDefragCountsScratchHopsInTheCost) {
  // Request 1 holds pages 1, 0 and cannot shift right (request 3 holds page 2), so it must swap
  // its two pages in place: 2 relocations, 3 moves with the scratch hop. Request 2 (pages 4, 6,
  // 9) relocates 2 pages in a chain: 2 moves. With a budget of 3 the cheaper request 2 goes
  // first, and then request 1 no longer fits.
  KvPool pool = make_layout(12, 1, {{1, {1, 0}}, {2, {4, 6, 9}}, {3, {2}}});
  TaggedCache cache(pool.config());
  const Model model = fill_all(pool, &cache);
  const DefragPlan plan = pool.partial_defrag(3);
  EXPECT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(pool.pages(1), (Pages{1, 0}));
  EXPECT_EQ(pool.pages(2), (Pages{4, 5, 6}));
  apply_both_ways(pool, plan, &cache, model, "scratch hops");
}

// Random churn: allocs, extends, truncates and frees until the pool is fragmented.
void churn(KvPool* pool, std::mt19937* rng, int steps) {
  const int64_t cap = int64_t{pool->config().num_pages} * pool->config().page_size;
  int64_t next_id = 0;
  for (int s = 0; s < steps; ++s) {
    const std::vector<int64_t> ids = pool->request_ids();
    const int op = static_cast<int>((*rng)() % 4);
    try {
      if (op == 0 || ids.empty()) {
        pool->alloc(next_id++, static_cast<int64_t>((*rng)() % (cap / 6 + 1)));
      } else {
        const int64_t id = ids[(*rng)() % ids.size()];
        if (op == 1) pool->extend(id, static_cast<int64_t>((*rng)() % (cap / 8 + 1)));
        const int64_t n = pool->num_tokens(id);
        if (op == 2) pool->truncate(id, static_cast<int64_t>((*rng)() % (n + 1)));
        if (op == 3 && (*rng)() % 3 == 0) pool->free(id);
      }
    } catch (const Error&) {  // over-allocation: fine here
    }
  }
}

TEST(KvPoolDefrag, RandomChurnedPools) {
  int infeasible = 0, cheaper = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    std::mt19937 rng(seed);
    const int32_t np = 1 + static_cast<int32_t>(rng() % 160);
    const int32_t ps = (rng() % 2) ? 1 : 16;
    const FreePolicy policy = (rng() % 2) ? FreePolicy::kSorted : FreePolicy::kAsFreed;
    KvPool pool(make_config(np, ps, policy));
    churn(&pool, &rng, 20 + static_cast<int>(rng() % 200));
    SCOPED_TRACE("seed " + std::to_string(seed) + " num_pages " + std::to_string(np) +
                 " page_size " + std::to_string(ps));
    TaggedCache cache(pool.config());
    const Model model = fill_all(pool, &cache);
    const KvPool before = pool;
    const int64_t naive = naive_moves(pool);
    DefragPlan plan;
    try {
      plan = pool.defrag();
    } catch (const Error& e) {
      // Only a full pool whose every packing has a cycle may fail.
      EXPECT_EQ(naive, -1) << e.message();
      EXPECT_EQ(pool.num_free_pages(), 0);
      EXPECT_TRUE(pool == before);
      ++infeasible;
      continue;
    }
    if (naive >= 0) {
      EXPECT_LE(static_cast<int64_t>(plan.moves.size()), naive);
    }
    cheaper += naive >= 0 && static_cast<int64_t>(plan.moves.size()) < naive;
    ASSERT_TRUE(ownership_ok(pool));
    int64_t relocated = 0;
    std::map<int64_t, Pages> tables;
    for (const auto& u : plan.tables) tables[u.request] = u.pages;
    for (int64_t id : pool.request_ids()) {
      const Pages& now = pool.pages(id);
      EXPECT_LE(count_runs(now), 1) << "request " << id;
      const Pages& old = before.pages(id);
      for (size_t k = 0; k < now.size(); ++k) relocated += now[k] != old[k];
      if (now != old) {
        EXPECT_EQ(tables[id], now) << "request " << id;
      } else {
        EXPECT_EQ(tables.count(id), 0u) << "request " << id;
      }
    }
    EXPECT_EQ(plan.pages_relocated, relocated);
    EXPECT_GE(static_cast<int64_t>(plan.moves.size()), relocated);
    EXPECT_EQ(pool.metrics().fraction_contiguous, 1.0);
    const Pages free_pages = pool.free_list();
    EXPECT_TRUE(std::is_sorted(free_pages.begin(), free_pages.end()));
    apply_both_ways(pool, plan, &cache, model, "full defrag");
  }
  // The overlap packing must beat the naive one somewhere, or the comparison proves nothing.
  EXPECT_GT(cheaper, 20);
  EXPECT_LT(infeasible, 100);
}

TEST(KvPoolDefrag, RandomPartialDefrag) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const int32_t np = 4 + static_cast<int32_t>(rng() % 100);
    KvPool pool(make_config(np, 4, FreePolicy::kAsFreed));
    churn(&pool, &rng, 30 + static_cast<int>(rng() % 100));
    SCOPED_TRACE("seed " + std::to_string(seed));
    TaggedCache cache(pool.config());
    const Model model = fill_all(pool, &cache);
    const KvPool before = pool;
    const int64_t budget = static_cast<int64_t>(rng() % 24);
    const DefragPlan plan = pool.partial_defrag(budget);
    EXPECT_LE(static_cast<int64_t>(plan.moves.size()), budget);
    ASSERT_TRUE(ownership_ok(pool));
    std::set<int64_t> moved;
    for (const auto& u : plan.tables) moved.insert(u.request);
    for (int64_t id : pool.request_ids()) {
      if (moved.count(id)) {
        EXPECT_EQ(count_runs(pool.pages(id)), 1) << "request " << id;
        EXPECT_GT(count_runs(before.pages(id)), 1) << "request " << id;
      } else {
        EXPECT_EQ(pool.pages(id), before.pages(id)) << "request " << id;
      }
    }
    EXPECT_LE(pool.metrics().total_runs, before.metrics().total_runs);
    apply_both_ways(pool, plan, &cache, model, "partial defrag");
  }
}

}  // namespace
}  // namespace treemla::kvpool::test
