// verify_split (the split design) against verify_full (the specification) on random cases,
// merge of the parts, large logits, the largest tree, and that masks and poison are respected.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/compare.h"
#include "common/verify_case.h"
#include "treemla/attention.h"

namespace {

using namespace treemla;
using test::all_close;
using test::CaseSpec;
using test::Tolerance;
using test::VerifyCase;

// Split and full differ by float rounding of the partial states and of the merges.
constexpr Tolerance kTolO{1e-5, 1e-5};
constexpr Tolerance kTolLse{1e-5, 1e-6};

struct Result {
  std::vector<float> o, lse;
};

Result run(void (*fn)(const VerifyParams&, float*, float*), const VerifyCase& c, VerifyPart part) {
  Result r{std::vector<float>(c.o_elems(), -7.f), std::vector<float>(c.lse_elems(), -7.f)};
  fn(c.params(part), r.o.data(), r.lse.data());
  return r;
}

std::vector<int64_t> o_shape(const VerifyCase& c) { return {c.total_q, c.num_heads, kHeadDimV}; }
std::vector<int64_t> lse_shape(const VerifyCase& c) { return {c.total_q, c.num_heads}; }

// Awkward sizes around the tile (64) and split (1024) boundaries. Request 0 walks through every
// (prefix, q_len) pair, 24 cases per round; the other fields are drawn at random so that they
// are not tied to the pair.
CaseSpec sweep_spec(int k, std::mt19937& rng) {
  static const int kPrefix[] = {0, 1, 63, 64, 65, 4097};
  static const int kQLen[] = {1, 7, 64, 65};
  static const int kHeads[] = {1, 3, 16};
  static const int kPage[] = {1, 16, 64};
  static const DType kTypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};
  static const test::TreeKind kTrees[] = {test::TreeKind::kChain, test::TreeKind::kStar,
                                          test::TreeKind::kRandom, test::TreeKind::kDeep,
                                          test::TreeKind::kSingle};
  CaseSpec s;
  s.dtype = kTypes[test::rand_int(rng, 0, 2)];
  s.tree = kTrees[test::rand_int(rng, 0, 4)];
  s.page_size = kPage[test::rand_int(rng, 0, 2)];
  s.num_heads = kHeads[test::rand_int(rng, 0, 2)];
  s.dist = test::rand_int(rng, 0, 1) ? test::ValueDist::kNormal : test::ValueDist::kUniform;
  s.q_scale = test::rand_int(rng, 0, 3) == 3 ? 5.f : 1.f;  // logits O(1) and O(10)
  const int batch = test::rand_int(rng, 1, 3);
  for (int b = 0; b < batch; ++b) {
    s.q_lens.push_back(b == 0 ? kQLen[k / 6 % 4] : kQLen[test::rand_int(rng, 0, 3)]);
    // Later requests skip the long prefix to bound the run time.
    s.prefix_lens.push_back(b == 0 ? kPrefix[k % 6] : kPrefix[test::rand_int(rng, 0, 4)]);
  }
  int64_t cost = 0;
  for (int b = 0; b < batch; ++b)
    cost += static_cast<int64_t>(s.q_lens[b]) * (s.prefix_lens[b] + s.q_lens[b]);
  if (cost * s.num_heads > 300000) s.num_heads = 1;
  if (test::rand_int(rng, 0, 4) == 0)
    s.mask_words = test::rand_int(rng, 2, kMaxMaskWords);  // wider than needed
  return s;
}

TEST(VerifySplit, MatchesFullOnRandomCasesForEveryPart) {
  std::mt19937 rng(1234);
  for (int k = 0; k < 96; ++k) {
    const uint32_t seed = rng();
    const VerifyCase c(sweep_spec(k, rng), seed);
    SCOPED_TRACE(c.describe());
    for (VerifyPart part : {VerifyPart::kAll, VerifyPart::kPrefix, VerifyPart::kTail}) {
      const Result full = run(&cpu::verify_full, c, part), split = run(&cpu::verify_split, c, part);
      ASSERT_TRUE(all_close(split.o, full.o, kTolO, "o", o_shape(c)))
          << "part " << test::part_name(part);
      ASSERT_TRUE(all_close(split.lse, full.lse, kTolLse, "lse", lse_shape(c)))
          << "part " << test::part_name(part);
    }
  }
}

TEST(VerifySplit, MergeOfPrefixAndTailEqualsFull) {
  // The specification's own parts, merged, give the specification's whole: checks that the
  // parts partition the visible keys and that merge_state composes them.
  std::mt19937 rng(99);
  for (int k = 0; k < 30; ++k) {
    const uint32_t seed = rng();
    const VerifyCase c(sweep_spec(k * 7 + 1, rng), seed);
    SCOPED_TRACE(c.describe());
    const Result all = run(&cpu::verify_full, c, VerifyPart::kAll);
    Result pre = run(&cpu::verify_full, c, VerifyPart::kPrefix);
    const Result tail = run(&cpu::verify_full, c, VerifyPart::kTail);
    cpu::merge_state(pre.o.data(), pre.lse.data(), tail.o.data(), tail.lse.data(), pre.o.data(),
                     pre.lse.data(), c.total_q, c.num_heads, kHeadDimV);
    ASSERT_TRUE(all_close(pre.o, all.o, kTolO, "o", o_shape(c)));
    ASSERT_TRUE(all_close(pre.lse, all.lse, kTolLse, "lse", lse_shape(c)));
  }
}

