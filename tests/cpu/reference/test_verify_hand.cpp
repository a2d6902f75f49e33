// verify_full and verify_split on small cases whose answers are known in closed form (one uses
// every one of the 576 columns, in fp32, bf16 and fp16), plus batch bookkeeping (ragged
// requests, empty requests, empty rows).
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
  std::vector<uint16_t> q16, kv16;  // q and kv in bf16 or fp16, see params(part, dtype)

  HandCase(int h, int prefix_len, int nodes, int num_pages)
      : heads(h),
        prefix(prefix_len),
        q_len(nodes),
        q(static_cast<size_t>(nodes) * h * kHeadDimQK, 0.f),
        kv(static_cast<size_t>(num_pages) * kHeadDimQK, std::numeric_limits<float>::quiet_NaN()),
        prefix_lens{prefix_len},
        q_indptr{0, nodes},
        mask(nodes, 0) {}
  float& key(int page, int col) { return kv[static_cast<size_t>(page) * kHeadDimQK + col]; }
  void zero_page(int page) { std::fill(&key(page, 0), &key(page, 0) + kHeadDimQK, 0.f); }
  float& query(int node, int head, int col) {
    return q[(static_cast<size_t>(node) * heads + head) * kHeadDimQK + col];
  }

  // The problem with q and kv_cache in `dtype` (converted from the fp32 values, so use values the
  // dtype holds exactly when the answer must not change).
  VerifyParams params(VerifyPart part, DType dtype) {
    VerifyParams p = params(part);
    if (dtype == DType::kFP32) return p;
    q16.resize(q.size());
    kv16.resize(kv.size());
    for (size_t i = 0; i < q.size(); ++i)
      store_from_float(q16.data(), static_cast<int64_t>(i), dtype, q[i]);
    for (size_t i = 0; i < kv.size(); ++i)
      store_from_float(kv16.data(), static_cast<int64_t>(i), dtype, kv[i]);
    p.dtype = dtype;
    p.q = q16.data();
    p.kv_cache = kv16.data();
    return p;
  }
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
  const double col0[3] = {1, 4, 0}, col1[3] = {10, 20, 30}, col511[3] = {1, 2, 3},
               col512[3] = {0.5, 0, -1};
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

