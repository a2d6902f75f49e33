// The test helpers in tests/common: tree masks, case layout, poisoning, all_close.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "common/compare.h"
#include "common/expect_error.h"
#include "common/verify_case.h"

namespace {

using namespace treemla;
using test::all_close;
using test::Tolerance;

TEST(TestHelpers, TreeMaskRowsAreAncestorSets) {
  // 0 <- 1 <- 3, 0 <- 2, and node 4's parent is 3: row 4 = {0, 1, 3, 4}.
  const std::vector<int> parent = {-1, 0, 0, 1, 3};
  std::vector<uint64_t> mask = {42};  // appended after existing rows
  test::append_tree_mask(parent, 2, mask);
  ASSERT_EQ(mask.size(), 1u + 5 * 2);
  const uint64_t want[] = {0b1, 0b11, 0b101, 0b1011, 0b11011};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(mask[1 + 2 * i], want[i]) << "row " << i;
    EXPECT_EQ(mask[2 + 2 * i], 0u) << "row " << i;
  }
  // Past one word: a chain of 70 has all of 0..i set.
  std::vector<int> chain(70);
  for (int i = 0; i < 70; ++i) chain[i] = i - 1;
  std::vector<uint64_t> m;
  test::append_tree_mask(chain, 2, m);
  EXPECT_EQ(m[2 * 69], ~uint64_t{0});
  EXPECT_EQ(m[2 * 69 + 1], (uint64_t{1} << 6) - 1);
}

TEST(TestHelpers, RandomParentsAreValidTrees) {
  std::mt19937 rng(1);
  for (auto kind : {test::TreeKind::kChain, test::TreeKind::kStar, test::TreeKind::kRandom,
                    test::TreeKind::kDeep}) {
    const std::vector<int> parent = test::random_parents(kind, 300, rng);
    ASSERT_EQ(parent[0], -1);
    int max_depth = 0;
    for (int i = 1; i < 300; ++i) {
      ASSERT_GE(parent[i], 0);
      ASSERT_LT(parent[i], i);
      max_depth = std::max(max_depth, test::node_depth(parent, i));
    }
    if (kind == test::TreeKind::kChain) {
      EXPECT_EQ(max_depth, 299);
    } else if (kind == test::TreeKind::kStar) {
      EXPECT_EQ(max_depth, 1);
    } else if (kind == test::TreeKind::kDeep) {
      EXPECT_GT(max_depth, 150);
    }
  }
}

TEST(TestHelpers, CaseLayoutAndPoison) {
  test::CaseSpec s = test::make_spec(1, 2, 1, 0, 16, DType::kFP16, test::TreeKind::kRandom);
  s.q_lens = {5, 0, 40};
  s.prefix_lens = {30, 7, 0};
  const test::VerifyCase c(s, 9);
  ASSERT_EQ(c.batch, 3);
  EXPECT_EQ(c.q_indptr, (std::vector<int32_t>{0, 5, 5, 45}));
  EXPECT_EQ(c.mask_words, 1);
  // Pages: 3 + 1 + 3 used, all distinct and in range; the rest of each row is poisoned.
  std::set<int32_t> seen;
  const int need[] = {3, 1, 3};
  for (int b = 0; b < 3; ++b)
    for (int j = 0; j < c.page_table_stride; ++j) {
      const int32_t page = c.page_table[b * c.page_table_stride + j];
      if (j < need[b]) {
        EXPECT_TRUE(page >= 0 && page < c.num_pages && seen.insert(page).second) << b << "," << j;
      } else {
        EXPECT_EQ(page, test::kPoisonPageIndex) << b << "," << j;
      }
    }
  EXPECT_GT(c.num_pages, 7);  // at least one unused page
  // Exactly the slots of live logical rows are finite.
  int64_t live = 0;
  for (int64_t slot = 0; slot < static_cast<int64_t>(c.slot_used.size()); ++slot) {
    const bool finite =
        std::isfinite(load_as_float(c.kv_cache.data(), slot * kHeadDimQK + 7, c.spec.dtype));
    EXPECT_EQ(finite, c.slot_used[slot] != 0) << "slot " << slot;
    live += c.slot_used[slot];
  }
  EXPECT_EQ(live, 35 + 7 + 40);
  // The same seed without poison has the same live data and finite filler.
  s.poison = false;
  const test::VerifyCase clean(s, 9);
  EXPECT_EQ(clean.q, c.q);
  EXPECT_EQ(clean.tree_mask, c.tree_mask);
  for (int64_t slot = 0; slot < static_cast<int64_t>(c.slot_used.size()); ++slot)
    for (int col : {0, 575}) {
      const float a = load_as_float(c.kv_cache.data(), slot * kHeadDimQK + col, c.spec.dtype);
      const float b = load_as_float(clean.kv_cache.data(), slot * kHeadDimQK + col, c.spec.dtype);
      ASSERT_TRUE(std::isfinite(b));
      if (c.slot_used[slot]) {
        ASSERT_EQ(a, b) << "slot " << slot;
      }
    }
}

