// The comparator of verify results (row_check.h) must fail for a kernel that drops one key.
// Each test builds a case, the double reference with its derived per-row bounds, and then:
//  - a correct computation at the input precision in another order (32 -> 64-key blocks, the
//    prefix cut into splits merged by LSE) must pass: the bounds are not too tight;
//  - the reference and the same-precision baseline of a call with keys left out (or with the
//    root bit cleared from every mask row) must fail: the bounds are tight enough.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "common/row_check.h"
#include "common/verify_case.h"
#include "cpu/oracle/mutated_call.h"

namespace treemla::test {
namespace {

// The wrong call must fail the comparison twice: in double (what a kernel with exact arithmetic
// and the bug would give) and at the input precision (what a real kernel with the bug gives).
void expect_caught(const VerifyCase& c, const Reference& ref, const MutatedCall& wrong,
                   const char* what) {
  SCOPED_TRACE(std::string(what) + ": " + c.describe());
  const Reference exact = double_reference(wrong.params());
  const auto in_double = rows_within_bounds(exact.o, exact.lse, ref, c.num_heads);
  EXPECT_FALSE(in_double) << "double reference of the wrong call passed: " << in_double.message();
  const BaselineResult base = same_precision_baseline(wrong.params());
  const auto at_precision = rows_within_bounds(base.o, base.lse, ref, c.num_heads);
  EXPECT_FALSE(at_precision) << "same-precision run of the wrong call passed: "
                             << at_precision.message();
  std::printf("[ margin ] %s: %s\n", what, in_double.message());
}

// Correct computations at the input precision in other orders (64-key blocks; prefix splits
// merged by LSE) pass: the bounds leave room for a kernel that rounds in another order.
void expect_correct_orders_pass(const VerifyCase& c, const Reference& ref) {
  for (BaselineOptions opt :
       {BaselineOptions{64, 1}, BaselineOptions{32, 7}, BaselineOptions{64, 16, 64}}) {
    const BaselineResult other = same_precision_baseline(c.params(), opt);
    const auto r = rows_within_bounds(other.o, other.lse, ref, c.num_heads);
    EXPECT_TRUE(r) << "block " << opt.block << " splits " << opt.splits << ": " << c.describe();
    std::printf("[ margin ] correct, block %d splits %d: %s\n", opt.block, opt.splits, r.message());
  }
}

TEST(Comparator, Prefix262144CatchesOneDroppedKeyAndTheRootBit) {
  CaseSpec s = make_spec(1, 1, 2, 262144, 64, DType::kBF16, TreeKind::kChain);
  s.peaks = true;
  VerifyCase c(s, 4242);
  const int64_t boundary = 4096 * 32;  // a block boundary in the middle of the prefix
  std::vector<int64_t> rows = block_edge_rows(262144, 32, 6);
  rows.push_back(boundary - 1);
  rows.push_back(boundary);
  rows.push_back(262144);  // the root's own row (tail node 0)
  c.plant_peaks({rows});
  const Reference ref = reference_with_bounds(c.params());
  expect_correct_orders_pass(c, ref);
  expect_caught(c, ref, mutated_call(c, {{boundary}}, false), "one key dropped at row 131072");
  expect_caught(c, ref, mutated_call(c, {}, true), "root bit dropped");
  std::vector<int64_t> every_1024;  // none of them a peak
  for (int64_t t = 512; t < 262144; t += 1024) every_1024.push_back(t);
  expect_caught(c, ref, mutated_call(c, {every_1024}, false), "one ordinary key in 1024 dropped");
}

TEST(Comparator, Prefix4097RandomDataCatchesOneDroppedKey) {
  const VerifyCase c(make_spec(1, 8, 7, 4097, 16), 4097);
  const Reference ref = reference_with_bounds(c.params());
  expect_correct_orders_pass(c, ref);
  expect_caught(c, ref, mutated_call(c, {{4096}}, false), "one key dropped at 4096");
  expect_caught(c, ref, mutated_call(c, {{2048}}, false), "one key dropped at 2048");
}

TEST(Comparator, Prefix20000RandomDataCatchesTenKeysAndTheRootBit) {
  const VerifyCase c(make_spec(1, 8, 5, 20000, 16), 20000);
  const Reference ref = reference_with_bounds(c.params());
  expect_correct_orders_pass(c, ref);
  expect_caught(
      c, ref,
      mutated_call(c, {{31, 32, 5000, 9999, 10000, 12345, 16383, 16384, 19967, 19968}}, false),
      "ten keys dropped");
  expect_caught(c, ref, mutated_call(c, {}, true), "root bit dropped");
}

}  // namespace
}  // namespace treemla::test
