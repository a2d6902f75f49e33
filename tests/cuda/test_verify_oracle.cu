// GPU verify attention against the double reference on peaked data (VerifyCase::plant_peaks),
// compared per (node, head) row with bounds derived from a same-precision baseline
// (common/row_check.h). The peaks sit where a wrong kernel most likely goes wrong: the first and
// last prefix rows, 32-row block boundaries, both sides of every split boundary the schedule makes
// (for each tile configuration), and tree-tail rows (the root, which every node sees, the last
// node, and chosen nodes). A kernel that drops, repeats or misreads one of those keys moves a
// peaked row's LSE by a few percent: hundreds of times its bound (tests/cpu/oracle shows the
// comparator failing for such errors on the CPU). Each check prints its worst row's ratio to its
// bound, the margin, into the GPU log.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_case.h"

namespace treemla::test {
namespace {

using Rows = std::vector<std::vector<int64_t>>;

// Split boundaries (first rows of splits 1..) per request, united over the configurations.
Rows split_boundaries(const VerifyCase& c, VerifyPart part) {
  DeviceCase d(c);
  d.p.part = part;
  Rows all(c.batch);
  for (const GpuConfig& cfg : configs_to_test(c)) {
    const cuda::VerifyPlan plan =
        cuda::make_verify_plan({c.batch, std::max(1, c.total_q), c.num_heads, case_max_q_len(c)},
                               -1, cfg.tile, cfg.family);
    DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
    cuda::init_workspace(plan, ws.ptr, 0);
    const Rows b = schedule_boundaries(d, plan, ws.ptr);
    for (int r = 0; r < c.batch; ++r) all[r].insert(all[r].end(), b[r].begin(), b[r].end());
  }
  return all;
}

// Where the peaks go in each request: block edges and split boundaries of the prefix (unless only
// the tail is computed), the root, the last node and the given tail nodes (unless only the
// prefix is computed).
Rows peak_rows(const VerifyCase& c, const Rows& splits, VerifyPart part,
               const std::vector<int>& tail_nodes) {
  Rows rows(c.batch);
  for (int b = 0; b < c.batch; ++b) {
    const int64_t prefix = c.prefix_lens[b];
    const int q_len = c.q_len(b);
    if (part != VerifyPart::kTail) {
      rows[b] = block_edge_rows(prefix);
      const std::vector<int64_t> around = rows_around(splits[b], prefix);
      rows[b].insert(rows[b].end(), around.begin(), around.end());
    }
    if (part != VerifyPart::kPrefix && q_len > 0) {
      rows[b].push_back(prefix);
      rows[b].push_back(prefix + q_len - 1);
      for (int j : tail_nodes)
        if (j < q_len) rows[b].push_back(prefix + j);
    }
  }
  return rows;
}

// Builds the peaked case, runs every configuration against the reference and returns the
// number of split boundaries the peaks were aimed at; -1 when TREEMLA_TEST_FAMILY leaves no
// configuration that can run the case (a family of at most 16 rows a request).
int64_t check_peaked(CaseSpec spec, uint32_t seed, VerifyPart part = VerifyPart::kAll,
                     const std::vector<int>& tail_nodes = {}) {
  spec.peaks = true;
  VerifyCase c(spec, seed);
  if (configs_to_test(c).empty()) return -1;
  const Rows splits = split_boundaries(c, part);
  c.plant_peaks(peak_rows(c, splits, part, tail_nodes));
  const CpuResult ref = run_reference(c, part);
  DeviceCase d(c);
  const char* test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (const GpuConfig& cfg : configs_to_test(c)) {
    SCOPED_TRACE(cfg.name() + " part=" + part_name(part));
    const GpuResult g = run_gpu(d, c, cfg, part);
    const ::testing::AssertionResult r = matches(g, ref, c);
    EXPECT_TRUE(r);
    std::printf("[ margin ] %s seed %u %s part %s: %s\n", test, seed, cfg.name().c_str(),
                part_name(part), r.message());
  }
  int64_t n = 0;
  for (const auto& s : splits) n += static_cast<int64_t>(s.size());
  return n;
}

// At least one split boundary was aimed at (unless no configuration ran the case).
#define EXPECT_AIMED(n)                                              \
  do {                                                               \
    const int64_t aimed = (n);                                       \
    if (aimed >= 0) {                                                \
      EXPECT_GT(aimed, 0) << "the schedule made no split to aim at"; \
    }                                                                \
  } while (0)

TEST(VerifyOracle, EdgesBlocksAndSplits) {
  REQUIRE_GPU();
  check_peaked(make_spec(1, 8, 9, 4097, 16), 2000);
  check_peaked(make_spec(1, 8, 9, 4097, 16, DType::kFP16), 2001);
  check_peaked(make_spec(2, 16, 16, 1500, 64), 2002);
}

TEST(VerifyOracle, DecodeOnTheLongestPrefix) {
  REQUIRE_GPU();
  // One node, one head: the schedule must cut 262,144 rows into many splits, each boundary a peak.
  EXPECT_AIMED(check_peaked(make_spec(1, 1, 1, 262144, 64, DType::kBF16, TreeKind::kSingle), 2100));
  EXPECT_AIMED(check_peaked(make_spec(1, 8, 2, 262144, 64, DType::kFP16, TreeKind::kChain), 2101));
}

// Requests of at most 16 rows (the decode family among the configurations): ragged lengths,
// q_len 0..2, split boundaries and the tail aimed at.
TEST(VerifyOracle, DecodeTilesRagged) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(1, 8, 1, 0, 16, DType::kBF16, TreeKind::kChain);
  s.q_lens = {1, 2, 0, 2, 1};
  s.prefix_lens = {70000, 33, 500, 0, 9000};
  EXPECT_AIMED(check_peaked(s, 2150, VerifyPart::kAll, {1}));
  s.dtype = DType::kFP16;
  s.page_size = 1;
  s.num_heads = 16;
  s.q_lens = {1, 1, 0, 1, 1};
  check_peaked(s, 2151);
}

TEST(VerifyOracle, LongPrefix100K) {
  REQUIRE_GPU();
  EXPECT_AIMED(check_peaked(make_spec(1, 8, 9, 100000, 128), 2200));
}

TEST(VerifyOracle, RaggedBatch) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(1, 8, 1, 0, 16);
  s.q_lens = {65, 1, 16, 130, 7, 1};
  s.prefix_lens = {3000, 0, 17, 999, 40000, 1};
  EXPECT_AIMED(check_peaked(s, 2300));
  s.dtype = DType::kFP16;
  s.page_size = 1;
  check_peaked(s, 2301);
}

