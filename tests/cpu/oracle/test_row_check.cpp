// The pieces of the comparison of verify results: the same-precision baseline and the per-row
// check against the double reference (row_check.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/row_check.h"
#include "common/verify_case.h"

namespace treemla::test {
namespace {

TEST(SamePrecision, Fp32InputsMatchTheReferenceClosely) {
  // With fp32 inputs nothing is rounded to a narrower type: only fp32 accumulation separates the
  // baseline from the double reference, for every part, split count and block size.
  CaseSpec s = make_spec(1, 3, 1, 0, 16, DType::kFP32, TreeKind::kRandom);
  s.q_lens = {9, 1, 33};
  s.prefix_lens = {1000, 0, 77};
  const VerifyCase c(s, 61);
  for (VerifyPart part : {VerifyPart::kAll, VerifyPart::kPrefix, VerifyPart::kTail})
    for (BaselineOptions opt :
         {BaselineOptions{}, BaselineOptions{64, 5}, BaselineOptions{32, 1, 4}}) {
      SCOPED_TRACE(::testing::Message() << part_name(part) << " block " << opt.block << " splits "
                                        << opt.splits << " " << c.describe());
      const Reference ref = reference_with_bounds(c.params(part));
      const BaselineResult base = same_precision_baseline(c.params(part), opt);
      EXPECT_TRUE(all_close(base.o, ref.o, Tolerance{1e-5, 1e-5}, "o"));
      EXPECT_TRUE(all_close(base.lse, ref.lse, Tolerance{1e-5, 1e-6}, "lse"));
    }
}

TEST(SamePrecision, NeverReadsPoisonedSlots) {
  CaseSpec s = make_spec(2, 2, 7, 300, 16, DType::kBF16, TreeKind::kDeep);
  s.extra_pages = 4;
  const VerifyCase poisoned(s, 62);
  s.poison = false;
  const VerifyCase clean(s, 62);
  for (VerifyPart part : {VerifyPart::kAll, VerifyPart::kPrefix, VerifyPart::kTail}) {
    const BaselineResult a = same_precision_baseline(poisoned.params(part)),
                         b = same_precision_baseline(clean.params(part));
    EXPECT_TRUE(all_finite(a.o, "o")) << part_name(part);
    EXPECT_EQ(a.o, b.o) << part_name(part);
    EXPECT_TRUE(all_close(a.lse, b.lse, Tolerance{}, "lse")) << part_name(part);
  }
}

TEST(RowCheck, EmptyRowsMustBeExactlyZeroAndMinusInfinity) {
  // Prefix part of a request without prefix: every row sees nothing, so every bound is 0.
  const VerifyCase c(make_spec(1, 2, 3, 0, 16), 63);
  const Reference ref = reference_with_bounds(c.params(VerifyPart::kPrefix));
  for (size_t r = 0; r < ref.lse.size(); ++r) {
    EXPECT_EQ(ref.lse[r], -INFINITY);
    EXPECT_EQ(ref.bounds.o_max_abs[r], 0.0);
  }
  std::vector<float> o = ref.o, lse = ref.lse;
  EXPECT_TRUE(rows_within_bounds(o, lse, ref, c.num_heads));
  o[kHeadDimV + 5] = 1e-30f;
  const auto r = rows_within_bounds(o, lse, ref, c.num_heads);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("worst row 1 [node 0, head 1]"), std::string::npos)
      << r.message();
  EXPECT_NE(std::string(r.message()).find("at column 5"), std::string::npos) << r.message();
}

TEST(RowCheck, ChecksInfNanPositionsFirstThenNamesTheWorstRow) {
  const VerifyCase c(make_spec(1, 4, 5, 200, 16, DType::kFP16), 64);
  const Reference ref = reference_with_bounds(c.params());
  const BaselineResult base = same_precision_baseline(c.params());
  const auto ok = rows_within_bounds(base.o, base.lse, ref, c.num_heads);
  EXPECT_TRUE(ok) << ok.message();

  std::vector<float> lse = base.lse;
  lse[6] = -INFINITY;
  const auto inf = rows_within_bounds(base.o, lse, ref, c.num_heads);
  EXPECT_FALSE(inf);
  EXPECT_NE(std::string(inf.message()).find("inf/NaN position"), std::string::npos)
      << inf.message();

  // Row 9 = (node 2, head 1): an O error of 3 bounds in one column, and row 13 one of 1.5.
  std::vector<float> o = base.o;
  o[9 * kHeadDimV + 100] =
      static_cast<float>(ref.o[9 * kHeadDimV + 100] + 3 * ref.bounds.o_max_abs[9]);
  o[13 * kHeadDimV + 7] =
      static_cast<float>(ref.o[13 * kHeadDimV + 7] - 1.5 * ref.bounds.o_max_abs[13]);
  const auto bad = rows_within_bounds(o, base.lse, ref, c.num_heads);
  EXPECT_FALSE(bad);
  const std::string msg = bad.message();
  EXPECT_NE(msg.find("2 of 20 rows out of bounds; worst row 9 [node 2, head 1]"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("at column 100"), std::string::npos) << msg;
  // An LSE off by twice its bound fails alone.
  lse = base.lse;
  lse[3] = static_cast<float>(ref.lse[3] + 2 * ref.bounds.lse_abs[3]);
  const auto bad_lse = rows_within_bounds(base.o, lse, ref, c.num_heads);
  EXPECT_FALSE(bad_lse);
  EXPECT_NE(std::string(bad_lse.message()).find("worst row 3 [node 0, head 3]"), std::string::npos)
      << bad_lse.message();
}

TEST(RowCheck, BoundsHaveTheirFloors) {
  // Even where the baseline happens to be exact, a row's bounds keep the unit-roundoff floors.
  const VerifyCase c(make_spec(1, 1, 2, 64, 16), 65);
  const Reference ref = reference_with_bounds(c.params());
  for (size_t r = 0; r < ref.lse.size(); ++r) {
    double max_ref = 0;
    for (int col = 0; col < kHeadDimV; ++col)
      max_ref = std::max(max_ref, std::fabs(double(ref.o[r * kHeadDimV + col])));
    EXPECT_GE(ref.bounds.o_max_abs[r], unit_roundoff(DType::kBF16) * max_ref);
    EXPECT_GE(ref.bounds.o_rel_l2[r], unit_roundoff(DType::kBF16));
    EXPECT_GE(ref.bounds.lse_abs[r], 8 * std::ldexp(1.0, -24) * (std::fabs(ref.lse[r]) + 2));
  }
}

}  // namespace
}  // namespace treemla::test
