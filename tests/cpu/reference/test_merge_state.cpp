// merge_state: LSE-weighted combination of partial attention states, empty parts, aliasing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/compare.h"
#include "common/verify_case.h"
#include "treemla/attention.h"

namespace {

using treemla::cpu::merge_state;
using treemla::test::all_close;
using treemla::test::rand_unit;
using treemla::test::Tolerance;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct State {
  std::vector<float> v, s;
};

State random_state(std::mt19937& rng, int n, int dim, double lse_spread) {
  State st{std::vector<float>(static_cast<size_t>(n) * dim), std::vector<float>(n)};
  for (auto& x : st.v) x = static_cast<float>(2 * rand_unit(rng) - 1);
  for (auto& x : st.s) x = static_cast<float>(lse_spread * (2 * rand_unit(rng) - 1));
  return st;
}

State merged(const State& a, const State& b, int n, int dim) {
  State out{std::vector<float>(a.v.size()), std::vector<float>(a.s.size())};
  merge_state(a.v.data(), a.s.data(), b.v.data(), b.s.data(), out.v.data(), out.s.data(), n, 1,
              dim);
  return out;
}

TEST(MergeState, HandComputedWeights) {
  // Weights e^0 : e^(ln 3) = 1 : 3, so v = (1/4) v_a + (3/4) v_b and s = ln 4.
  const std::vector<float> va = {1.f, 2.f}, vb = {3.f, 4.f}, sa = {0.f},
                           sb = {static_cast<float>(std::log(3.0))};
  std::vector<float> v(2), s(1);
  merge_state(va.data(), sa.data(), vb.data(), sb.data(), v.data(), s.data(), 1, 1, 2);
  EXPECT_TRUE(all_close(v, {2.5f, 3.5f}, Tolerance{1e-6, 1e-6}, "v"));
  EXPECT_TRUE(all_close(s, {static_cast<float>(std::log(4.0))}, Tolerance{1e-6, 1e-6}, "s"));
}

TEST(MergeState, MatchesDirectSoftmaxOfThreeParts) {
  // Three parts with LSEs l_k: the exact merge weights are exp(l_k) / sum exp(l_j).
  std::mt19937 rng(11);
  const int n = 37, dim = 19;
  const State a = random_state(rng, n, dim, 30), b = random_state(rng, n, dim, 30),
              c = random_state(rng, n, dim, 30);
  State left = merged(merged(a, b, n, dim), c, n, dim);
  State right = merged(a, merged(b, c, n, dim), n, dim);
  std::vector<float> want_v(a.v.size()), want_s(n);
  for (int i = 0; i < n; ++i) {
    const double m = std::max({a.s[i], b.s[i], c.s[i]});
    const double wa = std::exp(a.s[i] - m), wb = std::exp(b.s[i] - m), wc = std::exp(c.s[i] - m);
    const double z = wa + wb + wc;
    want_s[i] = static_cast<float>(m + std::log(z));
    for (int d = 0; d < dim; ++d) {
      const size_t k = static_cast<size_t>(i) * dim + d;
      want_v[k] = static_cast<float>((wa * a.v[k] + wb * b.v[k] + wc * c.v[k]) / z);
    }
  }
  const Tolerance tol{2e-6, 2e-6};
  EXPECT_TRUE(all_close(left.v, want_v, tol, "(a+b)+c v"));
  EXPECT_TRUE(all_close(left.s, want_s, tol, "(a+b)+c s"));
  EXPECT_TRUE(all_close(right.v, want_v, tol, "a+(b+c) v"));
  EXPECT_TRUE(all_close(right.s, want_s, tol, "a+(b+c) s"));
}

TEST(MergeState, EmptyPartIsIgnoredExactly) {
  // An empty part's v is garbage (NaN) on purpose: it must not leak into the result.
  std::mt19937 rng(12);
  const int dim = 8;
  const State full = random_state(rng, 1, dim, 5);
  for (float empty_lse : {-kInf, kInf, kNaN}) {
    SCOPED_TRACE(empty_lse);
    const State empty{std::vector<float>(dim, kNaN), std::vector<float>{empty_lse}};
    const State ab = merged(full, empty, 1, dim), ba = merged(empty, full, 1, dim);
    EXPECT_TRUE(all_close(ab.v, full.v, Tolerance{}, "full+empty v"));
    EXPECT_TRUE(all_close(ab.s, full.s, Tolerance{}, "full+empty s"));
    EXPECT_TRUE(all_close(ba.v, full.v, Tolerance{}, "empty+full v"));
    EXPECT_TRUE(all_close(ba.s, full.s, Tolerance{}, "empty+full s"));
  }
}

TEST(MergeState, TwoEmptyPartsGiveZeroAndMinusInfinity) {
  const int dim = 4;
  const float lses[] = {-kInf, kInf, kNaN};
  for (float la : lses)
    for (float lb : lses) {
      SCOPED_TRACE(::testing::Message() << "s_a=" << la << " s_b=" << lb);
      const State a{std::vector<float>(dim, kNaN), {la}}, b{std::vector<float>(dim, 7.f), {lb}};
      const State out = merged(a, b, 1, dim);
      EXPECT_TRUE(all_close(out.v, std::vector<float>(dim, 0.f), Tolerance{}, "v"));
      EXPECT_TRUE(all_close(out.s, {-kInf}, Tolerance{}, "s"));
    }
}

TEST(MergeState, FarApartLsesDoNotOverflow) {
  // exp(1000) overflows a double: the merge must work relative to the larger LSE.
  const std::vector<float> va = {1.f}, vb = {-1.f}, sa = {1000.f}, sb = {-1000.f};
  std::vector<float> v(1), s(1);
  merge_state(va.data(), sa.data(), vb.data(), sb.data(), v.data(), s.data(), 1, 1, 1);
  EXPECT_TRUE(all_close(v, {1.f}, Tolerance{}, "v"));
  EXPECT_TRUE(all_close(s, {1000.f}, Tolerance{}, "s"));
  // Equal large LSEs: weights 1/2 each, LSE + ln 2.
  const std::vector<float> sc = {500.f};
  merge_state(va.data(), sc.data(), vb.data(), sc.data(), v.data(), s.data(), 1, 1, 1);
  EXPECT_TRUE(all_close(v, {0.f}, Tolerance{}, "v"));
  EXPECT_TRUE(all_close(s, {static_cast<float>(500 + std::log(2.0))}, Tolerance{0, 1e-7}, "s"));
}

TEST(MergeState, OutputMayAliasEitherInput) {
  std::mt19937 rng(13);
  const int tokens = 5, heads = 3, dim = 16, n = tokens * heads;
  State a = random_state(rng, n, dim, 4), b = random_state(rng, n, dim, 4);
  a.s[2] = -kInf;  // cover the copy paths too
  b.s[4] = -kInf;
  a.s[6] = b.s[6] = -kInf;
  State want{std::vector<float>(a.v.size()), std::vector<float>(n)};
  merge_state(a.v.data(), a.s.data(), b.v.data(), b.s.data(), want.v.data(), want.s.data(), tokens,
              heads, dim);
  State into_a = a;
  merge_state(into_a.v.data(), into_a.s.data(), b.v.data(), b.s.data(), into_a.v.data(),
              into_a.s.data(), tokens, heads, dim);
  EXPECT_TRUE(all_close(into_a.v, want.v, Tolerance{}, "v aliasing v_a"));
  EXPECT_TRUE(all_close(into_a.s, want.s, Tolerance{}, "s aliasing s_a"));
  State into_b = b;
  merge_state(a.v.data(), a.s.data(), into_b.v.data(), into_b.s.data(), into_b.v.data(),
              into_b.s.data(), tokens, heads, dim);
  EXPECT_TRUE(all_close(into_b.v, want.v, Tolerance{}, "v aliasing v_b"));
  EXPECT_TRUE(all_close(into_b.s, want.s, Tolerance{}, "s aliasing s_b"));
}

TEST(MergeState, HeadsAndTokensAreIndependent) {
  // tokens x heads pairs are merged one by one: the result matches n separate 1 x 1 merges.
  std::mt19937 rng(14);
  const int tokens = 4, heads = 6, dim = 9, n = tokens * heads;
  const State a = random_state(rng, n, dim, 8), b = random_state(rng, n, dim, 8);
  State batched{std::vector<float>(a.v.size()), std::vector<float>(n)};
  merge_state(a.v.data(), a.s.data(), b.v.data(), b.s.data(), batched.v.data(), batched.s.data(),
              tokens, heads, dim);
  for (int i = 0; i < n; ++i) {
    std::vector<float> v(dim), s(1);
    merge_state(&a.v[i * dim], &a.s[i], &b.v[i * dim], &b.s[i], v.data(), s.data(), 1, 1, dim);
    ASSERT_TRUE(all_close(v.data(), &batched.v[i * dim], dim, Tolerance{}, "v")) << "pair " << i;
    ASSERT_EQ(s[0], batched.s[i]) << "pair " << i;
  }
}

}  // namespace
