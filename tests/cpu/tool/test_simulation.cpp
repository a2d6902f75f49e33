// treemla tests: the serving-loop simulation behind `treemla simulate`, on small configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/simulation.h"
#include "tool_test_util.h"

#ifdef TREEMLA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace treemla::tool {
namespace {

void expect_consistent(const SimulationConfig& c, const SimulationReport& r) {
  EXPECT_TRUE(r.checks_passed()) << "row mismatches " << r.row_mismatches << ", non-finite "
                                 << r.nonfinite_outputs << ", cross-check failures "
                                 << r.cross_check_failures << ", plan mismatches "
                                 << r.commit_plan_mismatches;
  EXPECT_EQ(r.rounds, c.rounds);
  EXPECT_EQ(r.requests_admitted,
            r.requests_finished + r.requests_cut_short + r.requests_live_at_end);
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
    EXPECT_DOUBLE_EQ(e.runs_per_request_after, 1.0)
        << "a full defrag makes every request contiguous";
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
  run_simulation(c, {.lines = &os});
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
#ifndef TREEMLA_WITH_CUDA
      {"--device", [](SimulationConfig& c) { c.device = "cuda"; }},
#endif
      {"--device", [](SimulationConfig& c) { c.device = "tpu"; }},
      {"--check-max-context", [](SimulationConfig& c) { c.check_max_context = -1; }},
      {"--frag-report", [](SimulationConfig& c) { c.frag_report = 2; }},
      {"--frag-reps", [](SimulationConfig& c) { c.frag_reps = 0; }},
  };
  for (const Case& k : cases) {
    SimulationConfig c = small_config();
    k.mutate(c);
    try {
      run_simulation(c);
      ADD_FAILURE() << "expected " << k.option << " to be rejected";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string(k.option) + ": ", 0), 0u)
          << "message: " << e.what();
    }
  }
#ifndef TREEMLA_WITH_CUDA
  SimulationConfig c = small_config();
  c.device = "cuda";
  try {
    validate_config(c);
    ADD_FAILURE() << "cuda accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not available in this build"), std::string::npos)
        << e.what();
  }
#endif
}

#ifdef TREEMLA_WITH_CUDA
// A CUDA build takes --device cuda as an option; the backend needs a GPU. No GPU is not a bad
// option, so the error is a runtime_error (exit 1 in the tool), not invalid_argument (exit 2).
// With a GPU, the CUDA backend (part of treemla_sim) runs the loop and its checks pass.
TEST(Simulation, CudaDeviceNeedsAGpu) {
  SimulationConfig c = small_config();
  c.device = "cuda";
  EXPECT_NO_THROW(validate_config(c));
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
    EXPECT_STREQ(make_backend("cuda", kvpool::PoolConfig{64, 16, kHeadDimQK, 2})->name(), "cuda");
    const SimulationReport r = run_simulation(c);
    expect_consistent(c, r);
    EXPECT_TRUE(r.device_commit);
    EXPECT_EQ(r.gpu.verify_ms.size(), static_cast<size_t>(c.rounds));
    return;
  }
  try {
    make_backend("cuda", kvpool::PoolConfig{64, 16, kHeadDimQK, 2});
    ADD_FAILURE() << "make_backend(cuda) succeeded without a GPU";
  } catch (const std::invalid_argument& e) {
    ADD_FAILURE() << "a missing GPU is not a bad option: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run_simulation(c), std::runtime_error);
}
#endif

// GLM-5 at long context: 8 heads, budget 64 (65 query rows), depth 15, 128k-token prompts at
// page size 1. The default pool holds four such requests; a larger cache than 4 GiB is refused
// on the host but allowed for a device cache (checked in a CUDA build).
TEST(Simulation, GlmFiveLongContextShapesValidate) {
  SimulationConfig c;
  c.heads = 8;
  c.budget = 64;
  c.depth = 15;
  c.page_size = 1;
  c.prompt_min = 32768;
  c.prompt_max = 131072;
  c.max_requests = 4;
  c.rounds = 40;
  EXPECT_EQ(tree_nodes(c), 65);
  EXPECT_EQ(default_num_pages(c), 4 * (131072 + 96 + 65) + 1);
  EXPECT_NO_THROW(validate_config(c));
  c.max_requests = 16;
  c.prompt_max = 262144;  // 16 x 262k rows x 1152 B: ~4.5 GiB
  try {
    validate_config(c);
    ADD_FAILURE() << "a 4.5 GiB host cache was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--max-requests 16 with --prompt-max 262144", 0), 0u)
        << e.what();
  }
