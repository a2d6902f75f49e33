// Parent validation, depths, positions, ancestor masks (both directions) and the batch layout.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "treemla/error.h"
#include "treemla/tree.h"

using namespace treemla;
using namespace treemla::tree;

namespace {

enum class Shape { kChain, kStar, kRandom, kDeep, kBinary };
const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kChain:
      return "chain";
    case Shape::kStar:
      return "star";
    case Shape::kRandom:
      return "random";
    case Shape::kDeep:
      return "deep";
    case Shape::kBinary:
      return "binary";
  }
  return "?";
}

std::vector<int32_t> make_tree(Shape s, int n, std::mt19937& rng) {
  std::vector<int32_t> p(n);
  p[0] = -1;
  for (int i = 1; i < n; ++i) {
    switch (s) {
      case Shape::kChain:
        p[i] = i - 1;
        break;
      case Shape::kStar:
        p[i] = 0;
        break;
      case Shape::kRandom:
        p[i] = static_cast<int32_t>(rng() % i);
        break;
      // Mostly extends one of the last few nodes: long paths with side branches.
      case Shape::kDeep:
        p[i] = (rng() % 8) ? i - 1 - static_cast<int32_t>(rng() % std::min(i, 3))
                           : static_cast<int32_t>(rng() % i);
        break;
      case Shape::kBinary:
        p[i] = (i - 1) / 2;
        break;
    }
  }
  return p;
}

// Independent references: walk to the root.
int ref_depth(const std::vector<int32_t>& p, int i) {
  int d = 0;
  while (p[i] >= 0) {
    i = p[i];
    ++d;
  }
  return d;
}
// vis[i][j] = 1 iff j is on the walk from i to the root.
std::vector<std::vector<char>> ref_visible(const std::vector<int32_t>& p) {
  const int n = static_cast<int>(p.size());
  std::vector<std::vector<char>> vis(n, std::vector<char>(n, 0));
  for (int i = 0; i < n; ++i)
    for (int u = i; u >= 0; u = p[u]) vis[i][u] = 1;
  return vis;
}

using test::expect_error;

const int kSizes[] = {1, 2, 3, 63, 64, 65, 127, 128, 129, 1025};
const Shape kShapes[] = {Shape::kChain, Shape::kStar, Shape::kRandom, Shape::kDeep, Shape::kBinary};

}  // namespace

TEST(TreeValidate, AcceptsValidTrees) {
  std::mt19937 rng(1);
  for (Shape s : kShapes)
    for (int n : kSizes) EXPECT_NO_THROW(validate_parents(make_tree(s, n, rng))) << n;
}

TEST(TreeValidate, EachRuleNamesTheNode) {
  std::vector<int32_t> empty;
  expect_error([&] { validate_parents(empty); }, {"parents has 0 nodes", "1..1025"});
  std::vector<int32_t> big(1026, 0);
  big[0] = -1;
  expect_error([&] { validate_parents(big); }, {"parents has 1026 nodes", "1..1025"});
  std::vector<int32_t> p = {-1, 0, 1, 1, 0, 3, 5};
  EXPECT_NO_THROW(validate_parents(p));
  auto bad = p;
  bad[0] = 0;
  expect_error([&] { validate_parents(bad); }, {"parents[0] = 0", "must be -1"});
  bad = p;
  bad[5] = 7;
  expect_error([&] { validate_parents(bad); }, {"parents[5] = 7 must be < 5", "precedes"});
  bad = p;
  bad[5] = 5;  // a node cannot be its own parent
  expect_error([&] { validate_parents(bad); }, {"parents[5] = 5 must be < 5"});
  bad = p;
  bad[3] = -1;
  expect_error([&] { validate_parents(bad); }, {"parents[3] = -1 must be >= 0", "root"});
  bad = p;
  bad[6] = -9;
  expect_error([&] { validate_parents(bad); }, {"parents[6] = -9"});
  // The first broken node is reported.
  bad = p;
  bad[2] = 2;
  bad[4] = 9;
  expect_error([&] { validate_parents(bad); }, {"parents[2] = 2"});
  // Every derivation validates.
  bad = p;
  bad[4] = 4;
  expect_error([&] { compute_depths(bad); }, {"parents[4]"});
  expect_error([&] { build_ancestor_mask(bad); }, {"parents[4]"});
  expect_error([&] { compute_positions(bad, 0); }, {"parents[4]"});
}

