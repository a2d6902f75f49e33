// The one check of a paged cache's geometry (treemla/paged_cache.h): every bound has one rule and
// one message, whichever struct carries the fields (VerifyParams, kvpool::PoolConfig).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "treemla/attention.h"
#include "treemla/kvpool.h"
#include "treemla/paged_cache.h"

namespace {

using namespace treemla;
using test::expect_error;

PagedCacheLayout good() { return {8, 16, kHeadDimQK, 2, 4}; }

TEST(PagedCache, AcceptsTheCornersOfEveryBound) {
  for (int32_t ps : {1, 2, 64, kMaxPageSize}) {
    PagedCacheLayout l = good();
    l.page_size = ps;
    EXPECT_NO_THROW(validate(l));
  }
  PagedCacheLayout l = good();
  l.num_pages = 1;
  l.row_width = 1;
  l.elem_size = 1;
  l.page_table_stride = 0;  // a page table without columns: no request needs a page
  EXPECT_NO_THROW(validate(l));
}

TEST(PagedCache, NamesTheFieldAndTheBound) {
  struct Bad {
    std::function<void(PagedCacheLayout&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Bad> bad = {
      {[](PagedCacheLayout& l) { l.num_pages = 0; }, {"num_pages = 0", ">= 1"}},
      {[](PagedCacheLayout& l) { l.page_size = 0; },
       {"page_size = 0", "power of two in [1, 65536]"}},
      {[](PagedCacheLayout& l) { l.page_size = 24; }, {"page_size = 24", "power of two"}},
      {[](PagedCacheLayout& l) { l.page_size = 1 << 17; }, {"page_size = 131072", "65536"}},
      {[](PagedCacheLayout& l) { l.page_size = -16; }, {"page_size = -16"}},
      {[](PagedCacheLayout& l) { l.row_width = 0; }, {"row_width = 0", ">= 1"}},
      {[](PagedCacheLayout& l) { l.elem_size = -2; }, {"elem_size = -2", ">= 1"}},
      {[](PagedCacheLayout& l) { l.page_table_stride = -1; }, {"page_table_stride = -1", ">= 0"}},
      // A page of 65536 rows of (2^31 - 1)^2 bytes does not fit in int64 ...
      {[](PagedCacheLayout& l) {
         l = {1, kMaxPageSize, INT32_MAX, INT32_MAX, 0};
       },
       {"overflows int64", "elem_size = 2147483647"}},
      // ... a page of 2^36 bytes does, but not 2^31 - 1 of them.
      {[](PagedCacheLayout& l) {
         l = {INT32_MAX, kMaxPageSize, 1 << 20, 1, 0};
       },
       {"overflows int64", "num_pages = 2147483647"}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "bad case " << i);
    PagedCacheLayout l = good();
    bad[i].edit(l);
    expect_error([&] { validate(l); }, bad[i].parts);
  }
}

TEST(PagedCache, PrefixNamesTheCacheFieldsOnly) {
  PagedCacheLayout l = good();
  l.page_size = 3;
  expect_error([&] { validate(l, "cache."); }, {"cache.page_size = 3"});
  l = good();
  l.page_table_stride = -2;  // the stride belongs to the call, not to the cache
  try {
    validate(l, "cache.");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "page_table_stride = -2 must be >= 0");
  }
}

// The verify call and the pool say the same thing about the same bad field.
TEST(PagedCache, VerifyParamsAndPoolConfigShareTheRules) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("accepted");
  };
  for (int32_t ps : {0, 12, 1 << 17}) {
    VerifyParams p;
    p.batch = 1;
    p.num_heads = 1;
    p.page_size = ps;
    p.num_pages = 4;
    kvpool::PoolConfig c{4, ps, kHeadDimQK, 2, kvpool::FreePolicy::kAsFreed};
    const std::string want =
        "page_size = " + std::to_string(ps) + " must be a power of two in [1, 65536]";
    EXPECT_EQ(message([&] { cpu::validate(p); }), want);
    EXPECT_EQ(message([&] { kvpool::validate(c); }), want);
  }
  kvpool::PoolConfig c{0, 16, kHeadDimQK, 2, kvpool::FreePolicy::kAsFreed};
  EXPECT_EQ(message([&] { kvpool::validate(c); }), "num_pages = 0 must be >= 1");
  EXPECT_EQ(c.layout().page_table_stride, 0);
  EXPECT_EQ(cache_layout_of([] {
              VerifyParams p;
              p.dtype = DType::kFP32;
              return p;
            }())
                .elem_size,
            4);
}

TEST(PagedCache, SingleBoundsNameTheCallersField) {
  expect_error([] { check_page_table_stride(-1, "stride"); }, {"stride = -1 must be >= 0"});
  expect_error([] { check_num_pages(0, "num_pages"); }, {"num_pages = 0 must be >= 1"});
  expect_error([] { check_page_size(48, "cost page size"); }, {"cost page size = 48"});
  EXPECT_NO_THROW(check_page_table_stride(0, "stride"));
}

}  // namespace
