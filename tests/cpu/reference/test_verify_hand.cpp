// verify_full and verify_split on small cases whose answers are known in closed form, plus
// batch bookkeeping (ragged requests, empty requests, empty rows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/compare.h"
#include "common/verify_case.h"
#include "treemla/attention.h"

namespace {

using namespace treemla;
using treemla::test::all_close;
using treemla::test::Tolerance;

constexpr float kInf = std::numeric_limits<float>::infinity();
using VerifyFn = void (*)(const VerifyParams&, float*, float*);
const VerifyFn kImpls[] = {&cpu::verify_full, &cpu::verify_split};
const char* const kImplNames[] = {"full", "split"};

// A hand-built fp32 problem with page_size 1: one page per logical row.
struct HandCase {
  int heads = 1, prefix = 0, q_len = 0;
  std::vector<float> q, kv;
  std::vector<int32_t> page_table, prefix_lens, q_indptr;
  std::vector<uint64_t> mask;
  float sm_scale = 1.f;

  HandCase(int h, int prefix_len, int nodes, int num_pages)
      : heads(h), prefix(prefix_len), q_len(nodes), q(static_cast<size_t>(nodes) * h * kHeadDimQK, 0.f),
        kv(static_cast<size_t>(num_pages) * kHeadDimQK, std::numeric_limits<float>::quiet_NaN()),
        prefix_lens{prefix_len}, q_indptr{0, nodes}, mask(nodes, 0) {}
  float& key(int page, int col) { return kv[static_cast<size_t>(page) * kHeadDimQK + col]; }
  void zero_page(int page) { std::fill(&key(page, 0), &key(page, 0) + kHeadDimQK, 0.f); }
  float& query(int node, int head, int col) { return q[(static_cast<size_t>(node) * heads + head) * kHeadDimQK + col]; }

  VerifyParams params(VerifyPart part) const {
    VerifyParams p;
    p.dtype = DType::kFP32;
    p.batch = 1;
    p.num_heads = heads;
    p.page_size = 1;
    p.num_pages = static_cast<int>(kv.size() / kHeadDimQK);
    p.page_table_stride = static_cast<int>(page_table.size());
    p.mask_words = 1;
    p.sm_scale = sm_scale;
    p.part = part;
    p.q = q.data();
    p.kv_cache = kv.data();
    p.page_table = page_table.data();
    p.prefix_lens = prefix_lens.data();
    p.q_indptr = q_indptr.data();
    p.tree_mask = mask.data();
    return p;
  }
};

TEST(VerifyHand, SingleNodeClosedForm) {
  // Logical rows 0, 1 (prefix) and 2 (the node itself) live on pages 3, 0, 2; pages 1 and 4 hold
  // NaN. q = e_0 + 2 e_512 (the rope column counts in K but is not part of V), sm_scale 0.5:
  //   logits: row 0: 0.5 (1 + 2 * 0.5) = 1, row 1: 0.5 * 4 = 2, row 2: 0.5 * (2 * -1) = -1.
  HandCase c(1, 2, 1, 5);
  c.page_table = {3, 0, 2, test::kPoisonPageIndex};
  c.mask = {1};
  c.sm_scale = 0.5f;
  c.query(0, 0, 0) = 1.f;
  c.query(0, 0, 512) = 2.f;
  for (int page : {3, 0, 2}) c.zero_page(page);
  const double col0[3] = {1, 4, 0}, col1[3] = {10, 20, 30}, col511[3] = {1, 2, 3}, col512[3] = {0.5, 0, -1};
  for (int t = 0; t < 3; ++t) {
    const int page = c.page_table[t];
    c.key(page, 0) = static_cast<float>(col0[t]);
    c.key(page, 1) = static_cast<float>(col1[t]);
    c.key(page, 511) = static_cast<float>(col511[t]);
    c.key(page, 512) = static_cast<float>(col512[t]);
  }
  const double e[3] = {std::exp(1.0), std::exp(2.0), std::exp(-1.0)};
  struct Want {
    VerifyPart part;
    int first, last;  // visible logical rows
  } wants[] = {{VerifyPart::kAll, 0, 2}, {VerifyPart::kPrefix, 0, 1}, {VerifyPart::kTail, 2, 2}};
  for (const Want& w : wants) {
    double z = 0, o0 = 0, o1 = 0, o511 = 0;
    for (int t = w.first; t <= w.last; ++t) {
      z += e[t];
      o0 += e[t] * col0[t];
      o1 += e[t] * col1[t];
      o511 += e[t] * col511[t];
    }
    std::vector<float> want_o(kHeadDimV, 0.f);
    want_o[0] = static_cast<float>(o0 / z);
    want_o[1] = static_cast<float>(o1 / z);
    want_o[511] = static_cast<float>(o511 / z);
    const std::vector<float> want_lse = {static_cast<float>(std::log(z))};
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE(::testing::Message() << kImplNames[k] << " part " << static_cast<int>(w.part));
      std::vector<float> o(kHeadDimV, -1.f), lse(1, -1.f);
      kImpls[k](c.params(w.part), o.data(), lse.data());
      EXPECT_TRUE(all_close(o, want_o, Tolerance{1e-6, 1e-6}, "o"));
      EXPECT_TRUE(all_close(lse, want_lse, Tolerance{1e-6, 1e-6}, "lse"));
    }
  }
}

