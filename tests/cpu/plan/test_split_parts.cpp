// How the schedule cuts a request's prefix blocks into splits and a split into refined pieces
// (cuda::even_part, src/cuda/common/schedule_model.h; the schedule kernel and every main kernel
// use it through split_range / resolve_work_item): contiguous non-empty parts that cover the range,
// inner boundaries on multiples of the family's alignment, near-equal sizes, and with alignment 1
// the plain cut k len / n; with the tree tail's weight (split_part) the last split lighter. The GPU
// suite's VerifyOracle tests place data at the boundaries the device schedule makes
// (tests/cuda/gpu_case.h, schedule_boundaries).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/common/schedule_model.h"

namespace treemla::test {
namespace {

struct Part {
  int begin, end;
};

std::vector<Part> cut(long long len, long long n, int align) {
  std::vector<Part> parts(static_cast<size_t>(n));
  for (long long k = 0; k < n; ++k) {
    cuda::even_part(len, k, n, align, parts[static_cast<size_t>(k)].begin,
                    parts[static_cast<size_t>(k)].end);
  }
  return parts;
}

TEST(SplitParts, CoverTheRangeOnAlignedBoundaries) {
  for (int align : {1, 2}) {
    for (long long len = 1; len <= 700; ++len) {
      // The schedule never makes more parts than len / kMinChunkBlocks (splits_for; the refined
      // pieces likewise), nor fewer than one.
      const long long most = std::max(1LL, len / cuda::kMinChunkBlocks);
      for (long long n = 1; n <= most; ++n) {
        const std::vector<Part> parts = cut(len, n, align);
        ASSERT_EQ(parts.front().begin, 0) << "len " << len << " n " << n << " align " << align;
        ASSERT_EQ(parts.back().end, len) << "len " << len << " n " << n << " align " << align;
        int smallest = parts[0].end - parts[0].begin, largest = smallest;
        for (size_t k = 0; k < parts.size(); ++k) {
          const int size = parts[k].end - parts[k].begin;
          ASSERT_GT(size, 0) << "part " << k << " of len " << len << " n " << n << " align "
                             << align;
          if (k > 0) {
            ASSERT_EQ(parts[k].begin, parts[k - 1].end) << "part " << k << " of len " << len;
            ASSERT_EQ(parts[k].begin % align, 0) << "part " << k << " of len " << len;
          }
          smallest = std::min(smallest, size);
          largest = std::max(largest, size);
        }
        // Whole units of `align` blocks differ by at most one; the last part may end half a unit
        // early (len not a multiple of align).
        EXPECT_LE(largest - smallest, 2 * align - 1)
            << "len " << len << " n " << n << " align " << align;
      }
    }
  }
}

TEST(SplitParts, AlignmentOneIsThePlainCut) {
  for (long long len : {1LL, 7LL, 64LL, 413LL, 4096LL, 5782LL, 8192LL}) {
    for (long long n : {1LL, 3LL, 14LL, 33LL}) {
      if (n > std::max(1LL, len / cuda::kMinChunkBlocks)) continue;
      const std::vector<Part> parts = cut(len, n, 1);
      for (long long k = 0; k < n; ++k) {
        EXPECT_EQ(parts[static_cast<size_t>(k)].begin, k * len / n);
        EXPECT_EQ(parts[static_cast<size_t>(k)].end, (k + 1) * len / n);
      }
    }
  }
}

// The GLM-5 shape's 14 splits of 5782 blocks: with the sm90a alignment every split starts on an
// even block (a 64-key boundary), where the plain cut started every odd split on an odd block.
TEST(SplitParts, Sm90aSplitsOfTheGlm5ShapeStartOn64KeyBoundaries) {
  EXPECT_EQ(cuda::split_align_for(true), 2);
  EXPECT_EQ(cuda::split_align_for(false), 1);
  const std::vector<Part> plain = cut(5782, 14, 1), aligned = cut(5782, 14, 2);
  EXPECT_EQ(plain[1].begin, 413);  // odd
  for (const Part& p : aligned) EXPECT_EQ(p.begin % 2, 0);
  // A request's refined piece is cut the same way inside its split.
  const std::vector<Part> pieces = cut(aligned[3].end - aligned[3].begin, 5, 2);
  for (const Part& p : pieces) EXPECT_EQ((aligned[3].begin + p.begin) % 2, 0);
}

// The tree tail's weight (cuda::tail_weight, cuda::split_part): the last split, which also does
// the tree tail, is `w` blocks lighter than an even cut would make it, the other splits share
// those blocks, the parts still cover the range contiguously on aligned boundaries and none is
// empty, for every weight the schedule can give (tail_weight caps it at half a split's share).
TEST(SplitParts, TheTailWeightLightensTheLastSplitOnly) {
  for (int align : {1, 2}) {
    for (int len = 8; len <= 600; ++len) {
      const int most = std::max(1, len / cuda::kMinChunkBlocks);
      for (int n = 1; n <= most; ++n) {
        for (int want : {0, 2, 4, 6, 8, 1000}) {
          const int w = cuda::tail_weight(16, len, n, true, 0, want);
          ASSERT_LE(w, want);
          ASSERT_LE(w, len / n / 2);
          std::vector<Part> parts(static_cast<size_t>(n));
          for (int k = 0; k < n; ++k)
            cuda::split_part(len, w, k, n, align, parts[static_cast<size_t>(k)].begin,
                             parts[static_cast<size_t>(k)].end);
          ASSERT_EQ(parts.front().begin, 0);
          ASSERT_EQ(parts.back().end, len) << "len " << len << " n " << n << " w " << w;
          for (size_t k = 0; k < parts.size(); ++k) {
            ASSERT_GT(parts[k].end, parts[k].begin) << "part " << k << " of len " << len << " n "
                                                    << n << " w " << w << " align " << align;
            if (k > 0) {
              ASSERT_EQ(parts[k].begin, parts[k - 1].end);
              ASSERT_EQ(parts[k].begin % align, 0);
            }
          }
          if (w == 0) {  // no weight: the plain even cut
            const std::vector<Part> even = cut(len, n, align);
            for (size_t k = 0; k < parts.size(); ++k) {
              ASSERT_EQ(parts[k].begin, even[k].begin);
              ASSERT_EQ(parts[k].end, even[k].end);
            }
          }
        }
      }
    }
  }
  // 1 x 16 x 16 at 131072 keys on the sm90a family: 4096 blocks in 33 splits, weight 4. The last
  // split gets 122 blocks where the even cut gives it 126 (one of the larger parts).
  const int w = cuda::tail_weight(16, 4096, 33, true, 0, 4);
  EXPECT_EQ(w, 4);
  int b = 0, e = 0;
  cuda::split_part(4096, w, 32, 33, 2, b, e);
  EXPECT_EQ(e - b, 122);
  cuda::even_part(4096, 32, 33, 2, b, e);
  EXPECT_EQ(e - b, 126);
  // One-row requests take the `one` weight; no weight without a tail, a request without rows or
  // one split.
  EXPECT_EQ(cuda::tail_weight(1, 4096, 33, true, 2, 4), 2);
  EXPECT_EQ(cuda::tail_weight(16, 4096, 33, false, 2, 4), 0);
  EXPECT_EQ(cuda::tail_weight(0, 4096, 33, true, 2, 4), 0);
  EXPECT_EQ(cuda::tail_weight(16, 4096, 1, true, 2, 4), 0);
}

}  // namespace
}  // namespace treemla::test
