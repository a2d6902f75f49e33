// treemla simulate: the serving loop of simulation.h behind command-line options, with a header
// line, progress lines and a summary (and with --device cuda GPU times and the fragmentation
// report; --json writes the numbers). `treemla` with no arguments runs this with the defaults.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "simulation.h"
#ifdef TREEMLA_WITH_CUDA
#include "simulation_cuda.h"
#endif

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
  c.check_max_context = static_cast<int>(opt.integer("check-max-context", 0, kMaxPrefixLen));
  c.progress_every = static_cast<int>(opt.integer("progress-every", 0, 10000000));
  const std::string frag = opt.str("frag-report");
  if (frag == "auto") {
    c.frag_report = -1;
  } else if (frag == "on" || frag == "1") {
    c.frag_report = 1;
  } else if (frag == "off" || frag == "0") {
    c.frag_report = 0;
  } else {
    throw std::invalid_argument("--frag-report = '" + frag + "' must be auto, on or off");
  }
  c.frag_reps = static_cast<int>(opt.integer("frag-reps", 1, 1000));
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
  if (c.device == "cuda") {
    os << "  cuda: acceptance + commit on the device (checked against the host every round); GPU vs CPU "
          "reference every "
       << c.check_every << " rounds while every prefix <= ";
    if (c.check_max_context > 0) {
      os << c.check_max_context << " tokens";
    } else {
      os << "any length";
    }
    os << "; fragmentation report " << (c.frag_report != 0 ? "at the end" : "off") << "\n";
  }
}

struct Stats {
  size_t n = 0;
  double mean = 0, median = 0, total = 0;
};
Stats stats(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  for (double x : v) s.total += x;
  s.mean = s.total / s.n;
  std::sort(v.begin(), v.end());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

// GPU times per call and the fragmentation table (device backends only).
void print_gpu(std::ostream& os, const SimulationConfig& c, const SimulationReport& r) {
  char buf[512];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    os << buf;
  };
  const Stats v = stats(r.gpu.verify_ms), k = stats(r.gpu.commit_ms), d = stats(r.gpu.defrag_ms);
  if (v.n > 0) {
    line("  gpu verify        %zu rounds: mean %.3f ms, median %.3f ms, total %.2f ms (kernels only, CUDA "
         "events); %.1f TFLOP/s\n",
         v.n, v.mean, v.median, v.total, v.total > 0 ? r.gpu.verify_flops / (v.total * 1e-3) / 1e12 : 0.0);
  }
  if (r.device_commit) {
    line("  gpu commit        %zu rounds (acceptance + commit): mean %.3f ms, median %.3f ms, total %.2f ms; "
         "%lld acceptance mismatches vs the host\n",
         k.n, k.mean, k.median, k.total, static_cast<long long>(r.accept_mismatches));
  }
  if (d.n > 0) {
    line("  gpu defrag        %zu runs: mean %.3f ms, median %.3f ms, total %.2f ms; %s MiB copied (%.1f GB/s "
         "read + write)\n",
         d.n, d.mean, d.median, d.total, mib(double(r.gpu.defrag_bytes)).c_str(),
         d.total > 0 ? 2.0 * r.gpu.defrag_bytes / (d.total * 1e-3) / 1e9 : 0.0);
  }
  const FragmentationReport& f = r.frag;
  if (!f.measured) {
    if (!f.skipped.empty()) os << "fragmentation effect: not measured (" << f.skipped << ")\n";
    return;
  }
  line("fragmentation effect: prefix pass alone (VerifyPart::kPrefix), %d requests x %d query rows x %d heads "
       "over %lld prefix rows (%s MiB of KV), median of %d runs\n",
       f.batch, f.q_len, f.heads, static_cast<long long>(f.prefix_rows), mib(f.kv_bytes).c_str(), f.reps);
  line("  %-30s %5s %9s %10s %10s %10s %8s %8s %9s\n", "layout", "page", "runs/req", "pages/run", "median ms",
       "min ms", "TFLOP/s", "KV GB/s", "vs fresh");
  const double ref = f.contiguous.measured ? f.contiguous.median_ms : 0.0;
  auto row = [&](const char* name, const FragLayout& l) {
    if (!l.measured) {
      line("  %-30s not measured (a full pool cannot be defragmented)\n", name);
      return;
    }
    const double s = l.median_ms * 1e-3;
    line("  %-30s %5d %9.2f %10.1f %10.3f %10.3f %8.1f %8.0f %+8.1f%%\n", name, l.page_size, l.runs_per_request,
         l.pages_per_run, l.median_ms, l.min_ms, s > 0 ? f.flops / s / 1e12 : 0.0, s > 0 ? f.kv_bytes / s / 1e9 : 0.0,
         ref > 0 ? 100.0 * (l.median_ms / ref - 1.0) : 0.0);
  };
  row("(a) churned (as the run left it)", f.churned);
  row("(b) after a full defrag", f.defragged);
  row("(c) fresh cache, contiguous", f.contiguous);
  if (f.defragged.measured) {
    line("  the full defrag: %lld page moves, %s MiB in %.3f ms\n", static_cast<long long>(f.final_defrag_moves),
         mib(double(f.final_defrag_bytes)).c_str(), f.final_defrag_ms);
  }
  line("  outputs across layouts: max |diff| %.2e -> %s\n", f.max_diff, r.layout_mismatches ? "DIFFER" : "agree");
  if (c.defrag_threshold > 0 && f.churned.runs_per_request <= c.defrag_threshold) {
    line("  note: the run's own defrags (--defrag-threshold %g) left (a) nearly contiguous; "
         "--defrag-threshold 0 keeps the churn\n",
         c.defrag_threshold);
  }
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
  line("  verify attention  %.3f s on %s in %lld calls (%.2f ms/call, %.2f GFLOP/s); %s: %lld checks, "
       "max |diff| %.2e\n",
       r.verify_seconds, c.device.c_str(), static_cast<long long>(r.verify_calls), per_round * 1e3,
       r.verify_seconds > 0 ? r.verify_flops / r.verify_seconds / 1e9 : 0.0,
       c.device == "cuda" ? "gpu vs cpu reference" : "split vs full", static_cast<long long>(r.cross_checks),
       r.cross_check_max_diff);
  if (r.cross_checks_skipped > 0) {
    line("                    %lld due cross-checks skipped: a prefix was longer than --check-max-context %d\n",
         static_cast<long long>(r.cross_checks_skipped), c.check_max_context);
  }
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
  if (r.device_commit || r.frag.measured) {
    line("  data checks       %lld rows read back, %lld mismatches; %lld non-finite outputs; %lld commit plan "
         "mismatches; %lld cross-check failures; %lld acceptance mismatches; %lld layout mismatches -> %s\n",
         static_cast<long long>(r.rows_checked), static_cast<long long>(r.row_mismatches),
         static_cast<long long>(r.nonfinite_outputs), static_cast<long long>(r.commit_plan_mismatches),
         static_cast<long long>(r.cross_check_failures), static_cast<long long>(r.accept_mismatches),
         static_cast<long long>(r.layout_mismatches), r.checks_passed() ? "ok" : "FAILED");
  } else {
    line("  data checks       %lld rows read back, %lld mismatches; %lld non-finite outputs; %lld commit plan "
         "mismatches; %lld cross-check failures -> %s\n",
         static_cast<long long>(r.rows_checked), static_cast<long long>(r.row_mismatches),
         static_cast<long long>(r.nonfinite_outputs), static_cast<long long>(r.commit_plan_mismatches),
         static_cast<long long>(r.cross_check_failures), r.checks_passed() ? "ok" : "FAILED");
  }
  line("  trace             %016llx (equal for equal seeds and options)\n", static_cast<unsigned long long>(r.trace));
  if (!r.gpu.verify_ms.empty() || r.frag.measured || !r.frag.skipped.empty()) print_gpu(os, c, r);
}

