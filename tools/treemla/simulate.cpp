// treemla simulate: the serving loop of treemla_sim (sim/simulation.h) behind command-line
// options, with a header, progress lines and a summary (and with --device cuda GPU times and the
// fragmentation report; --json writes the numbers). `treemla` with no command runs this.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "sim/simulation.h"
#include "simulate_budget.h"

namespace treemla::tool {

namespace {

std::string mib(double bytes) { return fmt::format("{:.2f}", bytes / (1 << 20)); }

// What the command line says: the config, plus the options that are not part of it.
struct SimulateArgs {
  SimulationConfig config;
  std::string policy = "as-freed", frag_report = "auto", json;
  BudgetArgs budget;            // --budget, the cost model, --budget-compare
  BudgetCompareConfig compare;  // with --budget-compare
};

void add_options(CLI::App& app, SimulateArgs& a) {
  SimulationConfig& c = a.config;
  auto integer = [&](const char* name, auto& value, IntRange r, const char* help) {
    cli::add_integer(app, name, value, r.lo, r.hi, help);
  };
  integer("--rounds", c.rounds, limits::kRounds, "serving rounds (one verify pass per round)");
  integer("--seed", c.seed, limits::kSeed,
          "random seed (arrivals, lengths, drafts, targets, data)");
  cli::add_choice(app, "--device", c.device, {"cpu", "cuda"},
                  "where the cache lives and attention, commit and defrag run: cpu, or cuda (a "
                  "CUDA build and a GPU)");
  integer("--heads", c.heads, limits::kHeads, "query heads of the verify attention");
  integer("--depth", c.depth, limits::kDepth, "DDTree depth limit (drafter block size - 1)");
  integer("--topk", c.top_k, limits::kTopK, "drafter candidates per depth");
  app.add_option("--page-size", c.page_size, "rows per KV page")
      ->check(cli::power_of_two_in(limits::kPageSize.lo, limits::kPageSize.hi))
      ->capture_default_str();
  integer("--num-pages", c.num_pages, limits::kNumPages,
          "pages in the pool; 0 = room for --max-requests requests at their largest, plus one");
  integer("--max-requests", c.max_requests, limits::kMaxRequests,
          "live requests at most (the batch)");
  integer("--prompt-min", c.prompt_min, limits::kPromptLen, "shortest prompt, tokens");
  integer("--prompt-max", c.prompt_max, limits::kPromptLen, "longest prompt, tokens");
  integer("--gen-min", c.gen_min, limits::kGenLen,
          "fewest tokens a request generates before it finishes");
  integer("--gen-max", c.gen_max, limits::kGenLen,
          "most tokens a request generates before it finishes");
  cli::add_choice(app, "--policy", a.policy, {"as-freed", "sorted"},
                  "free-list policy: as-freed (FIFO, as servers do) or sorted (lowest page first)");
  cli::add_number(
      app, "--defrag-threshold", c.defrag_threshold, 0.0, 1e9,
      "defragment when the live requests' pages form more than this many contiguous runs per "
      "request on average (1 = every request contiguous); 0 = never");
  integer("--defrag-max-moves", c.defrag_max_moves, limits::kDefragMaxMoves,
          "0 = full defrag; N = partial defrag of at most N page moves");
  cli::add_number(
      app, "--accept-prob", c.accept_prob, 0.0, 1.0,
      "chance, per tree node, that the synthetic target picks one of the node's drafted children");
  integer(
      "--check-every", c.check_every, limits::kCheckEvery,
      "every N rounds cross-check split vs full attention and re-read all live rows; 0 = never");
  integer("--check-max-context", c.check_max_context, limits::kCheckMaxContext,
          "cross-check only rounds where every prefix is at most N tokens (the double-precision "
          "reference "
          "takes minutes at 128k); 0 = no limit");
  integer("--progress-every", c.progress_every, limits::kProgressEvery,
          "print a progress line every N rounds; 0 = never");
  cli::add_choice(
      app, "--frag-report", a.frag_report, {"auto", "on", "off", "1", "0"},
      "time the prefix pass at the end on the churned pool, after a full defrag and in a fresh "
      "page-size-64 cache: auto (= on with --device cuda), on, off");
  integer("--frag-reps", c.frag_reps, limits::kFragReps,
          "timed runs per layout in the fragmentation report (median)");
  app.add_option(
      "--json", a.json,
      "also write the run's numbers (GPU times, fragmentation table) as JSON to this file");
  add_budget_options(app, a.budget, c);
}

// The rules that tie options together (min <= max, page size, pool size, the cost table); throws
// std::invalid_argument naming the option.
void finish_config(const CLI::App& app, SimulateArgs& a) {
  SimulationConfig& c = a.config;
  finish_budget_options(app, a.budget, c, a.compare);
  c.policy = a.policy == "sorted" ? kvpool::FreePolicy::kSorted : kvpool::FreePolicy::kAsFreed;
  c.frag_report = a.frag_report == "auto"                           ? -1
                  : (a.frag_report == "on" || a.frag_report == "1") ? 1
                                                                    : 0;
  if (!a.budget.compare) validate_config(c);
}

void print_header(std::ostream& os, const SimulationConfig& c, const BudgetArgs& b) {
  const int64_t pages = c.num_pages > 0 ? c.num_pages : default_num_pages(c);
  os << "treemla simulate: seed " << c.seed << ", device " << c.device << ", " << c.rounds
     << " rounds\n"
     << "  requests: up to " << c.max_requests << " live, prompts " << c.prompt_min << ".."
     << c.prompt_max << " tokens, each generates " << c.gen_min << ".." << c.gen_max << " tokens\n"
     << "  DDTree: budget "
     << (c.budget_auto ? fmt::format("auto (up to {} rows per request-round)", tree_nodes(c))
                       : fmt::format("{} ({} rows per request-round)", c.budget, tree_nodes(c)))
     << ", depth " << c.depth << ", top-k " << c.top_k << ", target " << c.target;
  if (c.target == "children") os << ", accept-prob " << c.accept_prob;
  if (c.draft_logit_range != SimulationConfig{}.draft_logit_range)
    os << ", drafter logits in [0, " << c.draft_logit_range << "]";
  os << "\n"
     << "  verify: " << c.heads << " heads, q/k " << kHeadDimQK << " v " << kHeadDimV
     << ", bf16 cache\n"
     << "  pool: " << pages << " pages x " << c.page_size << " rows ("
     << kvpool::free_policy_name(c.policy) << ", " << mib(pages * c.page_size * kHeadDimQK * 2.0)
     << " MiB); ";
  if (c.defrag_threshold > 0) {
    os << "defrag when runs/request > " << c.defrag_threshold
       << (c.defrag_max_moves > 0 ? " (partial, " + std::to_string(c.defrag_max_moves) + " moves)"
                                  : " (full)");
  } else {
    os << "defrag off (--defrag-threshold 0)";
  }
  os << "\n";
  if (c.device == "cuda") {
    os << "  cuda: acceptance + commit on the device (checked against the host every round); GPU "
          "vs CPU "
          "reference every "
       << c.check_every << " rounds while every prefix <= ";
    if (c.check_max_context > 0) {
      os << c.check_max_context << " tokens";
    } else {
      os << "any length";
    }
    os << "; fragmentation report " << (c.frag_report != 0 ? "at the end" : "off") << "\n";
  }
  print_cost_header(os, b, c);
}

// "length:count" for every non-zero count; with more than 16 of them, counts of equal ranges
// of lengths instead ("lo-hi:count").
std::string compact_histogram(const std::vector<int64_t>& h) {
  constexpr size_t kMaxItems = 16;
  size_t first = h.size(), last = 0, nonzero = 0;
  for (size_t n = 0; n < h.size(); ++n) {
    if (h[n] == 0) continue;
    first = std::min(first, n);
    last = n;
    ++nonzero;
  }
  if (nonzero == 0) return "none";
  const size_t width = nonzero <= kMaxItems ? 1 : (last - first + kMaxItems) / kMaxItems;
  std::string out;
  for (size_t lo = first; lo <= last; lo += width) {
    const size_t hi = std::min(last, lo + width - 1);
    int64_t count = 0;
    for (size_t n = lo; n <= hi; ++n) count += h[n];
    if (count == 0) continue;
    if (!out.empty()) out += ' ';
    out += hi == lo ? fmt::format("{}:{}", lo, count) : fmt::format("{}-{}:{}", lo, hi, count);
  }
  return out;
}

// A live progress line on stderr, redrawn in place at most five times a second with the rate
// and the time left; only when stderr is a terminal, and only once the run has taken half a
// second. Erased before a progress line or the summary is printed.
class StatusLine {
 public:
  explicit StatusLine(bool enabled) : enabled_(enabled), start_(Clock::now()) {}
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;
  ~StatusLine() { clear(); }

