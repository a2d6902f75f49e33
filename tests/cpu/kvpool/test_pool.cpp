// treemla tests: KV pool allocation, policies, page tables, metrics and errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/kvpool/kvpool_test_util.h"

namespace treemla::kvpool::test {
namespace {

using Pages = std::vector<int32_t>;

TEST(KvPoolConfig, RejectsBadSizes) {
  auto expect_bad = [](PoolConfig c, const char* needle) {
    try {
      KvPool pool(c);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  };
  expect_bad(make_config(0, 16), "num_pages");
  expect_bad(make_config(-3, 16), "num_pages");
  expect_bad(make_config(8, 0), "page_size");
  expect_bad(make_config(8, 24), "page_size");
  expect_bad(make_config(8, -16), "page_size");
  expect_bad(make_config(8, 1 << 17), "page_size = 131072 must be a power of two in [1, 65536]");
  expect_bad(make_config(8, 16, FreePolicy::kAsFreed, 0), "row_width");
  expect_bad(make_config(8, 16, FreePolicy::kAsFreed, 4, 0), "elem_size");
  expect_bad(make_config(8, 16, static_cast<FreePolicy>(7)), "policy");
  const int32_t big = std::numeric_limits<int32_t>::max();
  expect_bad(make_config(big, 1 << 16, FreePolicy::kSorted, 1 << 20), "overflows");
  KvPool ok(make_config(3, 1, FreePolicy::kSorted, 576, 2));
  EXPECT_EQ(ok.config().row_bytes(), 1152);
  EXPECT_EQ(ok.config().page_bytes(), 1152);
  EXPECT_EQ(ok.free_list(), (Pages{0, 1, 2}));
}

TEST(KvPool, AllocExtendTruncateFree) {
  KvPool pool(make_config(8, 4));
  EXPECT_EQ(pool.free_list(), (Pages{0, 1, 2, 3, 4, 5, 6, 7}));
  pool.alloc(7, 5);  // 2 pages, the second partly filled
  EXPECT_EQ(pool.pages(7), (Pages{0, 1}));
  EXPECT_EQ(pool.num_tokens(7), 5);
  pool.extend(7, 3);  // fills the partial page: no new page
  EXPECT_EQ(pool.pages(7), (Pages{0, 1}));
  EXPECT_EQ(pool.num_tokens(7), 8);
  pool.extend(7, 1);
  EXPECT_EQ(pool.pages(7), (Pages{0, 1, 2}));
  pool.extend(7, 0);
  EXPECT_EQ(pool.num_tokens(7), 9);
  pool.alloc(-4, 0);  // a request with no rows holds no page
  EXPECT_TRUE(pool.pages(-4).empty());
  pool.extend(-4, 1);
  EXPECT_EQ(pool.pages(-4), (Pages{3}));
  pool.truncate(7, 5);  // keeps the partly filled page 1
  EXPECT_EQ(pool.pages(7), (Pages{0, 1}));
  EXPECT_EQ(pool.num_tokens(7), 5);
  pool.truncate(7, 4);
  EXPECT_EQ(pool.pages(7), (Pages{0}));
  pool.truncate(7, 4);
  EXPECT_EQ(pool.pages(7), (Pages{0}));
  EXPECT_EQ(pool.request_ids(), (std::vector<int64_t>{-4, 7}));
  EXPECT_EQ(pool.locate(7, 3).page, 0);
  EXPECT_EQ(pool.locate(7, 3).slot, 3);
  pool.free(7);
  EXPECT_FALSE(pool.contains(7));
  EXPECT_TRUE(pool.contains(-4));
  pool.free(-4);
  EXPECT_EQ(pool.num_free_pages(), 8);
  EXPECT_TRUE(ownership_ok(pool));
  pool.alloc(7, 3);    // an id is usable again after free
  pool.extend(7, 27);  // takes exactly the 7 free pages
  EXPECT_EQ(pool.num_free_pages(), 0);
  pool.extend(7, 2);  // fills the last page of a full pool: no new page needed
  EXPECT_EQ(pool.num_tokens(7), 32);
  pool.alloc(8, 0);  // nor for an empty request
  EXPECT_TRUE(ownership_ok(pool));
}

TEST(KvPool, AsFreedAppendsInFreeOrderAndPopsFromHead) {
  KvPool pool(make_config(8, 2, FreePolicy::kAsFreed));
  pool.alloc(1, 6);  // pages 0 1 2
  pool.alloc(2, 4);  // pages 3 4
  pool.alloc(3, 2);  // page 5
  EXPECT_EQ(pool.free_list(), (Pages{6, 7}));
  pool.free(2);         // appended in page-table order
  pool.truncate(1, 1);  // releases 1, 2 in that order
  pool.free(3);
  EXPECT_EQ(pool.free_list(), (Pages{6, 7, 3, 4, 1, 2, 5}));
  pool.alloc(4, 5);  // three pages from the head
  EXPECT_EQ(pool.pages(4), (Pages{6, 7, 3}));
  pool.extend(1, 3);  // request 1: 4 tokens, one new page
  EXPECT_EQ(pool.pages(1), (Pages{0, 4}));
  EXPECT_EQ(pool.free_list(), (Pages{1, 2, 5}));
  EXPECT_TRUE(ownership_ok(pool));
}

TEST(KvPool, SortedTakesLowest) {
  KvPool pool(make_config(8, 2, FreePolicy::kSorted));
  pool.alloc(1, 6);  // 0 1 2
  pool.alloc(2, 4);  // 3 4
  pool.alloc(3, 2);  // 5
  pool.free(2);
  pool.truncate(1, 1);
  EXPECT_EQ(pool.free_list(), (Pages{1, 2, 3, 4, 6, 7}));
  pool.alloc(4, 5);
  EXPECT_EQ(pool.pages(4), (Pages{1, 2, 3}));
  pool.free(3);
  pool.extend(1, 3);
  EXPECT_EQ(pool.pages(1), (Pages{0, 4}));
  EXPECT_EQ(pool.free_list(), (Pages{5, 6, 7}));
  EXPECT_TRUE(ownership_ok(pool));
}

TEST(KvPool, PageTableRowPads) {
  KvPool pool = make_layout(8, 16, {{5, {6, 2, 3}}});
  EXPECT_EQ(pool.page_table_row(5, 5, -1), (Pages{6, 2, 3, -1, -1}));
  int32_t row[3] = {9, 9, 9};
  pool.page_table_row(5, row, 3, 0);
  EXPECT_EQ(Pages(row, row + 3), (Pages{6, 2, 3}));
  expect_error_unchanged(
      pool, [&] { pool.page_table_row(5, 2, -1); }, "stride");
  expect_error_unchanged(
      pool, [&] { pool.page_table_row(5, nullptr, 4, 0); }, "null");
  expect_error_unchanged(
      pool, [&] { pool.page_table_row(6, 4, 0); }, "unknown request 6");
}

TEST(KvPoolErrors, LeaveThePoolUnchanged) {
  KvPool pool = make_layout(8, 4, {{1, {3, 0}}, {2, {5}}});
  pool.truncate(2, 2);
  expect_error_unchanged(
      pool, [&] { pool.alloc(1, 4); }, "already exists");
  expect_error_unchanged(
      pool, [&] { pool.alloc(9, -1); }, "num_tokens");
  expect_error_unchanged(
      pool, [&] { pool.alloc(9, 5 * 4 + 1); }, "only 5 free");
  expect_error_unchanged(
      pool, [&] { pool.alloc(9, std::numeric_limits<int64_t>::max()); }, "capacity");
  expect_error_unchanged(
      pool, [&] { pool.extend(2, 2 + 5 * 4 + 1); }, "only 5 free");
  expect_error_unchanged(
      pool, [&] { pool.extend(2, std::numeric_limits<int64_t>::max()); }, "capacity");
  expect_error_unchanged(
      pool, [&] { pool.extend(2, -1); }, "num_tokens");
  expect_error_unchanged(
      pool, [&] { pool.extend(3, 1); }, "unknown request 3");
  expect_error_unchanged(
      pool, [&] { pool.truncate(2, 3); }, "[0, 2]");
  expect_error_unchanged(
      pool, [&] { pool.truncate(2, -1); }, "[0, 2]");
  expect_error_unchanged(
      pool, [&] { pool.locate(2, 2); }, "row");
  expect_error_unchanged(
      pool, [&] { pool.num_tokens(3); }, "unknown request");
  pool.free(2);
  expect_error_unchanged(
      pool, [&] { pool.free(2); }, "already freed");  // double free
  expect_error_unchanged(
      pool, [&] { pool.partial_defrag(-1); }, "max_moves");
  // Exactly the free pages still fit.
  pool.alloc(9, 6 * 4);
  EXPECT_EQ(pool.num_free_pages(), 0);
  expect_error_unchanged(
      pool, [&] { pool.extend(9, 1); }, "only 0 free");
  EXPECT_TRUE(ownership_ok(pool));
  EXPECT_NO_THROW(pool.check_invariants());
}

TEST(KvPoolMetrics, HandMadeLayouts) {
  EXPECT_EQ(count_runs(Pages{}), 0);
  EXPECT_EQ(count_runs(Pages{4}), 1);
  EXPECT_EQ(count_runs(Pages{4, 5, 6}), 1);
  EXPECT_EQ(count_runs(Pages{6, 5, 4}), 3);  // descending is not contiguous
  EXPECT_EQ(count_runs(Pages{0, 1, 5, 6, 7, 2}), 3);

  KvPool empty(make_config(10, 1));
  PoolMetrics m0 = empty.metrics();
  EXPECT_EQ(m0.num_requests, 0);
  EXPECT_EQ(m0.pages_free, 10);
  EXPECT_EQ(m0.largest_free_run, 10);
  EXPECT_EQ(m0.mean_run_length, 0.0);
  EXPECT_EQ(m0.fraction_contiguous, 1.0);

  // Pages: 0 1 2 3 4 5 6 7 8 9 10 11
  //        a a b . a b b . . c  c  .     (d holds no page)
  KvPool pool = make_layout(12, 16, {{1, {0, 1, 4}}, {2, {2, 5, 6}}, {3, {9, 10}}});
  pool.alloc(4, 0);
  EXPECT_EQ(pool.runs(1), 2);
  EXPECT_EQ(pool.runs(2), 2);
  EXPECT_EQ(pool.runs(3), 1);
  EXPECT_EQ(pool.runs(4), 0);
  const PoolMetrics m = pool.metrics();
  EXPECT_EQ(m.num_requests, 4);
  EXPECT_EQ(m.pages_used, 8);
  EXPECT_EQ(m.pages_free, 4);
  EXPECT_EQ(m.total_runs, 5);
  EXPECT_DOUBLE_EQ(m.mean_run_length, 8.0 / 5.0);
  EXPECT_EQ(m.largest_free_run, 2);                    // pages 7, 8
  EXPECT_DOUBLE_EQ(m.fraction_contiguous, 2.0 / 4.0);  // c and the empty d
}

}  // namespace
}  // namespace treemla::kvpool::test