#ifdef TREEMLA_WITH_CUDA
  c.device = "cuda";
  EXPECT_NO_THROW(validate_config(c));
#endif
}

TEST(Simulation, CrossCheckSkippedOverTheContextLimit) {
  SimulationConfig c = small_config();
  c.check_max_context = 16;  // prompts are 8..40 tokens, so most due rounds have a longer prefix
  const SimulationReport r = run_simulation(c);
  expect_consistent(c, r);
  EXPECT_GT(r.cross_checks_skipped, 0);
  EXPECT_EQ(r.cross_checks + r.cross_checks_skipped, c.rounds / c.check_every);
  c.check_max_context = 0;  // no limit
  EXPECT_EQ(run_simulation(c).cross_checks, c.rounds / c.check_every);
}

// The loop's side of --device cuda, run on the host: a backend with a host cache whose
// device_commit accepts with tree::accept_path and moves the rows itself (as
// cuda::commit_accepted does), and whose prefix-pass "timings" are CPU runs. With it the loop
// must do what it does with a GPU: keep its bookkeeping without applying the commit plans, count
// acceptance mismatches, and build the fragmentation report.
class HostDeviceBackend final : public SimBackend {
 public:
  HostDeviceBackend(const kvpool::PoolConfig& c, bool corrupt)
      : config_(c),
        corrupt_(corrupt),
        cache_(static_cast<size_t>(c.num_pages) * c.page_size * c.row_width, 0) {}
  const char* name() const override { return "host-device"; }
  void write_rows(std::span<const kvpool::RowSlot> slots, std::span<const uint16_t> rows) override {
    for (size_t i = 0; i < slots.size(); ++i)
      std::copy_n(rows.begin() + i * kHeadDimQK, kHeadDimQK, row(slots[i].page, slots[i].slot));
  }
  std::vector<uint64_t> hash_rows(std::span<const kvpool::RowSlot> slots) override {
    std::vector<uint64_t> out;
    for (const kvpool::RowSlot& s : slots) out.push_back(hash_row(row(s.page, s.slot), kHeadDimQK));
    return out;
  }
  void apply_commit(const kvpool::CommitPlan&) override {
    ADD_FAILURE() << "a plan applied after a device commit";
  }
  void apply_defrag(const kvpool::DefragPlan& plan) override {
    kvpool::apply_plan(config_, plan, cache_.data());
  }
  void verify(VerifyParams p, float* o, float* lse) override {
    p.kv_cache = cache_.data();
    cpu::verify_split(p, o, lse);
    indptr_.assign(p.q_indptr, p.q_indptr + p.batch + 1);
    prefix_.assign(p.prefix_lens, p.prefix_lens + p.batch);
    table_.assign(p.page_table, p.page_table + p.batch * p.page_table_stride);
    stride_ = p.page_table_stride;
  }
  void verify_reference(VerifyParams p, float* o, float* lse) override {
    p.kv_cache = cache_.data();
    cpu::verify_full(p, o, lse);
  }
  bool device_commit(std::span<const int32_t> parents, std::span<const int32_t> node_tokens,
                     std::span<const int32_t> target_tokens, int max_accept,
                     DeviceCommitResult& out) override {
    const size_t batch = prefix_.size();
    out = DeviceCommitResult{};
    out.max_accept = max_accept;
    out.accepted.assign(batch * max_accept, -1);
    for (size_t b = 0; b < batch; ++b) {
      const size_t q0 = static_cast<size_t>(indptr_[b]),
                   n = static_cast<size_t>(indptr_[b + 1]) - q0;
      tree::Acceptance acc = tree::accept_path(parents.subspan(q0, n), node_tokens.subspan(q0, n),
                                               target_tokens.subspan(q0, n));
      if (corrupt_ && b == 0 && acc.length > 1) {  // a wrong but well-formed answer: the root alone
        acc.nodes.resize(1);
        acc.length = 1;
        acc.bonus_token = target_tokens[q0];
      }
      const int32_t* t = table_.data() + b * stride_;
      for (int32_t k = 1; k < acc.length; ++k) {  // increasing k is safe in place (kvpool.h)
        const int32_t src = prefix_[b] + acc.nodes[k], dst = prefix_[b] + k;
        if (src != dst)
          std::copy_n(row(t[src / config_.page_size], src % config_.page_size), kHeadDimQK,
                      row(t[dst / config_.page_size], dst % config_.page_size));
      }
      std::copy(acc.nodes.begin(), acc.nodes.end(), out.accepted.begin() + b * max_accept);
      out.accept_len.push_back(acc.length);
      out.bonus_tokens.push_back(acc.bonus_token);
      out.new_seq_lens.push_back(prefix_[b] + acc.length);
    }
    return true;
  }
  double last_gpu_ms() const override { return 0.25; }
  bool time_prefix_pass(VerifyParams p, int reps, PrefixTiming& out) override {
    p.kv_cache = cache_.data();
    return run_prefix(p, reps, out);
  }
  bool time_prefix_pass_contiguous(VerifyParams p, int page_size, int reps,
                                   PrefixTiming& out) override {
    std::vector<int32_t> table;
    std::vector<uint16_t> fresh;
    int64_t stride = 1;
    for (int b = 0; b < p.batch; ++b)
      stride = std::max(
          stride,
          pages_for_rows(int64_t{p.prefix_lens[b]} + p.q_indptr[b + 1] - p.q_indptr[b], page_size));
    for (int b = 0; b < p.batch; ++b) {
      const int64_t base = static_cast<int64_t>(fresh.size()) / (int64_t{page_size} * kHeadDimQK);
      for (int64_t k = 0; k < stride; ++k) table.push_back(static_cast<int32_t>(base + k));
      fresh.resize(fresh.size() + static_cast<size_t>(stride) * page_size * kHeadDimQK, 0);
      for (int32_t t = 0; t < p.prefix_lens[b]; ++t) {
        const int32_t page = p.page_table[b * p.page_table_stride + t / config_.page_size];
        std::copy_n(
            row(page, t % config_.page_size), kHeadDimQK,
            fresh.data() + ((base + t / page_size) * page_size + t % page_size) * kHeadDimQK);
      }
    }
    p.kv_cache = fresh.data();
    p.page_size = page_size;
    p.num_pages = static_cast<int>(fresh.size() / (static_cast<size_t>(page_size) * kHeadDimQK));
    p.page_table = table.data();
    p.page_table_stride = static_cast<int>(stride);
    return run_prefix(p, reps, out);
  }