TEST(VerifySplit, LargeMagnitudeLogits) {
  // Logits in the hundreds: a softmax without max subtraction overflows, and the float LSEs of
  // the partial states carry absolute errors of about 1e-5, hence the looser bound.
  std::mt19937 rng(5);
  for (int k = 0; k < 12; ++k) {
    CaseSpec s = sweep_spec(k, rng);
    s.dist = test::ValueDist::kNormal;
    s.q_scale = 60.f;
    const VerifyCase c(s, rng());
    SCOPED_TRACE(c.describe());
    const Result full = run(&cpu::verify_full, c, VerifyPart::kAll);
    const Result split = run(&cpu::verify_split, c, VerifyPart::kAll);
    ASSERT_TRUE(test::all_finite(full.o, "full o"));
    ASSERT_TRUE(all_close(split.o, full.o, Tolerance{3e-4, 1e-4}, "o", o_shape(c)));
    ASSERT_TRUE(all_close(split.lse, full.lse, Tolerance{1e-4, 1e-6}, "lse", lse_shape(c)));
  }
}

TEST(VerifySplit, DesignSizedCase) {
  // H = 16 (DeepSeek-V3 at TP8), 65 tree rows, a prefix one past four splits.
  const VerifyCase c(test::make_spec(1, 16, 65, 4097, 64, DType::kBF16, test::TreeKind::kRandom),
                     77);
  SCOPED_TRACE(c.describe());
  const Result full = run(&cpu::verify_full, c, VerifyPart::kAll);
  const Result split = run(&cpu::verify_split, c, VerifyPart::kAll);
  EXPECT_TRUE(all_close(split.o, full.o, kTolO, "o", o_shape(c)));
  EXPECT_TRUE(all_close(split.lse, full.lse, kTolLse, "lse", lse_shape(c)));
}

TEST(VerifySplit, LargestTree) {
  // 1025 nodes: 17 mask words, tail tiles past the first 16.
  for (test::TreeKind kind : {test::TreeKind::kDeep, test::TreeKind::kRandom}) {
    const VerifyCase c(test::make_spec(1, 1, kMaxTreeNodes, 3, 16, DType::kFP16, kind), 31);
    SCOPED_TRACE(c.describe());
    ASSERT_EQ(c.mask_words, kMaxMaskWords);
    const Result full = run(&cpu::verify_full, c, VerifyPart::kAll);
    const Result split = run(&cpu::verify_split, c, VerifyPart::kAll);
    EXPECT_TRUE(all_close(split.o, full.o, kTolO, "o", o_shape(c)));
    EXPECT_TRUE(all_close(split.lse, full.lse, kTolLse, "lse", lse_shape(c)));
  }
}

TEST(VerifySplit, NodesSeeExactlyTheirAncestors) {
  // Overwriting the latent row of a tail node that node i does not see leaves row i bit-exact;
  // overwriting one it sees changes it. Nodes span three mask words.
  test::CaseSpec s = test::make_spec(1, 2, 150, 20, 16, DType::kFP32, test::TreeKind::kRandom);
  const VerifyCase base(s, 8);
  for (auto fn : {&cpu::verify_full, &cpu::verify_split}) {
    const Result before = run(fn, base, VerifyPart::kAll);
    for (int j : {0, 3, 64, 100, 149}) {
      VerifyCase changed = base;
      float* kv = reinterpret_cast<float*>(changed.kv_cache.data());
      for (int c = 0; c < kHeadDimQK; ++c)
        kv[changed.kv_index(0, base.prefix_lens[0] + j, c)] += 0.5f;
      const Result after = run(fn, changed, VerifyPart::kAll);
      for (int i = 0; i < base.total_q; ++i) {
        const bool sees = (base.tree_mask[i * base.mask_words + j / 64] >> (j % 64)) & 1u;
        const int64_t n = static_cast<int64_t>(base.num_heads) * kHeadDimV;
        const bool same = all_close(&after.o[i * n], &before.o[i * n], n, Tolerance{}, "o");
        ASSERT_EQ(same, !sees) << "node " << i << " vs changed tail node " << j;
      }
    }
  }
}

TEST(VerifySplit, PoisonedSlotsAndPagesAreNeverRead) {
  // Unused slots (including the rest of each request's last page) hold NaN and unused page
  // table entries 0x7fffffff; the results must equal a run with finite filler instead.
  std::mt19937 rng(3);
  for (int k = 0; k < 12; ++k) {
    CaseSpec s = sweep_spec(k * 5 + 2, rng);
    s.q_lens.push_back(0);  // an empty request: its pages must not be read either
    s.prefix_lens.push_back(33);
    s.extra_pages = 3;
    const uint32_t seed = rng();
    const VerifyCase poisoned(s, seed);
    s.poison = false;
    const VerifyCase clean(s, seed);
    SCOPED_TRACE(poisoned.describe());
    for (auto fn : {&cpu::verify_full, &cpu::verify_split})
      for (VerifyPart part : {VerifyPart::kAll, VerifyPart::kPrefix, VerifyPart::kTail}) {
        const Result a = run(fn, poisoned, part), b = run(fn, clean, part);
        ASSERT_TRUE(test::all_finite(a.o, "o"));
        ASSERT_TRUE(all_close(a.o, b.o, Tolerance{}, "o", o_shape(poisoned)))
            << test::part_name(part);
        ASSERT_TRUE(all_close(a.lse, b.lse, Tolerance{}, "lse", lse_shape(poisoned)))
            << test::part_name(part);
      }
  }
}

}  // namespace