TEST(VerifyOracle, TailRowsOfEveryTreeShape) {
  REQUIRE_GPU();
  // Peaks on the root (every node sees it), on nodes around the 32- and 64-row tail blocks and
  // mask words, and on the last node: only that node's descendants may feel each of them.
  uint32_t seed = 2400;
  for (TreeKind k : {TreeKind::kChain, TreeKind::kStar, TreeKind::kRandom, TreeKind::kDeep})
    check_peaked(make_spec(1, 4, 130, 300, 16, DType::kBF16, k), seed++, VerifyPart::kAll,
                 {1, 31, 32, 63, 64, 65, 100});
  check_peaked(make_spec(1, 1, kMaxTreeNodes, 100, 16, DType::kFP16, TreeKind::kRandom), seed++,
               VerifyPart::kAll, {1, 63, 64, 511, 512, 1000});
}

TEST(VerifyOracle, PrefixAndTailParts) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(3, 8, 65, 1234, 16);
  s.prefix_lens = {20000, 0, 77};
  check_peaked(s, 2500, VerifyPart::kPrefix);
  check_peaked(s, 2501, VerifyPart::kTail, {1, 32, 64});
}

TEST(VerifyOracle, PageSizeOneScattered) {
  REQUIRE_GPU();
  check_peaked(make_spec(2, 8, 65, 1000, 1), 2600);
  check_peaked(make_spec(1, 3, 16, 5000, 1, DType::kFP16), 2601);
}

// The refined last wave (schedule.cu, "The last wave"): one 16-row tile a request and four more
// requests than the largest persistent grid of the configurations, so the items fill whole waves
// and four more, which the schedule cuts into pieces. Each request has a single split, so every
// boundary aimed at is a piece's: EXPECT_AIMED fails if nothing was refined.
TEST(VerifyOracle, RefinedLastWave) {
  REQUIRE_GPU();
  const int grid = largest_persistent_grid();
  if (grid == 0) return;  // TREEMLA_TEST_FAMILY left no configuration
  CaseSpec s = make_spec(grid + 4, 4, 4, 0, 16);
  for (int b = 0; b < grid + 4; ++b) s.prefix_lens[b] = 520 + 9 * (b % 7);
  EXPECT_AIMED(check_peaked(s, 2700));
}

}  // namespace
}  // namespace treemla::test
