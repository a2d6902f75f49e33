// treemla tests: the serving-loop simulation behind `treemla simulate`, on small configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../../tools/treemla/simulation.h"

namespace treemla::tool {
namespace {

// Short prompts, small pages, few heads: a run of a few dozen rounds takes milliseconds.
SimulationConfig small_config() {
  SimulationConfig c;
  c.rounds = 40;
  c.seed = 7;
  c.heads = 1;
  c.budget = 15;
  c.depth = 5;
  c.top_k = 3;
  c.page_size = 4;
  c.max_requests = 3;
  c.prompt_min = 8;
  c.prompt_max = 40;
  c.gen_min = 8;
  c.gen_max = 24;
  c.check_every = 5;
  c.progress_every = 0;
  return c;
}

void expect_consistent(const SimulationConfig& c, const SimulationReport& r) {
  EXPECT_TRUE(r.checks_passed()) << "row mismatches " << r.row_mismatches << ", non-finite " << r.nonfinite_outputs
                                 << ", cross-check failures " << r.cross_check_failures << ", plan mismatches "
                                 << r.commit_plan_mismatches;
  EXPECT_EQ(r.rounds, c.rounds);
  EXPECT_EQ(r.requests_admitted, r.requests_finished + r.requests_cut_short + r.requests_live_at_end);
  ASSERT_EQ(r.acceptance_histogram.size(), static_cast<size_t>(c.depth) + 2);
  EXPECT_EQ(r.acceptance_histogram[0], 0);
  int64_t rounds = 0, tokens = 0;
  for (size_t n = 0; n < r.acceptance_histogram.size(); ++n) {
    rounds += r.acceptance_histogram[n];
    tokens += static_cast<int64_t>(n) * r.acceptance_histogram[n];
  }
  EXPECT_EQ(rounds, r.request_rounds);
  EXPECT_EQ(tokens, r.tokens_committed);
  EXPECT_LE(r.peak_pages_used, r.num_pages);
  EXPECT_EQ(r.final_metrics.pages_used + r.final_metrics.pages_free, r.num_pages);
}

TEST(Simulation, SmallRunCommitsTokensAndChecksData) {
  const SimulationConfig c = small_config();
  const SimulationReport r = run_simulation(c);
  expect_consistent(c, r);
  EXPECT_GT(r.request_rounds, 0);
  EXPECT_GT(r.tokens_committed, 0);
  EXPECT_GT(r.requests_finished, 0);  // churn: 40 rounds outlive requests of at most 24 tokens
  EXPECT_GE(r.mean_acceptance(), 1.0);
  EXPECT_LE(r.mean_acceptance(), c.depth + 1.0);
  EXPECT_GT(r.rows_checked, r.tokens_committed);  // committed rows plus the periodic full re-reads
  EXPECT_EQ(r.cross_checks, c.rounds / c.check_every);
  EXPECT_LT(r.cross_check_max_diff, 1e-4);
  EXPECT_EQ(r.verify_calls, c.rounds);
  EXPECT_EQ(r.tree_nodes, 16);
}

TEST(Simulation, DeterministicForASeed) {
  SimulationConfig c = small_config();
  const SimulationReport a = run_simulation(c);
  const SimulationReport b = run_simulation(c);
  EXPECT_EQ(a.trace, b.trace);
  EXPECT_EQ(a.tokens_committed, b.tokens_committed);
  EXPECT_EQ(a.acceptance_histogram, b.acceptance_histogram);
  EXPECT_EQ(a.requests_admitted, b.requests_admitted);
  EXPECT_EQ(a.defrags.size(), b.defrags.size());
  EXPECT_EQ(a.pages_relocated, b.pages_relocated);
  EXPECT_EQ(a.commit_row_moves, b.commit_row_moves);
  EXPECT_EQ(a.rows_checked, b.rows_checked);
  c.seed = 8;
  const SimulationReport other = run_simulation(c);
  EXPECT_NE(a.trace, other.trace);
}

// Queries and latent rows come from their own stream, so the serving trajectory does not depend
// on the head count (only the attention outputs, and with them the trace, do).
TEST(Simulation, TrajectoryIndependentOfHeads) {
  SimulationConfig c = small_config();
  const SimulationReport one = run_simulation(c);
  c.heads = 3;
  const SimulationReport three = run_simulation(c);
  EXPECT_TRUE(three.checks_passed());
  EXPECT_EQ(one.acceptance_histogram, three.acceptance_histogram);
  EXPECT_EQ(one.requests_admitted, three.requests_admitted);
  EXPECT_EQ(one.defrags.size(), three.defrags.size());
  EXPECT_NE(one.trace, three.trace);
}

TEST(Simulation, LowThresholdForcesDefragThatHelps) {
  SimulationConfig c = small_config();
  c.defrag_threshold = 1.0;  // any request in more than one run
  const SimulationReport r = run_simulation(c);
  expect_consistent(c, r);
  ASSERT_FALSE(r.defrags.empty());
  int64_t relocated = 0;
  for (const DefragEvent& e : r.defrags) {
    EXPECT_GT(e.runs_per_request_before, 1.0) << "round " << e.round;
    EXPECT_DOUBLE_EQ(e.runs_per_request_after, 1.0) << "a full defrag makes every request contiguous";
    EXPECT_GE(e.mean_run_after, e.mean_run_before) << "round " << e.round;
    EXPECT_GT(e.moves, 0);
    relocated += e.pages_relocated;
  }
  EXPECT_EQ(relocated, r.pages_relocated);

  c.defrag_threshold = 0.0;  // off
  const SimulationReport off = run_simulation(c);
  EXPECT_TRUE(off.defrags.empty());
  EXPECT_TRUE(off.checks_passed());
}

TEST(Simulation, PartialDefragNeverWorsens) {
  SimulationConfig c = small_config();
  c.defrag_threshold = 1.0;
  c.defrag_max_moves = 2;
  c.policy = kvpool::FreePolicy::kSorted;
  const SimulationReport r = run_simulation(c);
  expect_consistent(c, r);
  ASSERT_FALSE(r.defrags.empty());
  for (const DefragEvent& e : r.defrags) {
    EXPECT_LE(e.moves, 2);
    EXPECT_LE(e.runs_per_request_after, e.runs_per_request_before);
  }
}

// The smallest pool that admits one request: admissions wait and requests that cannot grow are
// finished early, never a crash.
TEST(Simulation, TightPoolDegradesGracefully) {
  SimulationConfig c = small_config();
  c.rounds = 60;
  c.max_requests = 4;
  c.num_pages = static_cast<int>(pages_for_rows(c.prompt_max + tree_nodes(c), c.page_size));
  const SimulationReport r = run_simulation(c);
  expect_consistent(c, r);
  EXPECT_EQ(r.num_pages, c.num_pages);
  EXPECT_GT(r.admission_deferrals, 0);
  EXPECT_GT(r.requests_cut_short, 0);
  EXPECT_GT(r.tokens_committed, 0);
}

TEST(Simulation, PageSizeOneAndSortedPolicy) {
  SimulationConfig c = small_config();
  c.page_size = 1;
  c.policy = kvpool::FreePolicy::kSorted;
  c.rounds = 20;
  const SimulationReport r = run_simulation(c);
  expect_consistent(c, r);
}

TEST(Simulation, AcceptProbabilityBounds) {
  SimulationConfig c = small_config();
  c.rounds = 15;
  c.accept_prob = 0.0;  // the target never agrees: only the root is committed
  const SimulationReport none = run_simulation(c);
  EXPECT_DOUBLE_EQ(none.mean_acceptance(), 1.0);
  c.accept_prob = 1.0;  // always agrees: every walk runs to a leaf
  const SimulationReport all = run_simulation(c);
  EXPECT_GT(all.mean_acceptance(), 2.0);
  EXPECT_LE(all.mean_acceptance(), c.depth + 1.0);
  EXPECT_TRUE(all.checks_passed());
}

TEST(Simulation, ProgressLines) {
  SimulationConfig c = small_config();
  c.rounds = 12;
  c.progress_every = 4;
  std::ostringstream os;
  run_simulation(c, &os);
  const std::string s = os.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 3);
  EXPECT_NE(s.find("round   12"), std::string::npos) << s;
}

TEST(Simulation, DefaultPoolFitsTheWorkload) {
  SimulationConfig c;
  EXPECT_EQ(tree_nodes(c), 16);
  // 4 requests x ceil((256 + 96 + 16) / 16) pages + 1 scratch page.
  EXPECT_EQ(default_num_pages(c), 4 * 23 + 1);
  c.budget = 1000;
  c.depth = 2;
  c.top_k = 3;
  EXPECT_EQ(tree_nodes(c), 1 + 3 + 9);  // the budget exceeds every path
}

TEST(Simulation, BadConfigRejectedNamingTheOption) {
  struct Case {
    const char* option;
    void (*mutate)(SimulationConfig&);
  };
  const Case cases[] = {
      {"--rounds", [](SimulationConfig& c) { c.rounds = 0; }},
      {"--heads", [](SimulationConfig& c) { c.heads = 0; }},
      {"--heads", [](SimulationConfig& c) { c.heads = 129; }},
      {"--budget", [](SimulationConfig& c) { c.budget = 0; }},
      {"--budget", [](SimulationConfig& c) { c.budget = 1025; }},
      {"--depth", [](SimulationConfig& c) { c.depth = 0; }},
      {"--topk", [](SimulationConfig& c) { c.top_k = 0; }},
      {"--page-size", [](SimulationConfig& c) { c.page_size = 12; }},
      {"--page-size", [](SimulationConfig& c) { c.page_size = 0; }},
      {"--max-requests", [](SimulationConfig& c) { c.max_requests = 0; }},
      {"--prompt-min", [](SimulationConfig& c) { c.prompt_min = 0; }},
      {"--prompt-max", [](SimulationConfig& c) { c.prompt_max = c.prompt_min - 1; }},
      {"--gen-max", [](SimulationConfig& c) { c.gen_max = c.gen_min - 1; }},
      {"--accept-prob", [](SimulationConfig& c) { c.accept_prob = 1.5; }},
      {"--accept-prob", [](SimulationConfig& c) { c.accept_prob = -0.1; }},
      {"--defrag-threshold", [](SimulationConfig& c) { c.defrag_threshold = 0.5; }},
      {"--defrag-max-moves", [](SimulationConfig& c) { c.defrag_max_moves = -1; }},
      {"--num-pages", [](SimulationConfig& c) { c.num_pages = 3; }},  // smaller than one request
      {"--num-pages", [](SimulationConfig& c) { c.num_pages = -1; }},
      {"--check-every", [](SimulationConfig& c) { c.check_every = -1; }},
      {"--progress-every", [](SimulationConfig& c) { c.progress_every = -1; }},
      {"--device", [](SimulationConfig& c) { c.device = "cuda"; }},
      {"--device", [](SimulationConfig& c) { c.device = "tpu"; }},
  };
  for (const Case& k : cases) {
    SimulationConfig c = small_config();
    k.mutate(c);
    try {
      run_simulation(c);
      ADD_FAILURE() << "expected " << k.option << " to be rejected";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string(k.option) + " = ", 0), 0u)
          << "message: " << e.what();
    }
  }
  SimulationConfig c = small_config();
  c.device = "cuda";
  try {
    validate_config(c);
    ADD_FAILURE() << "cuda accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not available in this build"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace treemla::tool