TEST(TreeDerive, DepthsPositionsMasksMatchReference) {
  for (uint32_t seed : {11u, 12u}) {
    std::mt19937 rng(seed);
    for (Shape s : kShapes) {
      for (int n : kSizes) {
        const auto p = make_tree(s, n, rng);
        SCOPED_TRACE(testing::Message()
                     << "seed " << seed << " shape " << shape_name(s) << " n " << n);
        const auto depth = compute_depths(p);
        const int32_t prefix = static_cast<int32_t>(rng() % 300000);
        const auto pos = compute_positions(p, prefix);
        ASSERT_EQ(depth.size(), static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          ASSERT_EQ(depth[i], ref_depth(p, i)) << "node " << i;
          ASSERT_EQ(pos[i], prefix + ref_depth(p, i)) << "node " << i;
        }
        const auto vis = ref_visible(p);
        const int words = mask_words_for(n);
        const auto mask = build_ancestor_mask(p);
        ASSERT_EQ(mask.size(), static_cast<size_t>(n) * words);
        // A wider stride, over a buffer poisoned with ones: every word must be rewritten.
        const int stride = kMaxMaskWords;
        std::vector<uint64_t> wide(static_cast<size_t>(n) * stride, ~uint64_t{0});
        write_ancestor_mask(p, stride, wide);
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j < stride * 64; ++j) {
            const bool want = j < n && vis[i][j];
            if (j < words * 64) {
              ASSERT_EQ(((mask[i * words + j / 64] >> (j % 64)) & 1) != 0, want)
                  << "row " << i << " bit " << j;
            }
            ASSERT_EQ(((wide[i * stride + j / 64] >> (j % 64)) & 1) != 0, want)
                << "stride " << stride << " row " << i << " bit " << j;
          }
        }
        // Mask -> parents round trip, at both strides.
        EXPECT_EQ(parents_from_mask(mask, n, words), p);
        EXPECT_EQ(parents_from_mask(wide, n, stride), p);
      }
    }
  }
}

TEST(TreeDerive, KnownSmallTree) {
  // 0 -> {1, 2}, 1 -> {3}, 3 -> {4}; node order not depth order is fine.
  const std::vector<int32_t> p = {-1, 0, 0, 1, 3};
  EXPECT_EQ(compute_depths(p), (std::vector<int32_t>{0, 1, 1, 2, 3}));
  EXPECT_EQ(compute_positions(p, 10), (std::vector<int32_t>{10, 11, 11, 12, 13}));
  EXPECT_EQ(build_ancestor_mask(p), (std::vector<uint64_t>{0b1, 0b11, 0b101, 0b1011, 0b11011}));
  EXPECT_EQ(compute_depths(std::vector<int32_t>{-1}), (std::vector<int32_t>{0}));
}

TEST(TreeDerive, ArgumentBounds) {
  const std::vector<int32_t> p(65, 0);
  std::vector<int32_t> t = p;
  t[0] = -1;
  std::vector<uint64_t> out(65 * 2);
  expect_error([&] { write_ancestor_mask(t, 1, out); },
               {"mask_words = 1", ">= ceil(n / 64) = 2", "n = 65"});
  std::vector<uint64_t> small(65 * 2 - 1);
  expect_error([&] { write_ancestor_mask(t, 2, small); }, {"out has 129 words", "65 * 2 = 130"});
  expect_error([&] { compute_positions(t, -1); }, {"prefix_len = -1", "0..1048576"});
  expect_error([&] { compute_positions(t, kMaxPrefixLen + 1); }, {"prefix_len = 1048577"});
  EXPECT_EQ(compute_positions(t, kMaxPrefixLen)[5], kMaxPrefixLen + 1);
}

TEST(TreeMask, RejectsInvalidMasks) {
  const std::vector<int32_t> p = {-1, 0, 0, 1, 3};
  const auto good = build_ancestor_mask(p);
  auto with = [&](int row, uint64_t value) {
    auto m = good;
    m[row] = value;
    return m;
  };
  std::vector<uint64_t> m;
  m = with(3, 0b0011);
  expect_error([&] { parents_from_mask(m, 5, 1); }, {"mask row 3 lacks its own bit 3"});
  m = with(2, 0b10101);
  expect_error([&] { parents_from_mask(m, 5, 1); }, {"mask row 2 word 0 has a bit above 2"});
  m = with(0, 0b11);
  expect_error([&] { parents_from_mask(m, 5, 1); }, {"mask row 0", "bit above 0"});
  m = with(2, 0b100);
  expect_error([&] { parents_from_mask(m, 5, 1); }, {"mask row 2 has no ancestor bit"});
  // Row 4 claims parent 3 but lacks 3's ancestor 1: not row 3 | bit 4.
  m = with(4, 0b11001);
  expect_error([&] { parents_from_mask(m, 5, 1); }, {"mask row 4 word 0", "must equal row 3"});
  // Row 3 with a non-ancestor (2) below its true parent.
  m = with(3, 0b1111);
  expect_error([&] { parents_from_mask(m, 5, 1); }, {"mask row 3", "must equal row 2"});
  // Padding words must be zero.
  std::vector<uint64_t> wide(5 * 3, 0);
  write_ancestor_mask(p, 3, wide);
  EXPECT_EQ(parents_from_mask(wide, 5, 3), p);
  wide[1 * 3 + 2] = 4;
  expect_error([&] { parents_from_mask(wide, 5, 3); }, {"mask row 1 word 2", "must be 0"});
  expect_error([&] { parents_from_mask(good, 0, 1); }, {"n = 0", "1..1025"});
  expect_error([&] { parents_from_mask(good, 65, 1); }, {"mask_words = 1", "= 2"});
  expect_error([&] { parents_from_mask(good, 6, 1); }, {"mask has 5 words", "6"});
}

