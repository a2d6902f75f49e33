// treemla simulate: the serving loop of simulation.h behind command-line options, with a header
// line, progress lines and a summary. `treemla` with no arguments runs this with the defaults.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "options.h"
#include "simulation.h"

namespace treemla::tool {

namespace {

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / (1 << 20));
  return buf;
}

SimulationConfig parse_config(const Options& opt) {
  SimulationConfig c;
  c.rounds = opt.integer("rounds", 1, 10000000);
  c.seed = static_cast<uint32_t>(opt.integer("seed", 0, 4294967295LL));
  c.device = opt.str("device");
  c.heads = static_cast<int>(opt.integer("heads", 1, kMaxHeads));
  c.budget = static_cast<int>(opt.integer("budget", 1, tree::kMaxBudget));
  c.depth = static_cast<int>(opt.integer("depth", 1, tree::kMaxBudget));
  c.top_k = static_cast<int>(opt.integer("topk", 1, 256));
  c.page_size = static_cast<int>(opt.integer("page-size", 1, 1024));
  c.num_pages = static_cast<int>(opt.integer("num-pages", 0, 1 << 24));
  c.max_requests = static_cast<int>(opt.integer("max-requests", 1, 256));
  c.prompt_min = static_cast<int>(opt.integer("prompt-min", 1, 262144));
  c.prompt_max = static_cast<int>(opt.integer("prompt-max", 1, 262144));
  c.gen_min = static_cast<int>(opt.integer("gen-min", 1, 262144));
  c.gen_max = static_cast<int>(opt.integer("gen-max", 1, 262144));
  const std::string policy = opt.str("policy");
  if (policy == "as-freed") {
    c.policy = kvpool::FreePolicy::kAsFreed;
  } else if (policy == "sorted") {
    c.policy = kvpool::FreePolicy::kSorted;
  } else {
    throw std::invalid_argument("--policy = '" + policy + "' must be as-freed or sorted");
  }
  c.defrag_threshold = opt.real("defrag-threshold", 0.0, 1e9);
  c.defrag_max_moves = opt.integer("defrag-max-moves", 0, int64_t{1} << 30);
  c.accept_prob = opt.real("accept-prob", 0.0, 1.0);
  c.check_every = static_cast<int>(opt.integer("check-every", 0, 10000000));
  c.progress_every = static_cast<int>(opt.integer("progress-every", 0, 10000000));
  validate_config(c);  // the rules that tie options together (min <= max, page size, pool size)
  return c;
}

void print_header(std::ostream& os, const SimulationConfig& c) {
  const int64_t pages = c.num_pages > 0 ? c.num_pages : default_num_pages(c);
  os << "treemla simulate: seed " << c.seed << ", device " << c.device << ", " << c.rounds << " rounds\n"
     << "  requests: up to " << c.max_requests << " live, prompts " << c.prompt_min << ".." << c.prompt_max
     << " tokens, each generates " << c.gen_min << ".." << c.gen_max << " tokens\n"
     << "  DDTree: budget " << c.budget << " (" << tree_nodes(c) << " rows per request-round), depth " << c.depth
     << ", top-k " << c.top_k << ", accept-prob " << c.accept_prob << "\n"
     << "  verify: " << c.heads << " heads, q/k " << kHeadDimQK << " v " << kHeadDimV << ", bf16 cache\n"
     << "  pool: " << pages << " pages x " << c.page_size << " rows (" << kvpool::free_policy_name(c.policy)
     << ", " << mib(pages * c.page_size * kHeadDimQK * 2.0) << " MiB); defrag when runs/request > ";
  if (c.defrag_threshold > 0) {
    os << c.defrag_threshold << (c.defrag_max_moves > 0 ? " (partial, " + std::to_string(c.defrag_max_moves) + " moves)" : " (full)");
  } else {
    os << "never (off)";
  }
  os << "\n";
}