TEST(VerifyHand, EveryColumnCountsInEveryDtype) {
  // Every one of the 576 columns of every key row is nonzero, so a logit that skips any column
  // (the last rope columns 572..575, or everything past the V/K boundary at 512) moves the LSE
  // and the weights; V columns 0, 1..510 and 511 carry different values, and column 512 (K only)
  // yet another, so reading V one column off, or 511 columns wide, moves O. Key row t holds
  //   w_t in column 0, a_t in columns 1..510, x_t in column 511,
  //   y_t in column 512, r_t in columns 513..574, z_t in column 575.
  // Head 0 has q = 2^-6 in every column, head 1 q = -2^-6 in columns 0..511 and 2^-5 in 512..575:
  //   logit(t, head) = sm_scale * (s_v * (w_t + 510 a_t + x_t) + s_k * (y_t + 62 r_t + z_t)),
  // with (s_v, s_k) = (2^-6, 2^-6) or (-2^-6, 2^-5). Every value is exact in bf16 and fp16, so the
  // answer is the same in all three dtypes (which also checks the reference's own decoding).
  // Prefix 3 (logical rows 0..2), a chain of 2 nodes at rows 3 and 4: node 0 sees rows {0, 1, 2,
  // 3}, node 1 sees {0, 1, 2, 3, 4}. Pages 1 and 3 hold NaN.
  const double w[5] = {1, 2, 3, 4, 5}, a[5] = {0.25, -0.5, 0.125, 1, -0.25},
               x[5] = {0.5, -1, 0.25, 1, -0.75};
  const double y[5] = {0.375, 0.75, -1, 0.5, 3}, r[5] = {0.125, -0.25, 0.5, 0.0625, -0.125},
               z[5] = {1, -0.5, 2, 1.5, -1};
  const double s_v[2] = {1.0 / 64, -1.0 / 64}, s_k[2] = {1.0 / 64, 1.0 / 32};
  HandCase c(2, 3, 2, 7);
  c.page_table = {4, 0, 6, 2, 5, test::kPoisonPageIndex};
  c.mask = {0b01, 0b11};
  c.sm_scale = 0.5f;
  for (int t = 0; t < 5; ++t) {
    const int page = c.page_table[t];
    c.key(page, 0) = static_cast<float>(w[t]);
    for (int col = 1; col < 511; ++col) c.key(page, col) = static_cast<float>(a[t]);
    c.key(page, 511) = static_cast<float>(x[t]);
    c.key(page, 512) = static_cast<float>(y[t]);
    for (int col = 513; col < 575; ++col) c.key(page, col) = static_cast<float>(r[t]);
    c.key(page, 575) = static_cast<float>(z[t]);
  }
  for (int node = 0; node < 2; ++node)
    for (int head = 0; head < 2; ++head)
      for (int col = 0; col < kHeadDimQK; ++col)
        c.query(node, head, col) = static_cast<float>(col < kHeadDimV ? s_v[head] : s_k[head]);

  struct Want {
    VerifyPart part;
    std::vector<int> rows[2];  // visible logical rows of node 0 and node 1
  } wants[] = {{VerifyPart::kAll, {{0, 1, 2, 3}, {0, 1, 2, 3, 4}}},
               {VerifyPart::kPrefix, {{0, 1, 2}, {0, 1, 2}}},
               {VerifyPart::kTail, {{3}, {3, 4}}}};
  for (const Want& want : wants) {
    std::vector<float> want_o(2 * 2 * kHeadDimV, 0.f), want_lse(2 * 2);
    for (int node = 0; node < 2; ++node)
      for (int head = 0; head < 2; ++head) {
        double z_sum = 0, o0 = 0, o_mid = 0, o511 = 0;
        for (int t : want.rows[node]) {
          const double logit = 0.5 * (s_v[head] * (w[t] + 510 * a[t] + x[t]) +
                                      s_k[head] * (y[t] + 62 * r[t] + z[t]));
          const double e = std::exp(logit);
          z_sum += e;
          o0 += e * w[t];
          o_mid += e * a[t];
          o511 += e * x[t];
        }
        float* o = &want_o[(node * 2 + head) * kHeadDimV];
        o[0] = static_cast<float>(o0 / z_sum);
        for (int col = 1; col < 511; ++col) o[col] = static_cast<float>(o_mid / z_sum);
        o[511] = static_cast<float>(o511 / z_sum);
        want_lse[node * 2 + head] = static_cast<float>(std::log(z_sum));
      }
    for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16})
      for (int k = 0; k < 2; ++k) {
        SCOPED_TRACE(::testing::Message() << kImplNames[k] << " " << dtype_name(dtype) << " part "
                                          << test::part_name(want.part));
        std::vector<float> o(want_o.size(), -1.f), lse(want_lse.size(), -1.f);
        kImpls[k](c.params(want.part, dtype), o.data(), lse.data());
        EXPECT_TRUE(all_close(o, want_o, Tolerance{1e-6, 1e-6}, "o", {2, 2, kHeadDimV}));
        EXPECT_TRUE(all_close(lse, want_lse, Tolerance{1e-6, 1e-6}, "lse", {2, 2}));
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
      EXPECT_TRUE(all_close(o, want_o, Tolerance{1e-7, 1e-7}, "o"))
          << "part " << static_cast<int>(part);
      EXPECT_TRUE(all_close(lse, want_lse, Tolerance{1e-7, 1e-7}, "lse"))
          << "part " << static_cast<int>(part);
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
      const int64_t rows = static_cast<int64_t>(c.q_len(b)) * c.num_heads,
                    first = c.q_indptr[b] * c.num_heads;
      std::vector<float> o1(rows * kHeadDimV), lse1(rows);
      kImpls[k](r.p, o1.data(), lse1.data());
      EXPECT_TRUE(
          all_close(o.data() + first * kHeadDimV, o1.data(), rows * kHeadDimV, Tolerance{}, "o"))
          << "request " << b;
      EXPECT_TRUE(all_close(lse.data() + first, lse1.data(), rows, Tolerance{}, "lse"))
          << "request " << b;
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