 private:
  uint16_t* row(int32_t page, int32_t slot) {
    return cache_.data() + (static_cast<size_t>(page) * config_.page_size + slot) * kHeadDimQK;
  }
  static bool run_prefix(VerifyParams p, int reps, PrefixTiming& out) {
    const size_t rows = static_cast<size_t>(p.q_indptr[p.batch]) * p.num_heads;
    out.o.assign(rows * kHeadDimV, 0.f);
    out.lse.assign(rows, 0.f);
    p.part = VerifyPart::kPrefix;
    cpu::verify_split(p, out.o.data(), out.lse.data());
    out.runs = reps;
    out.median_ms = out.min_ms = 1.0;
    return true;
  }

  kvpool::PoolConfig config_;
  bool corrupt_;
  std::vector<uint16_t> cache_;
  std::vector<int32_t> indptr_, prefix_, table_;
  int stride_ = 0;
};

std::unique_ptr<SimBackend> host_device(const kvpool::PoolConfig& c, const BackendLimits&) {
  return std::make_unique<HostDeviceBackend>(c, false);
}
std::unique_ptr<SimBackend> corrupt_host_device(const kvpool::PoolConfig& c, const BackendLimits&) {
  return std::make_unique<HostDeviceBackend>(c, true);
}

// Same seed, same trajectory and the same attention outputs (the trace), whether the host or
// the "device" accepts and commits.
TEST(Simulation, DeviceCommitPathMatchesTheHostPath) {
  SimulationConfig c = small_config();
  c.defrag_threshold = 1.0;  // defrags too
  const SimulationReport host = run_simulation(c);
  const SimulationReport dev = run_simulation(c, {.backend = &host_device});
  expect_consistent(c, dev);
  EXPECT_FALSE(host.device_commit);
  EXPECT_TRUE(dev.device_commit);
  EXPECT_EQ(dev.accept_mismatches, 0);
  EXPECT_EQ(dev.trace, host.trace);
  EXPECT_EQ(dev.acceptance_histogram, host.acceptance_histogram);
  EXPECT_EQ(dev.commit_row_moves, host.commit_row_moves);
  EXPECT_EQ(dev.rows_checked, host.rows_checked);
  EXPECT_EQ(dev.defrags.size(), host.defrags.size());
  EXPECT_EQ(dev.gpu.verify_ms.size(), static_cast<size_t>(c.rounds));
  EXPECT_EQ(dev.gpu.commit_ms.size(), static_cast<size_t>(c.rounds));
  EXPECT_EQ(dev.gpu.defrag_ms.size(), dev.defrags.size());
  EXPECT_FALSE(dev.frag.measured) << "the report is on by default for cuda only";
}