TEST(TestHelpers, SingleKindMakesOneNodePerRequest) {
  test::CaseSpec s = test::make_spec(4, 1, 9, 3, 16, DType::kBF16, test::TreeKind::kSingle);
  const test::VerifyCase c(s, 2);
  EXPECT_EQ(c.total_q, 4);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(c.tree_mask[b], 1u);
}

TEST(TestHelpers, PeakRowsAtBoundaries) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(test::rows_around({0, 32, 100}, 64), (V{0, 31, 32}));
  EXPECT_EQ(test::block_edge_rows(100), (V{0, 31, 32, 63, 64, 95, 96, 99}));
  EXPECT_EQ(test::block_edge_rows(262144, 32, 3),
            (V{0, 31, 32, 131071, 131072, 262111, 262112, 262143}));
  EXPECT_EQ(test::block_edge_rows(1), (V{0}));
  EXPECT_TRUE(test::block_edge_rows(0).empty());
}

// Logit of (node, head) row r of request b on logical key row t, from the stored values.
double logit_of(const test::VerifyCase& c, int b, int r, int64_t t) {
  const int64_t qbase = (static_cast<int64_t>(c.q_indptr[b]) * c.num_heads + r) * kHeadDimQK;
  double d = 0;
  for (int col = 0; col < kHeadDimQK; ++col)
    d += double(load_as_float(c.q.data(), qbase + col, c.spec.dtype)) *
         load_as_float(c.kv_cache.data(), c.kv_index(b, t, col), c.spec.dtype);
  return d * c.spec.sm_scale;
}

TEST(TestHelpers, PeaksRaiseTheLogitsTheyAimAt) {
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    test::CaseSpec s = test::make_spec(1, 2, 1, 0, 16, dtype, test::TreeKind::kRandom);
    s.q_lens = {5, 3};
    s.prefix_lens = {300, 40};
    s.peaks = true;
    const std::vector<std::vector<int64_t>> aims = {{0, 31, 32, 299, 300},
                                                    {5, 42}};  // 300, 42: tail nodes 0 and 2
    test::VerifyCase plain(s, 17), c(s, 17);
    c.plant_peaks(aims);
    SCOPED_TRACE(c.describe());
    EXPECT_EQ(c.peak_rows, aims);
    test::VerifyCase again(s, 17);
    again.plant_peaks(aims);
    EXPECT_EQ(again.q, c.q);
    EXPECT_EQ(again.kv_cache, c.kv_cache);
    for (int b = 0; b < 2; ++b) {
      const double height = std::log(double(c.prefix_lens[b] + c.q_len(b)));
      const int rows = c.q_len(b) * c.num_heads;
      std::vector<int> hits(aims[b].size(), 0);
      for (int r = 0; r < rows; ++r) {
        const int64_t qbase = (static_cast<int64_t>(c.q_indptr[b]) * c.num_heads + r) * kHeadDimQK;
        double common = 0;  // the shift every ordinary key's logit shares
        for (int col = 0; col < kHeadDimV; ++col)
          common += load_as_float(c.q.data(), qbase + col, dtype) * c.v_offset[col];
        common *= c.spec.sm_scale;
        int mine = 0;
        for (size_t k = 0; k < aims[b].size(); ++k)
          if (std::fabs(logit_of(c, b, r, aims[b][k]) - common - height) < 0.3) ++hits[k], ++mine;
        if (rows >= 4 && r % 4 == 3) {  // not peaked: q untouched
          for (int col = 0; col < kHeadDimQK; ++col)
            ASSERT_EQ(load_as_float(c.q.data(), qbase + col, dtype),
                      load_as_float(plain.q.data(), qbase + col, dtype));
        } else {
          EXPECT_GE(mine, 1) << "request " << b << " row " << r;
        }
      }
      for (size_t k = 0; k < aims[b].size(); ++k) {
        EXPECT_GE(hits[k], 1) << "request " << b << " key row " << aims[b][k]
                              << " is no row's peak";
        for (int col : {0, 200, 511})  // value rows: -v_offset + noise / 2
          EXPECT_NEAR(load_as_float(c.kv_cache.data(), c.kv_index(b, aims[b][k], col), dtype),
                      -c.v_offset[col], 0.52);
      }
    }
    // The poison is untouched.
    for (int64_t slot = 0; slot < static_cast<int64_t>(c.slot_used.size()); ++slot)
      ASSERT_EQ(std::isfinite(load_as_float(c.kv_cache.data(), slot * kHeadDimQK + 3, dtype)),
                c.slot_used[slot] != 0);
  }
}