// JSON numbers: non-finite values (never expected) become null rather than invalid JSON.
std::string jnum(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string jlist(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + jnum(v[i]);
  return s + "]";
}

std::string jstats(const std::vector<double>& v) {
  const Stats s = stats(v);
  return "{\"count\": " + std::to_string(s.n) + ", \"mean\": " + jnum(s.mean) + ", \"median\": " + jnum(s.median) +
         ", \"total\": " + jnum(s.total) + ", \"per_call\": " + jlist(v) + "}";
}

std::string jlayout(const FragLayout& l, const FragmentationReport& f) {
  if (!l.measured) return "null";
  const double s = l.median_ms * 1e-3;
  return "{\"page_size\": " + std::to_string(l.page_size) + ", \"runs_per_request\": " + jnum(l.runs_per_request) +
         ", \"pages_per_run\": " + jnum(l.pages_per_run) + ", \"median_ms\": " + jnum(l.median_ms) +
         ", \"min_ms\": " + jnum(l.min_ms) + ", \"tflops\": " + jnum(s > 0 ? f.flops / s / 1e12 : 0.0) +
         ", \"kv_gbps\": " + jnum(s > 0 ? f.kv_bytes / s / 1e9 : 0.0) + "}";
}

void write_json(std::ostream& f, const SimulationConfig& c, const SimulationReport& r) {
  char trace[32];
  std::snprintf(trace, sizeof trace, "%016llx", static_cast<unsigned long long>(r.trace));
  f << "{\n  \"config\": {\"device\": \"" << c.device << "\", \"seed\": " << c.seed << ", \"rounds\": " << c.rounds
    << ", \"heads\": " << c.heads << ", \"budget\": " << c.budget << ", \"depth\": " << c.depth
    << ", \"top_k\": " << c.top_k << ", \"page_size\": " << c.page_size << ", \"num_pages\": " << r.num_pages
    << ", \"max_requests\": " << c.max_requests << ", \"prompt_min\": " << c.prompt_min
    << ", \"prompt_max\": " << c.prompt_max << ", \"gen_min\": " << c.gen_min << ", \"gen_max\": " << c.gen_max
    << ", \"policy\": \"" << kvpool::free_policy_name(c.policy) << "\", \"defrag_threshold\": "
    << jnum(c.defrag_threshold) << ", \"defrag_max_moves\": " << c.defrag_max_moves
    << ", \"accept_prob\": " << jnum(c.accept_prob) << ", \"check_every\": " << c.check_every
    << ", \"check_max_context\": " << c.check_max_context << "},\n";
  f << "  \"wall_seconds\": " << jnum(r.wall_seconds) << ",\n  \"tree_nodes\": " << r.tree_nodes
    << ",\n  \"requests\": {\"admitted\": " << r.requests_admitted << ", \"finished\": " << r.requests_finished
    << ", \"cut_short\": " << r.requests_cut_short << ", \"live_at_end\": " << r.requests_live_at_end
    << ", \"admission_deferrals\": " << r.admission_deferrals << "},\n  \"tokens_committed\": " << r.tokens_committed
    << ",\n  \"request_rounds\": " << r.request_rounds << ",\n  \"mean_acceptance\": " << jnum(r.mean_acceptance())
    << ",\n  \"verify\": {\"calls\": " << r.verify_calls << ", \"wall_seconds\": " << jnum(r.verify_seconds)
    << ", \"flops\": " << jnum(r.verify_flops) << "},\n  \"defrags\": {\"runs\": " << r.defrags.size()
    << ", \"skipped\": " << r.defrags_skipped << ", \"pages_relocated\": " << r.pages_relocated
    << ", \"page_moves\": " << r.defrag_moves << "},\n  \"checks\": {\"passed\": " << (r.checks_passed() ? "true" : "false")
    << ", \"rows_checked\": " << r.rows_checked << ", \"row_mismatches\": " << r.row_mismatches
    << ", \"nonfinite_outputs\": " << r.nonfinite_outputs << ", \"commit_plan_mismatches\": " << r.commit_plan_mismatches
    << ", \"cross_checks\": " << r.cross_checks << ", \"cross_checks_skipped\": " << r.cross_checks_skipped
    << ", \"cross_check_failures\": " << r.cross_check_failures << ", \"cross_check_max_diff\": "
    << jnum(r.cross_check_max_diff) << ", \"accept_mismatches\": " << r.accept_mismatches
    << ", \"layout_mismatches\": " << r.layout_mismatches << "},\n  \"trace\": \"" << trace << "\",\n";
  if (r.gpu.verify_ms.empty()) {
    f << "  \"gpu\": null,\n";
  } else {
    const double vt = stats(r.gpu.verify_ms).total;
    const double dt = stats(r.gpu.defrag_ms).total;
    f << "  \"gpu\": {\n    \"verify_ms\": " << jstats(r.gpu.verify_ms) << ",\n    \"verify_tflops\": "
      << jnum(vt > 0 ? r.gpu.verify_flops / (vt * 1e-3) / 1e12 : 0.0) << ",\n    \"device_commit\": "
      << (r.device_commit ? "true" : "false") << ",\n    \"commit_ms\": " << jstats(r.gpu.commit_ms)
      << ",\n    \"defrag_ms\": " << jstats(r.gpu.defrag_ms) << ",\n    \"defrag_bytes\": " << r.gpu.defrag_bytes
      << ",\n    \"defrag_gbps_read_plus_write\": " << jnum(dt > 0 ? 2.0 * r.gpu.defrag_bytes / (dt * 1e-3) / 1e9 : 0.0)
      << "\n  },\n";
  }
  const FragmentationReport& g = r.frag;
  if (!g.measured) {
    f << "  \"fragmentation\": null\n}\n";
    return;
  }
  f << "  \"fragmentation\": {\"part\": \"prefix\", \"batch\": " << g.batch << ", \"q_len\": " << g.q_len
    << ", \"heads\": " << g.heads << ", \"reps\": " << g.reps << ", \"prefix_rows\": " << g.prefix_rows
    << ", \"kv_bytes\": " << jnum(g.kv_bytes) << ", \"flops\": " << jnum(g.flops)
    << ",\n    \"churned\": " << jlayout(g.churned, g) << ",\n    \"defragged\": " << jlayout(g.defragged, g)
    << ",\n    \"contiguous_page64\": " << jlayout(g.contiguous, g) << ",\n    \"final_defrag\": {\"page_moves\": "
    << g.final_defrag_moves << ", \"bytes\": " << g.final_defrag_bytes << ", \"ms\": " << jnum(g.final_defrag_ms)
    << "},\n    \"max_diff\": " << jnum(g.max_diff) << "}\n}\n";
}

}  // namespace