TEST(VerifyHand, StarTreeWithUniformAndWeightedHeads) {
  // prefix 1 (logical row 0), tree nodes 0, 1, 2 at logical rows 1, 2, 3 with parent = {-1, 0, 0}:
  // node 0 sees {row 0, row 1}, node 1 sees {0, 1, 2}, node 2 sees {0, 1, 3}.
  // Head 0 has q = 0, so every visible row weighs the same: O = mean of V, LSE = ln(count).
  // Head 1 has q = e_3 with K[t][3] = ln(t + 1): weights proportional to t + 1.
  HandCase c(2, 1, 3, 4);
  c.page_table = {1, 3, 0, 2};
  c.mask = {0b001, 0b011, 0b101};
  for (int node = 0; node < 3; ++node) c.query(node, 1, 3) = 1.f;
  for (int t = 0; t < 4; ++t) {
    const int page = c.page_table[t];
    c.zero_page(page);
    c.key(page, 0) = static_cast<float>(t * t);
    c.key(page, 3) = static_cast<float>(std::log(t + 1.0));
    c.key(page, 100) = static_cast<float>(-t);
  }
  const std::vector<std::vector<int>> visible = {{0, 1}, {0, 1, 2}, {0, 1, 3}};
  std::vector<float> want_o(3 * 2 * kHeadDimV, 0.f), want_lse(6);
  for (int node = 0; node < 3; ++node)
    for (int head = 0; head < 2; ++head) {
      double z = 0, o0 = 0, o3 = 0, o100 = 0;
      for (int t : visible[node]) {
        const double w = head == 0 ? 1.0 : t + 1.0;
        z += w;
        o0 += w * t * t;
        o3 += w * std::log(t + 1.0);
        o100 += w * -t;
      }
      float* o = &want_o[(node * 2 + head) * kHeadDimV];
      o[0] = static_cast<float>(o0 / z);
      o[3] = static_cast<float>(o3 / z);
      o[100] = static_cast<float>(o100 / z);
      want_lse[node * 2 + head] = static_cast<float>(std::log(z));
    }
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(kImplNames[k]);
    std::vector<float> o(want_o.size()), lse(want_lse.size());
    kImpls[k](c.params(VerifyPart::kAll), o.data(), lse.data());
    EXPECT_TRUE(all_close(o, want_o, Tolerance{1e-6, 1e-6}, "o", {3, 2, kHeadDimV}));
    EXPECT_TRUE(all_close(lse, want_lse, Tolerance{1e-6, 1e-6}, "lse", {3, 2}));
  }
}