TEST(TreeMask, RandomBitFlipsAreRejectedOrConsistent) {
  // parents_from_mask may only accept genuine tree masks: after flipping one bit, either it
  // throws or the mask it accepted is exactly the ancestor mask of the parents it returned.
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = kSizes[rng() % std::size(kSizes)];
    const auto p = make_tree(kShapes[rng() % std::size(kShapes)], n, rng);
    const int stride = mask_words_for(n) + static_cast<int>(rng() % 2);
    std::vector<uint64_t> m(static_cast<size_t>(n) * stride);
    write_ancestor_mask(p, stride, m);
    const size_t bit = rng() % (m.size() * 64);
    m[bit / 64] ^= uint64_t{1} << (bit % 64);
    try {
      const auto q = parents_from_mask(m, n, stride);
      std::vector<uint64_t> again(m.size());
      write_ancestor_mask(q, stride, again);
      ASSERT_EQ(again, m) << "seed " << seed << " trial " << trial << " bit " << bit;
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 2000) << "seed " << seed;
  EXPECT_GT(accepted, 0) << "seed " << seed;  // dropping a leaf's parent bit re-parents it
}

TEST(TreeBatch, LayoutMatchesPerTreeDerivations) {
  const uint32_t seed = 5;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 9);
    std::vector<std::vector<int32_t>> trees;
    std::vector<int32_t> prefix;
    int max_n = 0;
    for (int b = 0; b < batch; ++b) {
      const int n = kSizes[rng() % std::size(kSizes)];
      trees.push_back(make_tree(kShapes[rng() % std::size(kShapes)], n, rng));
      prefix.push_back(static_cast<int32_t>(rng() % 5 == 0 ? 0 : rng() % 262145));
      max_n = std::max(max_n, n);
    }
    const int explicit_words = (trial % 2) ? kMaxMaskWords : 0;
    const BatchLayout L = build_batch_layout(trees, prefix, explicit_words);
    SCOPED_TRACE(testing::Message() << "seed " << seed << " trial " << trial);
    ASSERT_EQ(L.batch, batch);
    ASSERT_EQ(L.mask_words, explicit_words ? explicit_words : mask_words_for(max_n));
    ASSERT_EQ(L.q_indptr.size(), static_cast<size_t>(batch + 1));
    ASSERT_EQ(L.q_indptr[0], 0);
    ASSERT_EQ(L.prefix_lens, prefix);
    ASSERT_EQ(L.total_q, L.q_indptr[batch]);
    ASSERT_EQ(L.positions.size(), static_cast<size_t>(L.total_q));
    ASSERT_EQ(L.tree_mask.size(), static_cast<size_t>(L.total_q) * L.mask_words);
    for (int b = 0; b < batch; ++b) {
      const int n = static_cast<int>(trees[b].size());
      ASSERT_EQ(L.q_indptr[b + 1] - L.q_indptr[b], n);
      const int begin = L.q_indptr[b];
      const auto vis = ref_visible(trees[b]);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(L.positions[begin + i], prefix[b] + ref_depth(trees[b], i));
        for (int j = 0; j < L.mask_words * 64; ++j) {
          const bool bit =
              (L.tree_mask[(size_t)(begin + i) * L.mask_words + j / 64] >> (j % 64)) & 1;
          ASSERT_EQ(bit, j < n && vis[i][j]) << "b " << b << " row " << i << " bit " << j;
        }
      }
    }
  }
}

TEST(TreeBatch, ArgumentErrors) {
  std::vector<std::vector<int32_t>> trees = {{-1, 0}, std::vector<int32_t>(65, 0), {-1}};
  trees[1][0] = -1;
  std::vector<int32_t> prefix = {0, 5, 7};
  EXPECT_EQ(build_batch_layout(trees, prefix).mask_words, 2);
  std::vector<int32_t> two = {0, 5};
  expect_error([&] { build_batch_layout(trees, two); }, {"prefix_lens has 2", "3"});
  expect_error([&] { build_batch_layout(trees, prefix, 1); }, {"mask_words = 1", "= 2", "17"});
  expect_error([&] { build_batch_layout(trees, prefix, 18); }, {"mask_words = 18", "17"});
  std::vector<std::vector<int32_t>> none;
  std::vector<int32_t> no_prefix;
  expect_error([&] { build_batch_layout(none, no_prefix); }, {"trees is empty"});
  auto bad = trees;
  bad[2] = {-1, 0, 3};
  expect_error([&] { build_batch_layout(bad, prefix); }, {"trees[2]", "parents[2] = 3"});
  auto neg = prefix;
  neg[1] = -4;
  expect_error([&] { build_batch_layout(trees, neg); }, {"prefix_lens[1] = -4"});
}