  void update(const RunProgress& p) {
    if (!enabled_) return;
    if (p.line_follows) {
      clear();
      return;
    }
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < 0.5 || (drawn_ && std::chrono::duration<double>(now - last_).count() < 0.2))
      return;
    last_ = now;
    const double done =
        std::clamp((double(p.round - 1) + p.round_fraction) / double(p.rounds), 0.0, 1.0);
    std::string line = fmt::format("[{:3.0f}%] round {}/{}", 100 * done, p.round, p.rounds);
    line += fmt::format(" {:.0f}%", 100 * p.round_fraction);
    if (*p.activity) line += fmt::format(" ({})", p.activity);
    if (done > 0) {
      const double rate = done * double(p.rounds) / elapsed;  // rounds per second
      line += rate >= 1 ? fmt::format(" | {:.1f} rounds/s", rate)
                        : fmt::format(" | {:.1f} s/round", 1 / rate);
      line += " | ETA " + duration(elapsed * (1 - done) / done);
    }
    fmt::print(stderr, "\r{}\033[K", line);
    std::fflush(stderr);
    drawn_ = true;
  }

  void clear() {
    if (!drawn_) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static std::string duration(double s) {
    const auto t = static_cast<int64_t>(std::ceil(s));
    if (t < 60) return fmt::format("{}s", t);
    if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
    return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
  }

  bool enabled_ = false, drawn_ = false;
  Clock::time_point start_, last_;
};

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
  const Stats v = stats(r.gpu.verify_ms), k = stats(r.gpu.commit_ms), d = stats(r.gpu.defrag_ms);
  if (v.n > 0) {
    fmt::print(os,
               "  gpu verify        {} rounds: mean {:.3f} ms, median {:.3f} ms, total {:.2f} ms "
               "(kernels only, "
               "CUDA events); {:.1f} TFLOP/s\n",
               v.n, v.mean, v.median, v.total,
               v.total > 0 ? r.gpu.verify_flops / (v.total * 1e-3) / 1e12 : 0.0);
  }
  if (r.device_commit) {
    fmt::print(os,
               "  gpu commit        {} rounds (acceptance + commit): mean {:.3f} ms, median {:.3f} "
               "ms, total {:.2f} "
               "ms; {} acceptance mismatches vs the host\n",
               k.n, k.mean, k.median, k.total, r.accept_mismatches);
  }
  if (d.n > 0) {
    fmt::print(os,
               "  gpu defrag        {} runs: mean {:.3f} ms, median {:.3f} ms, total {:.2f} ms; {} "
               "MiB copied "
               "({:.1f} GB/s read + write)\n",
               d.n, d.mean, d.median, d.total, mib(double(r.gpu.defrag_bytes)),
               d.total > 0 ? 2.0 * r.gpu.defrag_bytes / (d.total * 1e-3) / 1e9 : 0.0);
  }
  const FragmentationReport& f = r.frag;
  if (!f.measured) {
    if (!f.skipped.empty()) fmt::print(os, "fragmentation effect: not measured ({})\n", f.skipped);
    return;
  }
  fmt::print(os,
             "fragmentation effect: prefix pass alone (VerifyPart::kPrefix), {} requests x {} "
             "query rows x {} heads "
             "over {} prefix rows ({} MiB of KV), median of {} runs\n",
             f.batch, f.q_len, f.heads, f.prefix_rows, mib(f.kv_bytes), f.reps);
  fmt::print(os, "  {:<30} {:>5} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}\n", "layout", "page",
             "runs/req", "pages/run", "median ms", "min ms", "TFLOP/s", "KV GB/s", "vs fresh");
  const double ref = f.contiguous.measured ? f.contiguous.median_ms : 0.0;
  auto row = [&](const char* name, const FragLayout& l) {
    if (!l.measured) {
      fmt::print(os, "  {:<30} not measured (a full pool cannot be defragmented)\n", name);
      return;
    }
    const double s = l.median_ms * 1e-3;
    fmt::print(
        os, "  {:<30} {:>5} {:>9.2f} {:>10.1f} {:>10.3f} {:>10.3f} {:>8.1f} {:>8.0f} {:>+8.1f}%\n",
        name, l.page_size, l.runs_per_request, l.pages_per_run, l.median_ms, l.min_ms,
        s > 0 ? f.flops / s / 1e12 : 0.0, s > 0 ? f.kv_bytes / s / 1e9 : 0.0,
        ref > 0 ? 100.0 * (l.median_ms / ref - 1.0) : 0.0);
  };
  row("(a) churned (as the run left it)", f.churned);
  row("(b) after a full defrag", f.defragged);
  row("(c) fresh cache, contiguous", f.contiguous);
  if (f.defragged.measured) {
    fmt::print(os, "  the full defrag: {} page moves, {} MiB in {:.3f} ms\n", f.final_defrag_moves,
               mib(double(f.final_defrag_bytes)), f.final_defrag_ms);
  }
  fmt::print(os, "  outputs across layouts: max |diff| {:.2e} -> {}\n", f.max_diff,
             r.layout_mismatches ? "DIFFER" : "agree");
  if (c.defrag_threshold > 0 && f.churned.runs_per_request <= c.defrag_threshold) {
    fmt::print(
        os,
        "  note: the run's own defrags (--defrag-threshold {:g}) left (a) nearly contiguous; "
        "--defrag-threshold 0 keeps the churn\n",
        c.defrag_threshold);
  }
}

void print_summary(std::ostream& os, const SimulationConfig& c, const SimulationReport& r) {
  os << "summary\n";
  fmt::print(os, "  rounds            {} in {:.2f} s wall\n", r.rounds, r.wall_seconds);
  fmt::print(
      os,
      "  requests          {} admitted, {} finished, {} cut short (pool full), {} live at end; "
      "admission deferred in {} rounds\n",
      r.requests_admitted, r.requests_finished, r.requests_cut_short, r.requests_live_at_end,
      r.admission_deferrals);
  fmt::print(os,
             "  tokens committed  {} in {} request-rounds: mean acceptance length {:.3f} (incl. "
             "the bonus)\n",
             r.tokens_committed, r.request_rounds, r.mean_acceptance());
  fmt::print(os, "  acceptance hist   {} (length:request-rounds, zeros left out)\n",
             compact_histogram(r.acceptance_histogram));
  print_cost_summary(os, c, r);
  const double per_call = r.verify_calls ? r.verify_seconds / r.verify_calls : 0.0;
  fmt::print(os,
             "  verify attention  {:.3f} s on {} in {} calls ({:.2f} ms/call, {:.2f} GFLOP/s); {}: "
             "{} checks, "
             "max |diff| {:.2e}\n",
             r.verify_seconds, c.device, r.verify_calls, per_call * 1e3,
             r.verify_seconds > 0 ? r.verify_flops / r.verify_seconds / 1e9 : 0.0,
             c.device == "cuda" ? "gpu vs cpu reference" : "split vs full", r.cross_checks,
             r.cross_check_max_diff);
  if (r.cross_checks_skipped > 0) {
    fmt::print(os,
               "                    {} due cross-checks skipped: a prefix was longer than "
               "--check-max-context {}\n",
               r.cross_checks_skipped, c.check_max_context);
  }
  fmt::print(os, "  commit            {} row moves, {} pages released\n", r.commit_row_moves,
             r.commit_pages_released);
  if (r.defrags_without_moves > 0) {
    fmt::print(os, "  defrag            {} partial defrags found nothing to move within {} moves\n",
               r.defrags_without_moves, c.defrag_max_moves);
  }
  if (r.defrags.empty()) {
    fmt::print(os, "  defrag            none ({} skipped: pool full)\n", r.defrags_skipped);
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
    fmt::print(os,
               "  defrag            {} runs ({} skipped: pool full), {} pages relocated in {} page "
               "copies\n",
               r.defrags.size(), r.defrags_skipped, r.pages_relocated, r.defrag_moves);
    fmt::print(
        os, "    runs/request    before mean {:.2f} last {:.2f} -> after mean {:.2f} last {:.2f}\n",
        rb / n, last.runs_per_request_before, ra / n, last.runs_per_request_after);
    fmt::print(
        os, "    pages/run       before mean {:.2f} last {:.2f} -> after mean {:.2f} last {:.2f}\n",
        mb / n, last.mean_run_before, ma / n, last.mean_run_after);
  }
  const kvpool::PoolMetrics& m = r.final_metrics;
  fmt::print(os,
             "  pool at end       {} used, {} free (peak {} used of {}), {:.2f} pages/run, {:.2f} "
             "runs/request\n",
             m.pages_used, m.pages_free, r.peak_pages_used, r.num_pages, m.mean_run_length,
             runs_per_request(m));
  fmt::print(
      os,
      "  data checks       {} rows read back, {} mismatches; {} non-finite outputs; {} commit plan "
      "mismatches; {} cross-check failures",
      r.rows_checked, r.row_mismatches, r.nonfinite_outputs, r.commit_plan_mismatches,
      r.cross_check_failures);
  if (r.device_commit || r.frag.measured) {
    fmt::print(os, "; {} acceptance mismatches; {} layout mismatches", r.accept_mismatches,
               r.layout_mismatches);
  }
  fmt::print(os, " -> {}\n", r.checks_passed() ? "ok" : "FAILED");
  fmt::print(os, "  trace             {:016x} (equal for equal seeds and options)\n", r.trace);
  if (!r.gpu.verify_ms.empty() || r.frag.measured || !r.frag.skipped.empty()) print_gpu(os, c, r);
}

nlohmann::ordered_json json_stats(const std::vector<double>& v) {
  const Stats s = stats(v);
  return {
      {"count", s.n}, {"mean", s.mean}, {"median", s.median}, {"total", s.total}, {"per_call", v}};
}

nlohmann::ordered_json json_layout(const FragLayout& l, const FragmentationReport& f) {
  if (!l.measured) return nullptr;
  const double s = l.median_ms * 1e-3;
  return {{"page_size", l.page_size},
          {"runs_per_request", l.runs_per_request},
          {"pages_per_run", l.pages_per_run},
          {"median_ms", l.median_ms},
          {"min_ms", l.min_ms},
          {"tflops", s > 0 ? f.flops / s / 1e12 : 0.0},
          {"kv_gbps", s > 0 ? f.kv_bytes / s / 1e9 : 0.0}};
}

// The run's numbers (docs/tool.md lists the keys). Non-finite numbers (never expected) become
// null, as nlohmann::json writes them.
nlohmann::ordered_json to_json(const SimulationConfig& c, const SimulationReport& r,
                               const BudgetArgs& b) {
  using json = nlohmann::ordered_json;
  json doc;
  doc["config"] = {{"device", c.device},
                   {"seed", c.seed},
                   {"rounds", c.rounds},
                   {"heads", c.heads},
                   {"budget", c.budget},
                   {"budget_mode", c.budget_auto ? "auto" : "fixed"},
                   {"depth", c.depth},
                   {"top_k", c.top_k},
                   {"page_size", c.page_size},
                   {"num_pages", r.num_pages},
                   {"max_requests", c.max_requests},
                   {"prompt_min", c.prompt_min},
                   {"prompt_max", c.prompt_max},
                   {"gen_min", c.gen_min},
                   {"gen_max", c.gen_max},
                   {"policy", kvpool::free_policy_name(c.policy)},
                   {"defrag_threshold", c.defrag_threshold},
                   {"defrag_max_moves", c.defrag_max_moves},
                   {"accept_prob", c.accept_prob},
                   {"target", c.target},
                   {"draft_logit_range", c.draft_logit_range},
                   {"check_every", c.check_every},
                   {"check_max_context", c.check_max_context}};
  doc["wall_seconds"] = r.wall_seconds;
  doc["tree_nodes"] = r.tree_nodes;
  doc["requests"] = {{"admitted", r.requests_admitted},
                     {"finished", r.requests_finished},
                     {"cut_short", r.requests_cut_short},
                     {"live_at_end", r.requests_live_at_end},
                     {"admission_deferrals", r.admission_deferrals}};
  doc["tokens_committed"] = r.tokens_committed;
  doc["request_rounds"] = r.request_rounds;
  doc["mean_acceptance"] = r.mean_acceptance();
  doc["verify"] = {
      {"calls", r.verify_calls}, {"wall_seconds", r.verify_seconds}, {"flops", r.verify_flops}};
  doc["defrags"] = {{"runs", r.defrags.size()},
                    {"skipped", r.defrags_skipped},
                    {"pages_relocated", r.pages_relocated},
                    {"page_moves", r.defrag_moves}};
  doc["checks"] = {{"passed", r.checks_passed()},
                   {"rows_checked", r.rows_checked},
                   {"row_mismatches", r.row_mismatches},
                   {"nonfinite_outputs", r.nonfinite_outputs},
                   {"commit_plan_mismatches", r.commit_plan_mismatches},
                   {"cross_checks", r.cross_checks},
                   {"cross_checks_skipped", r.cross_checks_skipped},
                   {"cross_check_failures", r.cross_check_failures},
                   {"cross_check_max_diff", r.cross_check_max_diff},
                   {"accept_mismatches", r.accept_mismatches},
                   {"layout_mismatches", r.layout_mismatches}};
  doc["trace"] = fmt::format("{:016x}", r.trace);
  doc["gpu"] = nullptr;
  if (!r.gpu.verify_ms.empty()) {
    const double vt = stats(r.gpu.verify_ms).total;
    const double dt = stats(r.gpu.defrag_ms).total;
    doc["gpu"] = {{"verify_ms", json_stats(r.gpu.verify_ms)},
                  {"verify_tflops", vt > 0 ? r.gpu.verify_flops / (vt * 1e-3) / 1e12 : 0.0},
                  {"device_commit", r.device_commit},
                  {"commit_ms", json_stats(r.gpu.commit_ms)},
                  {"defrag_ms", json_stats(r.gpu.defrag_ms)},
                  {"defrag_bytes", r.gpu.defrag_bytes},
                  {"defrag_gbps_read_plus_write",
                   dt > 0 ? 2.0 * r.gpu.defrag_bytes / (dt * 1e-3) / 1e9 : 0.0}};
  }
  doc["fragmentation"] = nullptr;
  const FragmentationReport& g = r.frag;
  if (g.measured) {
    doc["fragmentation"] = {{"part", "prefix"},
                            {"batch", g.batch},
                            {"q_len", g.q_len},
                            {"heads", g.heads},
                            {"reps", g.reps},
                            {"prefix_rows", g.prefix_rows},
                            {"kv_bytes", g.kv_bytes},
                            {"flops", g.flops},
                            {"churned", json_layout(g.churned, g)},
                            {"defragged", json_layout(g.defragged, g)},
                            {"contiguous_page64", json_layout(g.contiguous, g)},
                            {"final_defrag",
                             {{"page_moves", g.final_defrag_moves},
                              {"bytes", g.final_defrag_bytes},
                              {"ms", g.final_defrag_ms}}},
                            {"max_diff", g.max_diff}};
  }
  doc["cost_model"] = cost_json(b, c, r);
  return doc;
}

}  // namespace

