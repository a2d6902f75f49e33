// treemla_sim: the serving loop behind `treemla simulate`, as a library (public header).
//
// Every round, for every live request: build a DDTree from a synthetic drafter, append the tree's
// latent rows after the request's prefix, run verify attention for the whole batch, accept a path
// against a synthetic target, commit the accepted rows and check them. Requests arrive with
// random prompts and leave after a random number of tokens, so the pool fragments; past a
// threshold the pool is defragmented and every live request's bytes are checked to read back
// unchanged. SimulationConfig holds the options, SimulationReport what a run did; the loop is
// simulation.cpp, the backends (where the bytes live) backend.h.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "sim/backend.h"
#include "sim/budget_model.h"
#include "treemla/attention.h"
#include "treemla/kvpool.h"
#include "treemla/tree.h"

namespace treemla::tool {

struct SimulationConfig {
  int64_t rounds = 60;
  uint32_t seed = 1;
  std::string device = "cpu";
  int heads = 2;    // query heads of the verify attention
  int budget = 15;  // DDTree nodes besides the root
  int depth = 7;    // DDTree depth limit (drafter block size - 1)
  int top_k = 4;    // drafter candidates per depth
  int page_size = 16;
  int num_pages = 0;     // 0: default_num_pages(config)
  int max_requests = 4;  // live requests at most
  int prompt_min = 32, prompt_max = 256;
  int gen_min = 16, gen_max = 96;  // tokens a request generates before it finishes
  kvpool::FreePolicy policy = kvpool::FreePolicy::kAsFreed;
  // Defragment when the live requests' pages form more than this many contiguous runs per
  // request on average (1 = every request contiguous). 0 turns defragmentation off.
  double defrag_threshold = 2.0;
  int64_t defrag_max_moves =
      0;  // 0: full defrag; otherwise a partial defrag of at most this many moves
  double accept_prob = 0.7;  // chance that the target picks one of a node's drafted children
  int check_every =
      10;  // every N rounds: split vs full attention, all live rows re-read; 0 = never
  // The attention cross-check runs only on rounds where every prefix is at most this many tokens
  // (0 = no limit): the double-precision reference takes minutes at 128k tokens.
  int check_max_context = 8192;
  int progress_every = 10;  // 0 = no progress lines
  int frag_report = -1;     // fragmentation report at the end: -1 = on for cuda, 0 = off, 1 = on
  int frag_reps = 20;       // timed runs per layout in that report (median)
  double draft_logit_range =
      4.0;  // the drafter's top-k logits are uniform in [0, this] (synthetic.h)
  std::string target = "children";  // the synthetic target: children or drafter (synthetic.h)
  // --budget auto: every request builds its tree at `budget` (the largest budget the picker may
  // choose) and verifies its first 1 + B nodes, B picked per request and round from cost_model.
  bool budget_auto = false;
  // With a cost table every request-round is costed (SimulationReport::cost); budget_auto needs
  // one.
  CostModelConfig cost_model;
};

// CUDA-event times of a device backend (kernels only), one entry per call; empty on the CPU.
struct GpuTimes {
  std::vector<double> verify_ms;  // per round
  std::vector<double> commit_ms;  // per round: acceptance + commit on the device
  std::vector<double> defrag_ms;  // per defrag
  double verify_flops = 0;        // of the timed verify calls
  int64_t defrag_bytes =
      0;  // page bytes copied by the timed defrags (each read once, written once)
};

struct FragLayout {
  bool measured = false;
  int page_size = 0;
  double runs_per_request = 0, pages_per_run = 0;
  double median_ms = 0, min_ms = 0;
};

// The prefix pass (VerifyPart::kPrefix) of the live requests at the end of the run, each at its
// current length with a chain of tree_nodes query rows, on three layouts of the same rows.
struct FragmentationReport {
  bool measured = false;
  std::string skipped;  // why not, when not measured
  int batch = 0, q_len = 0, heads = 0, reps = 0;
  int64_t prefix_rows = 0;
  double kv_bytes = 0, flops = 0;  // read and computed by one pass
  FragLayout churned;              // the pool as the run left it
  FragLayout defragged;   // after a full defrag of that pool (not measured if it had no spare page)
  FragLayout contiguous;  // a fresh cache of page size 64, each request contiguous
  int64_t final_defrag_moves = 0, final_defrag_bytes = 0;
  double final_defrag_ms = 0;
  double max_diff =
      0;  // largest |o| or |lse| difference of the other layouts against the churned one
};

struct DefragEvent {
  int64_t round = 0;
  double runs_per_request_before = 0, runs_per_request_after = 0;
  double mean_run_before = 0, mean_run_after = 0;  // pages per contiguous run
  int64_t pages_relocated = 0;
  int64_t moves = 0;  // page copies, scratch hops of cycles included
};

struct SimulationReport {
  int64_t rounds = 0;
  int32_t num_pages = 0;
  int32_t tree_nodes = 0;  // 1 + budget, or the full tree when fewer paths exist
  int64_t requests_admitted = 0, requests_finished = 0, requests_cut_short = 0,
          requests_live_at_end = 0;
  int64_t admission_deferrals = 0;  // rounds in which the next request waited for free pages
  int64_t request_rounds = 0;       // (request, round) pairs verified and committed
  int64_t tokens_committed = 0;
  std::vector<int64_t> acceptance_histogram;  // index = acceptance length, 0..depth + 1
  double verify_seconds = 0;
  double verify_flops = 0;
  int64_t verify_calls = 0;
  int64_t cross_checks = 0, cross_check_failures = 0;
  double cross_check_max_diff = 0;
  int64_t cross_checks_skipped = 0;  // due rounds with a prefix over check_max_context
  bool device_commit = false;        // acceptance and commit ran on the device
  int64_t accept_mismatches = 0;     // device acceptance != tree::accept_path on the host
  int64_t layout_mismatches = 0;     // fragmentation report: outputs differ between layouts
  int64_t nonfinite_outputs = 0;
  int64_t rows_checked = 0, row_mismatches = 0;
  int64_t commit_row_moves = 0, commit_pages_released = 0, commit_plan_mismatches = 0;
  std::vector<DefragEvent> defrags;
  int64_t defrags_skipped = 0;  // a full pool whose plan needed a scratch page
  int64_t defrags_without_moves =
      0;  // partial defrags that found nothing within --defrag-max-moves
  int64_t pages_relocated = 0, defrag_moves = 0;
  int32_t peak_pages_used = 0;
  kvpool::PoolMetrics final_metrics;
  uint64_t trace = 0;  // hash of the whole trajectory and every attention output
  double wall_seconds = 0;
  GpuTimes gpu;
  FragmentationReport frag;
  CostTally cost;          // with a cost model: every request-round costed alone, the budgets used
  double calibration = 1;  // with --budget auto: the picker's online calibration at the end