TEST(VerifyHand, RowsThatSeeNothingGiveZeroAndMinusInfinity) {
  // Node 1's mask row is empty, so its tail part sees nothing; with prefix 0 the prefix part of
  // every node sees nothing. kAll for node 1 still sees nothing at all.
  HandCase c(1, 0, 2, 3);
  c.page_table = {2, 0};
  c.mask = {0b01, 0b00};
  c.query(0, 0, 0) = c.query(1, 0, 0) = 1.f;
  for (int page : {2, 0}) {
    c.zero_page(page);
    c.key(page, 0) = 0.25f;
  }
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(kImplNames[k]);
    for (VerifyPart part : {VerifyPart::kAll, VerifyPart::kPrefix, VerifyPart::kTail}) {
      std::vector<float> o(2 * kHeadDimV, 5.f), lse(2, 5.f);
      kImpls[k](c.params(part), o.data(), lse.data());
      std::vector<float> want_o(2 * kHeadDimV, 0.f), want_lse = {-kInf, -kInf};
      if (part != VerifyPart::kPrefix) {  // node 0 sees itself: one row, weight 1
        want_o[0] = 0.25f;
        want_lse[0] = 0.25f;
      }
      EXPECT_TRUE(all_close(o, want_o, Tolerance{1e-7, 1e-7}, "o")) << "part " << static_cast<int>(part);
      EXPECT_TRUE(all_close(lse, want_lse, Tolerance{1e-7, 1e-7}, "lse")) << "part " << static_cast<int>(part);
    }
  }
}

// Request b of a batch case as a batch of one, with the pointers advanced to its rows.
struct OneRequest {
  int32_t q_indptr[2];
  VerifyParams p;
};
OneRequest one_request(const test::VerifyCase& c, int b) {
  OneRequest r;
  const int64_t q0 = c.q_indptr[b];
  r.q_indptr[0] = 0;
  r.q_indptr[1] = c.q_len(b);
  r.p = c.params();
  r.p.batch = 1;
  r.p.q = c.q.data() + q0 * c.num_heads * kHeadDimQK * dtype_size(c.spec.dtype);
  r.p.page_table = c.page_table.data() + static_cast<int64_t>(b) * c.page_table_stride;
  r.p.prefix_lens = c.prefix_lens.data() + b;
  r.p.tree_mask = c.tree_mask.data() + q0 * c.mask_words;
  return r;
}

TEST(VerifyHand, BatchRequestsAreIndependent) {
  // Each request's rows equal a run of that request alone; includes an empty request (q_len 0)
  // and a request with no prefix.
  test::CaseSpec spec = test::make_spec(1, 3, 1, 0, 16, DType::kFP16);
  spec.q_lens = {5, 0, 70, 1};
  spec.prefix_lens = {40, 1000, 0, 129};
  const test::VerifyCase c(spec, 21);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(::testing::Message() << kImplNames[k] << " " << c.describe());
    std::vector<float> o(c.o_elems()), lse(c.lse_elems());
    kImpls[k](c.params(), o.data(), lse.data());
    for (int b = 0; b < c.batch; ++b) {
      OneRequest r = one_request(c, b);
      r.p.q_indptr = r.q_indptr;
      const int64_t rows = static_cast<int64_t>(c.q_len(b)) * c.num_heads, first = c.q_indptr[b] * c.num_heads;
      std::vector<float> o1(rows * kHeadDimV), lse1(rows);
      kImpls[k](r.p, o1.data(), lse1.data());
      EXPECT_TRUE(all_close(o.data() + first * kHeadDimV, o1.data(), rows * kHeadDimV, Tolerance{}, "o"))
          << "request " << b;
      EXPECT_TRUE(all_close(lse.data() + first, lse1.data(), rows, Tolerance{}, "lse")) << "request " << b;
    }
  }
}

TEST(VerifyHand, AllRequestsEmptyWritesNothing) {
  test::CaseSpec spec = test::make_spec(3, 2, 0, 17);
  const test::VerifyCase c(spec, 22);
  ASSERT_EQ(c.total_q, 0);
  float sentinel_o = 3.f, sentinel_lse = 4.f;
  for (int k = 0; k < 2; ++k) {
    kImpls[k](c.params(), &sentinel_o, &sentinel_lse);
    EXPECT_EQ(sentinel_o, 3.f);
    EXPECT_EQ(sentinel_lse, 4.f);
  }
}

}  // namespace