// A device that accepts a different (valid) path: the loop follows what the device moved, so
// every row still reads back right, but the mismatch is counted and the run fails its checks.
TEST(Simulation, DeviceAcceptanceMismatchIsCounted) {
  const SimulationConfig c = small_config();
  const SimulationReport r = run_simulation(c, {.backend = &corrupt_host_device});
  EXPECT_GT(r.accept_mismatches, 0);
  EXPECT_EQ(r.row_mismatches, 0);
  EXPECT_FALSE(r.checks_passed());
}

TEST(Simulation, FragmentationReport) {
  SimulationConfig c = small_config();
  c.frag_report = 1;
  c.frag_reps = 3;
  const SimulationReport r = run_simulation(c, {.backend = &host_device});
  expect_consistent(c, r);
  const FragmentationReport& f = r.frag;
  ASSERT_TRUE(f.measured) << f.skipped;
  EXPECT_EQ(f.batch, r.requests_live_at_end);
  EXPECT_EQ(f.q_len, tree_nodes(c));
  EXPECT_GT(f.prefix_rows, 0);
  EXPECT_DOUBLE_EQ(f.kv_bytes, double(f.prefix_rows) * kHeadDimQK * 2);
  EXPECT_TRUE(f.churned.measured && f.defragged.measured && f.contiguous.measured);
  EXPECT_EQ(f.churned.page_size, c.page_size);
  EXPECT_EQ(f.contiguous.page_size, 64);
  EXPECT_DOUBLE_EQ(f.defragged.runs_per_request, 1.0);
  EXPECT_EQ(f.final_defrag_bytes, f.final_defrag_moves * c.page_size * kHeadDimQK * 2);
  EXPECT_EQ(r.layout_mismatches, 0);
  EXPECT_EQ(f.max_diff, 0.0) << "the CPU prefix pass does not depend on the layout";

  c.device = "cpu";  // the CPU backend cannot time: reported, not an error
  const SimulationReport cpu = run_simulation(c);
  EXPECT_FALSE(cpu.frag.measured);
  EXPECT_NE(cpu.frag.skipped.find("cpu"), std::string::npos) << cpu.frag.skipped;
  EXPECT_TRUE(cpu.checks_passed());
}

}  // namespace
}  // namespace treemla::tool