  double mean_acceptance() const {
    return request_rounds ? double(tokens_committed) / request_rounds : 0.0;
  }
  bool checks_passed() const {
    return row_mismatches == 0 && nonfinite_outputs == 0 && cross_check_failures == 0 &&
           commit_plan_mismatches == 0 && accept_mismatches == 0 && layout_mismatches == 0;
  }
};

// Bounds of the integer options: validate_config checks them, the tool's --help shows them.
struct IntRange {
  int64_t lo, hi;
};
namespace limits {
inline constexpr IntRange kRounds{1, 10000000};
inline constexpr IntRange kSeed{0, 4294967295LL};
inline constexpr IntRange kHeads{1, kMaxHeads};
inline constexpr IntRange kBudget{1, tree::kMaxBudget};
inline constexpr IntRange kDepth{1, tree::kMaxBudget};
inline constexpr IntRange kTopK{1, 256};
inline constexpr IntRange kPageSize{1, 1024};  // and a power of two
inline constexpr IntRange kNumPages{0, 1 << 24};
inline constexpr IntRange kMaxRequests{1, 256};
inline constexpr IntRange kPromptLen{1, 262144};
inline constexpr IntRange kGenLen{1, 262144};
inline constexpr IntRange kDefragMaxMoves{0, int64_t{1} << 30};
inline constexpr IntRange kCheckEvery{0, 10000000};
inline constexpr IntRange kCheckMaxContext{0, kMaxPrefixLen};
inline constexpr IntRange kProgressEvery{0, 10000000};
inline constexpr IntRange kFragReps{1, 1000};
inline constexpr double kMaxDraftLogitRange = 50.0;
}  // namespace limits

// Runs per live request (1 = every request contiguous); 1 for an empty pool.
inline double runs_per_request(const kvpool::PoolMetrics& m) {
  return m.num_requests ? double(m.total_runs) / m.num_requests : 1.0;
}

// Rows of one request's tree: 1 + budget, unless the budget exceeds all K + K^2 + .. + K^D paths.
int32_t tree_nodes(const SimulationConfig& c);

inline int64_t pages_for_rows(int64_t rows, int page_size) {
  return (rows + page_size - 1) / page_size;
}

// Room for every live request at its largest (prompt_max + gen_max + one tree), plus one free page
// so that a defrag can always break a cycle.
int64_t default_num_pages(const SimulationConfig& c);

// Throws std::invalid_argument naming the option ("--name: 'value' must be ...", or for a default
// pool too large for the cache, the options that size it and a value that fits).
void validate_config(const SimulationConfig& c);

// How far a run has got, for a live progress display (SimulationHooks::progress).
struct RunProgress {
  int64_t round = 0, rounds = 0;  // the round under way (1-based) and the rounds of the run
  double round_fraction = 0;      // of that round's attention work (verify, due cross-checks) done
  const char* activity = "";      // what the round is doing: "drafting", "verify", "cross-check"
  bool line_follows = false;  // a progress line is about to be written to SimulationHooks::lines
};

struct SimulationHooks {
  std::ostream* lines = nullptr;  // a progress line every config.progress_every rounds; null: none
  // Called at the start of each round, as its attention work gets done, and before each line.
  std::function<void(const RunProgress&)> progress;
  // Builds the backend instead of make_backend(config.device) (tests use it to run the device
  // hooks of the loop on the host).
  BackendFactory backend = nullptr;
};

// Runs the whole simulation. Throws std::invalid_argument for a bad config (naming the option),
// treemla::Error if a library call fails.
SimulationReport run_simulation(const SimulationConfig& config, const SimulationHooks& hooks = {});

}  // namespace treemla::tool