int cmd_simulate(int argc, char** argv) {
  CLI::App app(
      "Serving loop over a churning paged KV pool: requests arrive with random prompts and leave "
      "after a random\n"
      "number of tokens; every round each live request drafts a DDTree from a synthetic drafter, "
      "appends its\n"
      "latent rows, runs verify attention (CPU split design, cross-checked against the full "
      "reference), accepts\n"
      "a path against a synthetic target, commits the accepted rows and checks them; the pool is "
      "defragmented\n"
      "when fragmented. Deterministic for a seed.\n\n"
      "--device cuda (a CUDA build with a GPU) keeps the cache on the GPU: verify attention, "
      "acceptance +\n"
      "commit, defrag moves run there, timed with CUDA events; at the end the prefix pass is timed "
      "on the\n"
      "churned pool, after a full defrag and in a fresh contiguous cache. GLM-5 shapes at long "
      "context:\n"
      "  treemla simulate --device cuda --heads 8 --budget 64 --depth 15 --page-size 1 \\\n"
      "      --prompt-min 32768 --prompt-max 131072 --max-requests 4 --rounds 40\n\n"
      "--budget auto picks each tree's budget per request and round from a verify cost table "
      "(default: the\n"
      "H200 table installed with the tool) for the most tokens per second; --budget-compare prints "
      "auto beside\n"
      "fixed budgets for prompts of 4K..185K in under a second, without the serving loop "
      "(docs/budget.md).\n",
      "treemla simulate");
  cli::configure(app);
  SimulateArgs args;
  add_options(app, args);
  if (const auto rc = cli::parse(app, argc, argv, [&] { finish_config(app, args); })) return *rc;
  const SimulationConfig& c = args.config;
  if (!args.budget.compare)
    require_device(c.device);  // before any output: no GPU is an error (exit 1)
  std::ofstream json_file;
  if (!args.json.empty()) {  // before the run, which may take minutes
    json_file.open(args.json);
    if (!json_file)
      return cli::usage_error(app, "--json: '" + args.json + "' cannot be opened for writing");
  }
  if (args.budget.compare)
    return run_budget_compare(args.budget, args.compare,
                              json_file.is_open() ? &json_file : nullptr);
  print_header(std::cout, c, args.budget);
  std::cout << std::flush;
  StatusLine status(isatty(STDERR_FILENO) != 0);
  SimulationHooks hooks;
  hooks.lines = &std::cout;
  hooks.progress = [&](const RunProgress& p) { status.update(p); };
  const SimulationReport r = run_simulation(c, hooks);
  status.clear();
  print_summary(std::cout, c, r);
  if (json_file.is_open()) {
    json_file << to_json(c, r, args.budget).dump(2) << "\n";
    json_file.close();
    if (!json_file) {
      std::cerr << "treemla simulate: writing " << args.json << " failed\n";
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
