// validate(): each bad field is rejected with a message naming the argument, the index and the
// bound; the valid corners (empty requests, poisoned unused entries, wide masks) are accepted.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/verify_case.h"
#include "treemla/attention.h"
#include "treemla/error.h"

namespace {

using namespace treemla;
using test::VerifyCase;

// Three requests: q_len 3, 70 and 0; prefixes 10, 40, 5; page_size 16; mask_words 2.
test::CaseSpec base_spec() {
  test::CaseSpec s = test::make_spec(3, 4, 1, 0, 16, DType::kBF16, test::TreeKind::kRandom);
  s.q_lens = {3, 70, 0};
  s.prefix_lens = {10, 40, 5};
  s.stride_slack = 1;
  s.extra_pages = 2;
  return s;
}

// Expects validate(p) to throw with every fragment in its message.
void expect_rejected(const VerifyParams& p, const std::vector<std::string>& fragments) {
  try {
    cpu::validate(p);
    ADD_FAILURE() << "accepted; expected an error mentioning '" << fragments.front() << "'";
  } catch (const Error& e) {
    for (const std::string& f : fragments)
      EXPECT_NE(e.message().find(f), std::string::npos)
          << "message: " << e.message() << "\nmissing: " << f;
  }
}

TEST(Validate, AcceptsTheGeneratedCase) {
  const VerifyCase c(base_spec(), 1);
  for (VerifyPart part : {VerifyPart::kAll, VerifyPart::kPrefix, VerifyPart::kTail})
    EXPECT_NO_THROW(cpu::validate(c.params(part)));
}

TEST(Validate, RejectsBadScalars) {
  const VerifyCase c(base_spec(), 2);
  struct Bad {
    std::function<void(VerifyParams&)> edit;
    std::vector<std::string> fragments;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  const std::vector<Bad> bad = {
      {[](VerifyParams& p) { p.batch = 0; }, {"batch = 0", ">= 1"}},
      {[](VerifyParams& p) { p.num_heads = 0; }, {"num_heads = 0", "[1, 128]"}},
      {[](VerifyParams& p) { p.num_heads = 129; }, {"num_heads = 129", "[1, 128]"}},
      {[](VerifyParams& p) { p.page_size = 0; }, {"page_size = 0", "power of two"}},
      {[](VerifyParams& p) { p.page_size = 24; }, {"page_size = 24", "power of two"}},
      {[](VerifyParams& p) { p.page_size = 1 << 17; }, {"page_size = 131072", "65536"}},
      {[](VerifyParams& p) { p.num_pages = 0; }, {"num_pages = 0"}},
      {[](VerifyParams& p) { p.page_table_stride = -1; }, {"page_table_stride = -1"}},
      {[](VerifyParams& p) { p.mask_words = 0; }, {"mask_words = 0", "[1, 17]"}},
      {[](VerifyParams& p) { p.mask_words = 18; }, {"mask_words = 18", "[1, 17]"}},
      {[](VerifyParams& p) { p.dtype = static_cast<DType>(7); }, {"dtype = 7"}},
      {[](VerifyParams& p) { p.part = static_cast<VerifyPart>(3); }, {"part = 3"}},
      {[](VerifyParams& p) { p.sm_scale = 0.f; }, {"sm_scale = 0"}},
      {[](VerifyParams& p) { p.sm_scale = -0.1f; }, {"sm_scale = -0.1"}},
      {[nan](VerifyParams& p) { p.sm_scale = nan; }, {"sm_scale = nan"}},
      {[inf](VerifyParams& p) { p.sm_scale = inf; }, {"sm_scale = inf"}},
      {[](VerifyParams& p) { p.q = nullptr; }, {"q is null"}},
      {[](VerifyParams& p) { p.kv_cache = nullptr; }, {"kv_cache is null"}},
      {[](VerifyParams& p) { p.page_table = nullptr; }, {"page_table is null"}},
      {[](VerifyParams& p) { p.prefix_lens = nullptr; }, {"prefix_lens is null"}},
      {[](VerifyParams& p) { p.q_indptr = nullptr; }, {"q_indptr is null"}},
      {[](VerifyParams& p) { p.tree_mask = nullptr; }, {"tree_mask is null"}},
      // Request 1 has 70 nodes: one mask word is too few.
      {[](VerifyParams& p) { p.mask_words = 1; },
       {"mask_words = 1", "ceil(max q_len / 64) = 2", "request 1"}},
      // Request 1 needs ceil((40 + 70) / 16) = 7 pages.
      {[](VerifyParams& p) { p.page_table_stride = 6; },
       {"page_table_stride = 6", "7 pages", "request 1"}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "bad case " << i);
    VerifyParams p = c.params();
    bad[i].edit(p);
    expect_rejected(p, bad[i].fragments);
  }
}

TEST(Validate, RejectsBadArrays) {
  struct Bad {
    std::function<void(VerifyCase&)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Bad> bad = {
      {[](VerifyCase& c) { c.q_indptr[0] = 1; }, {"q_indptr[0] = 1", "must be 0"}},
      {[](VerifyCase& c) { c.q_indptr[2] = 2; },
       {"q_indptr[2] = 2", "q_indptr[1] = 3", "non-decreasing"}},
      {[](VerifyCase& c) { c.q_indptr[3] = c.q_indptr[2] + 1026; },
       {"q_len of request 2", "1026", "kMaxTreeNodes = 1025"}},
      {[](VerifyCase& c) { c.prefix_lens[1] = -1; }, {"prefix_lens[1] = -1", "[0, 1048576]"}},
      {[](VerifyCase& c) { c.prefix_lens[0] = kMaxPrefixLen + 1; }, {"prefix_lens[0] = 1048577"}},
      // Logical rows of request 1: 0..109 on pages 0..6.
      {[](VerifyCase& c) { c.page_table[c.page_table_stride + 6] = c.num_pages; },
       {"page_table[1][6] = ", "is out of range [0, ", "request 1 reads logical rows 0..109"}},
      {[](VerifyCase& c) { c.page_table[c.page_table_stride + 0] = -5; },
       {"page_table[1][0] = -5"}},
      {[](VerifyCase& c) { c.page_table[0] = 9999; }, {"page_table[0][0] = 9999"}},
      // Request 0 has 3 nodes (global rows 0..2): bit 3 is the first bad bit.
      {[](VerifyCase& c) { c.tree_mask[2 * c.mask_words] |= 1u << 3; },
       {"tree_mask row 2", "request 0, node 2", "bit 3", "q_len = 3"}},
      // Request 1 (rows 3..72) has 70 nodes: bit 70 sits in its second word.
      {[](VerifyCase& c) { c.tree_mask[5 * c.mask_words + 1] |= uint64_t{1} << 6; },
       {"tree_mask row 5", "request 1, node 2", "bit 70", "q_len = 70"}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "bad case " << i);
    VerifyCase c(base_spec(), 3);
    bad[i].edit(c);
    expect_rejected(c.params(), bad[i].fragments);
  }
}

TEST(Validate, PageMessageIsComplete) {
  VerifyCase c(base_spec(), 7);
  c.page_table[c.page_table_stride + 5] = 9999;
  const std::string want = "page_table[1][5] = 9999 is out of range [0, " +
                           std::to_string(c.num_pages) + ") (request 1 reads logical rows 0..109)";
  try {
    cpu::validate(c.params());
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), want);
  }
}

TEST(Validate, OnlyThePagesTheCallReadsAreChecked) {
  // Request 0 with prefix 8, 3 nodes and page_size 8: the prefix (rows 0..7) fills its page 0
  // and the tail (rows 8..10) sits alone on its page 1.
  test::CaseSpec s = base_spec();
  s.page_size = 8;
  s.prefix_lens = {8, 40, 5};
  VerifyCase c(s, 4);
  c.page_table[1] = -3;  // request 0's tail page
  EXPECT_NO_THROW(cpu::validate(c.params(VerifyPart::kPrefix)));
  expect_rejected(c.params(VerifyPart::kAll), {"page_table[0][1] = -3", "rows 0..10"});
  expect_rejected(c.params(VerifyPart::kTail), {"page_table[0][1] = -3", "rows 8..10"});
  c.page_table[1] = 0;
  c.page_table[0] = c.num_pages + 3;  // request 0's prefix page
  EXPECT_NO_THROW(cpu::validate(c.params(VerifyPart::kTail)));
  expect_rejected(c.params(VerifyPart::kPrefix), {"page_table[0][0]", "rows 0..7"});
  // Request 2 has no nodes, so it reads nothing: its entries may hold anything.
  for (int j = 0; j < c.page_table_stride; ++j) c.page_table[2 * c.page_table_stride + j] = -1;
  c.page_table[0] = 0;
  EXPECT_NO_THROW(cpu::validate(c.params(VerifyPart::kAll)));
}

// page_table_stride = 0 is valid (paged_cache.h): a request needs pages only for the rows the
// call reads, so the bound that can fail is the per-request one, which names the request.
TEST(Validate, PageTableWithoutColumns) {
  VerifyCase c(base_spec(), 8);
  VerifyParams p = c.params();
  p.page_table_stride = 0;
  expect_rejected(p, {"page_table_stride = 0 is less than the 1 pages request 0 needs"});
  std::vector<int32_t> no_rows(c.q_indptr.size(), 0);  // every request without tree nodes
  p.q_indptr = no_rows.data();
  EXPECT_NO_THROW(cpu::validate(p));
  // Prefix-only with empty prefixes reads nothing either, whatever the trees.
  std::vector<int32_t> no_prefix(c.prefix_lens.size(), 0);
  p = c.params(VerifyPart::kPrefix);
  p.page_table_stride = 0;
  p.prefix_lens = no_prefix.data();
  EXPECT_NO_THROW(cpu::validate(p));
  p.part = VerifyPart::kTail;
  expect_rejected(p, {"page_table_stride = 0", "request 0", "part kTail"});
}

TEST(Validate, AcceptsWideMasksAndEmptyRows) {
  test::CaseSpec s = base_spec();
  s.mask_words = kMaxMaskWords;
  VerifyCase c(s, 5);
  EXPECT_NO_THROW(cpu::validate(c.params()));
  c.tree_mask[0] = 0;  // a row that sees nothing of the tail is legal
  EXPECT_NO_THROW(cpu::validate(c.params()));
}

TEST(Validate, VerifyFunctionsValidateFirst) {
  VerifyCase c(base_spec(), 6);
  c.page_table[0] = -1;
  std::vector<float> o(c.o_elems()), lse(c.lse_elems());
  EXPECT_THROW(cpu::verify_full(c.params(), o.data(), lse.data()), Error);
  EXPECT_THROW(cpu::verify_split(c.params(), o.data(), lse.data()), Error);
  c.page_table[0] = 0;
  EXPECT_THROW(cpu::verify_full(c.params(), nullptr, lse.data()), Error);
  EXPECT_THROW(cpu::verify_split(c.params(), o.data(), nullptr), Error);
}

}  // namespace