TEST(TestHelpers, PlantPeaksRejectsBadInput) {
  test::CaseSpec s = test::make_spec(1, 2, 3, 50, 16);
  test::VerifyCase plain(s, 3);
  test::expect_error([&] { plain.plant_peaks({{1}}); }, {"spec.peaks"});
  s.peaks = true;
  test::VerifyCase c(s, 3);
  test::expect_error([&] { c.plant_peaks({{1}, {2}}); }, {"2 lists for a batch of 1"});
  test::expect_error([&] { c.plant_peaks({{53}}); }, {"key row 53 of request 0", "[0, 53)"});
  c.plant_peaks({{52}});
  test::expect_error([&] { c.plant_peaks({{1}}); }, {"once"});
}

TEST(TestHelpers, AllCloseChecksNonFinitePositionsFirst) {
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(all_close({1.f, -inf, nan}, {1.f, -inf, nan}, Tolerance{}));
  EXPECT_FALSE(all_close({1.f, -inf}, {1.f, inf}, Tolerance{1, 1}));
  EXPECT_FALSE(all_close({1.f, 0.f}, {1.f, nan}, Tolerance{1, 1}));
  EXPECT_FALSE(all_close({-inf}, {-1e30f}, Tolerance{1e31, 1}));
  EXPECT_FALSE(all_close({1.f}, {1.f, 2.f}, Tolerance{1, 1}));
  const auto r = all_close({1.f, -inf}, {1.f, 3.f}, Tolerance{1, 1}, "lse", {1, 2});
  EXPECT_NE(std::string(r.message()).find("inf/NaN position"), std::string::npos) << r.message();
  EXPECT_NE(std::string(r.message()).find("1 [0, 1]"), std::string::npos) << r.message();
}

TEST(TestHelpers, AllCloseReportsTheWorstElement) {
  // Bound = atol + rtol |expected|: element 1 (err 0.5 against bound 0.2) is worse than
  // element 2 (err 3 against bound 10.1).
  const std::vector<float> want = {0.f, 1.f, 100.f, 5.f};
  EXPECT_TRUE(all_close({0.05f, 1.1f, 103.f, 5.f}, want, Tolerance{0.1, 0.1}));
  const auto r = all_close({0.05f, 1.5f, 103.f, 5.f}, want, Tolerance{0.1, 0.1}, "o", {2, 2});
  ASSERT_FALSE(r);
  const std::string msg = r.message();
  EXPECT_NE(msg.find("1 of 4 elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("worst at 1 [0, 1]: got 1.5, expected 1, abs err 0.5, rel err 0.5"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(all_close({2.f}, {2.f}, Tolerance{}));
  EXPECT_FALSE(all_close({2.f}, {std::nextafter(2.f, 3.f)}, Tolerance{}));
}

}  // namespace