void print_summary(std::ostream& os, const SimulationConfig& c, const SimulationReport& r) {
  char buf[512];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    os << buf;
  };
  os << "summary\n";
  line("  rounds            %lld in %.2f s wall\n", static_cast<long long>(r.rounds), r.wall_seconds);
  line("  requests          %lld admitted, %lld finished, %lld cut short (pool full), %lld live at end; "
       "admission deferred in %lld rounds\n",
       static_cast<long long>(r.requests_admitted), static_cast<long long>(r.requests_finished),
       static_cast<long long>(r.requests_cut_short), static_cast<long long>(r.requests_live_at_end),
       static_cast<long long>(r.admission_deferrals));
  line("  tokens committed  %lld in %lld request-rounds: mean acceptance length %.3f (incl. the bonus)\n",
       static_cast<long long>(r.tokens_committed), static_cast<long long>(r.request_rounds), r.mean_acceptance());
  os << "  acceptance hist  ";
  for (size_t n = 1; n < r.acceptance_histogram.size(); ++n) os << " " << n << ":" << r.acceptance_histogram[n];
  os << "\n";
  const double per_round = r.verify_calls ? r.verify_seconds / r.verify_calls : 0.0;
  line("  verify attention  %.3f s on %s in %lld calls (%.2f ms/call, %.2f GFLOP/s); split vs full: %lld checks, "
       "max |diff| %.2e\n",
       r.verify_seconds, c.device.c_str(), static_cast<long long>(r.verify_calls), per_round * 1e3,
       r.verify_seconds > 0 ? r.verify_flops / r.verify_seconds / 1e9 : 0.0, static_cast<long long>(r.cross_checks),
       r.cross_check_max_diff);
  line("  commit            %lld row moves, %lld pages released\n", static_cast<long long>(r.commit_row_moves),
       static_cast<long long>(r.commit_pages_released));
  if (r.defrags_without_moves > 0) {
    line("  defrag            %lld partial defrags found nothing to move within %lld moves\n",
         static_cast<long long>(r.defrags_without_moves), static_cast<long long>(c.defrag_max_moves));
  }
  if (r.defrags.empty()) {
    line("  defrag            none (%lld skipped: pool full)\n", static_cast<long long>(r.defrags_skipped));
  } else {
    double rb = 0, ra = 0, mb = 0, ma = 0;
    for (const DefragEvent& e : r.defrags) {
      rb += e.runs_per_request_before;
      ra += e.runs_per_request_after;
      mb += e.mean_run_before;
      ma += e.mean_run_after;
    }
    const double n = static_cast<double>(r.defrags.size());
    const DefragEvent& last = r.defrags.back();
    line("  defrag            %zu runs (%lld skipped: pool full), %lld pages relocated in %lld page copies\n",
         r.defrags.size(), static_cast<long long>(r.defrags_skipped), static_cast<long long>(r.pages_relocated),
         static_cast<long long>(r.defrag_moves));
    line("    runs/request    before mean %.2f last %.2f -> after mean %.2f last %.2f\n", rb / n,
         last.runs_per_request_before, ra / n, last.runs_per_request_after);
    line("    pages/run       before mean %.2f last %.2f -> after mean %.2f last %.2f\n", mb / n, last.mean_run_before,
         ma / n, last.mean_run_after);
  }
  const kvpool::PoolMetrics& m = r.final_metrics;
  line("  pool at end       %d used, %d free (peak %d used of %d), %.2f pages/run, %.2f runs/request\n", m.pages_used,
       m.pages_free, r.peak_pages_used, r.num_pages, m.mean_run_length, runs_per_request(m));
  line("  data checks       %lld rows read back, %lld mismatches; %lld non-finite outputs; %lld commit plan "
       "mismatches; %lld cross-check failures -> %s\n",
       static_cast<long long>(r.rows_checked), static_cast<long long>(r.row_mismatches),
       static_cast<long long>(r.nonfinite_outputs), static_cast<long long>(r.commit_plan_mismatches),
       static_cast<long long>(r.cross_check_failures), r.checks_passed() ? "ok" : "FAILED");
  line("  trace             %016llx (equal for equal seeds and options)\n", static_cast<unsigned long long>(r.trace));
}

}  // namespace

int cmd_simulate(int argc, char** argv) {
  const SimulationConfig d;
  Options opt("simulate",
              "Serving loop on the CPU over a churning paged KV pool: requests arrive with random prompts\n"
              "and leave after a random number of tokens; every round each live request drafts a DDTree\n"
              "from a synthetic drafter, appends its latent rows, runs verify attention (CPU split design,\n"
              "cross-checked against the full reference), accepts a path against a synthetic target,\n"
              "commits the accepted rows and checks them; the pool is defragmented when fragmented.\n"
              "Deterministic for a seed.");
  opt.add("rounds", std::to_string(d.rounds), "serving rounds (one verify pass per round)");
  opt.add("seed", std::to_string(d.seed), "random seed (arrivals, lengths, drafts, targets, data)");
  opt.add("device", d.device, "where attention and plan application run: cpu (cuda: not in this build yet)");
  opt.add("heads", std::to_string(d.heads), "query heads of the verify attention, 1..128");
  opt.add("budget", std::to_string(d.budget), "DDTree budget: draft nodes per tree besides the root, 1..1024");
  opt.add("depth", std::to_string(d.depth), "DDTree depth limit (drafter block size - 1)");
  opt.add("topk", std::to_string(d.top_k), "drafter candidates per depth, 1..256");
  opt.add("page-size", std::to_string(d.page_size), "rows per KV page, a power of two in 1..1024");
  opt.add("num-pages", std::to_string(d.num_pages),
          "pages in the pool; 0 = room for --max-requests requests at their largest, plus one");
  opt.add("max-requests", std::to_string(d.max_requests), "live requests at most (the batch), 1..256");
  opt.add("prompt-min", std::to_string(d.prompt_min), "shortest prompt, tokens");
  opt.add("prompt-max", std::to_string(d.prompt_max), "longest prompt, tokens");
  opt.add("gen-min", std::to_string(d.gen_min), "fewest tokens a request generates before it finishes");
  opt.add("gen-max", std::to_string(d.gen_max), "most tokens a request generates before it finishes");
  opt.add("policy", "as-freed", "free-list policy: as-freed (FIFO, as servers do) or sorted (lowest page first)");
  opt.add("defrag-threshold", num(d.defrag_threshold),
          "defragment when the live requests' pages form more than this many contiguous runs per\n"
          "      request on average (1 = every request contiguous); 0 = never");
  opt.add("defrag-max-moves", std::to_string(d.defrag_max_moves),
          "0 = full defrag; N = partial defrag of at most N page moves");
  opt.add("accept-prob", num(d.accept_prob),
          "chance, per tree node, that the synthetic target picks one of the node's drafted children");
  opt.add("check-every", std::to_string(d.check_every),
          "every N rounds cross-check split vs full attention and re-read all live rows; 0 = never");
  opt.add("progress-every", std::to_string(d.progress_every), "print a progress line every N rounds; 0 = never");
  bool ok = true;
  if (!opt.parse(argc, argv, 2, ok)) return ok ? 0 : 2;
  const SimulationConfig c = parse_config(opt);

  print_header(std::cout, c);
  std::cout << std::flush;
  const SimulationReport r = run_simulation(c, &std::cout);
  print_summary(std::cout, c, r);
  if (!r.checks_passed()) {
    std::cerr << "treemla simulate: data checks FAILED (see the summary)\n";
    return 1;
  }
  return 0;
}

}  // namespace treemla::tool