int cmd_simulate(int argc, char** argv) {
  const SimulationConfig d;
  Options opt("simulate",
              "Serving loop over a churning paged KV pool: requests arrive with random prompts and leave\n"
              "after a random number of tokens; every round each live request drafts a DDTree from a\n"
              "synthetic drafter, appends its latent rows, runs verify attention (CPU split design,\n"
              "cross-checked against the full reference), accepts a path against a synthetic target,\n"
              "commits the accepted rows and checks them; the pool is defragmented when fragmented.\n"
              "Deterministic for a seed.\n\n"
              "--device cuda (a CUDA build with a GPU) keeps the cache on the GPU: verify attention,\n"
              "acceptance + commit, defrag moves run there, timed with CUDA events; at the end the prefix\n"
              "pass is timed on the churned pool, after a full defrag and in a fresh contiguous cache.\n"
              "GLM-5 shapes at long context:\n"
              "  treemla simulate --device cuda --heads 8 --budget 64 --depth 15 --page-size 1 \\\n"
              "      --prompt-min 32768 --prompt-max 131072 --max-requests 4 --rounds 40");
  opt.add("rounds", std::to_string(d.rounds), "serving rounds (one verify pass per round)");
  opt.add("seed", std::to_string(d.seed), "random seed (arrivals, lengths, drafts, targets, data)");
  opt.add("device", d.device,
          "where the cache lives and attention, commit and defrag run: cpu, or cuda (a CUDA build and a GPU)");
  opt.add("heads", std::to_string(d.heads), "query heads of the verify attention, 1..128");
  opt.add("budget", std::to_string(d.budget), "DDTree budget: draft nodes per tree besides the root, 1..1024");
  opt.add("depth", std::to_string(d.depth), "DDTree depth limit (drafter block size - 1)");
  opt.add("topk", std::to_string(d.top_k), "drafter candidates per depth, 1..256");
  opt.add("page-size", std::to_string(d.page_size), "rows per KV page, a power of two in 1..1024");
  opt.add("num-pages", std::to_string(d.num_pages),
          "pages in the pool; 0 = room for --max-requests requests at their largest, plus one");
  opt.add("max-requests", std::to_string(d.max_requests), "live requests at most (the batch), 1..256");
  opt.add("prompt-min", std::to_string(d.prompt_min), "shortest prompt, tokens (up to 262144)");
  opt.add("prompt-max", std::to_string(d.prompt_max), "longest prompt, tokens (up to 262144)");
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
  opt.add("check-max-context", std::to_string(d.check_max_context),
          "cross-check only rounds where every prefix is at most N tokens (the double-precision\n"
          "      reference takes minutes at 128k); 0 = no limit");
  opt.add("progress-every", std::to_string(d.progress_every), "print a progress line every N rounds; 0 = never");
  opt.add("frag-report", "auto",
          "time the prefix pass at the end on the churned pool, after a full defrag and in a fresh\n"
          "      page-size-64 cache: auto (= on with --device cuda), on, off");
  opt.add("frag-reps", std::to_string(d.frag_reps), "timed runs per layout in the fragmentation report (median)");
  opt.add("json", "", "also write the run's numbers (GPU times, fragmentation table) as JSON to this file");
  bool ok = true;
  if (!opt.parse(argc, argv, 2, ok)) return ok ? 0 : 2;
  const SimulationConfig c = parse_config(opt);
  require_device(c.device);  // before any output: no GPU is an error (exit 1), not a bad option
  const std::string json = opt.str("json");
  std::ofstream json_file;
  if (!json.empty()) {  // before the run, which may take minutes
    json_file.open(json);
    if (!json_file) throw std::invalid_argument("--json = '" + json + "' cannot be opened for writing");
  }
#ifdef TREEMLA_WITH_CUDA
  install_cuda_backend();
#endif

  print_header(std::cout, c);
  std::cout << std::flush;
  const SimulationReport r = run_simulation(c, &std::cout);
  print_summary(std::cout, c, r);
  if (json_file.is_open()) {
    write_json(json_file, c, r);
    json_file.close();
    if (!json_file) {
      std::cerr << "treemla simulate: writing " << json << " failed\n";
      return 1;
    }
  }
  if (!r.checks_passed()) {
    std::cerr << "treemla simulate: data checks FAILED (see the summary)\n";
    return 1;
  }
  return 0;
}

}  // namespace treemla::tool
