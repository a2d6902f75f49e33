// treemla bench: options, table and JSON (the measurement is bench_gpu.cu).
#include "bench.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "cli.h"
#include "commands.h"
#include "treemla/attention.h"
#include "treemla/budget.h"

namespace treemla::tool {

namespace bench {

namespace {

// One field of a --cases entry; false with `error` set when it is not an integer in [lo, hi].
bool field(const std::string& text, const char* name, int64_t lo, int64_t hi, int& out,
           std::string& error) {
  int64_t x = 0;
  if (!cli::parse_integer(text, x) || x < lo || x > hi) {
    error = fmt::format("{} '{}' must be an integer in [{}, {}]", name, text, lo, hi);
    return false;
  }
  out = static_cast<int>(x);
  return true;
}

}  // namespace

// "default", or semicolon-separated batch:heads:q_len:prefix:page_size. Returns the error ("" if
// none); `shapes` gets the cases (none for "default").
std::string parse_cases(const std::string& text, std::vector<Shape>& shapes) {
  shapes.clear();
  if (text == "default") return {};
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ';')) {
    std::vector<std::string> parts;
    std::stringstream es(entry);
    for (std::string part; std::getline(es, part, ':');) parts.push_back(part);
    if (parts.size() != 5 || entry.back() == ':')
      return fmt::format("entry '{}' must be batch:heads:q_len:prefix:page_size (five integers)",
                         entry);
    Shape s;
    std::string why;
    if (!field(parts[0], "batch", 1, 4096, s.batch, why) ||
        !field(parts[1], "heads", 1, kMaxHeads, s.heads, why) ||
        !field(parts[2], "q_len", 1, kMaxTreeNodes, s.q_len, why) ||
        !field(parts[3], "prefix", 0, kMaxPrefixLen, s.prefix, why) ||
        !field(parts[4], "page_size", 1, 65536, s.page_size, why))
      return fmt::format("entry '{}': {}", entry, why);
    if (s.page_size & (s.page_size - 1))
      return fmt::format("entry '{}': page_size '{}' must be a power of two", entry, s.page_size);
    shapes.push_back(s);
  }
  if (shapes.empty())
    return "'" + text + "' must be 'default' or batch:heads:q_len:prefix:page_size entries";
  return {};
}

std::optional<int> parse_options(int argc, char** argv, Options& out) {
  CLI::App app(
      "Times verify attention (prefix + tail + merge) on the GPU over a grid of shapes, with HBM "
      "read\n"
      "bandwidth and the bf16 mma.sync peak measured in the same run. Each listed shape runs with "
      "every\n"
      "tile configuration that fits the device.\n",
      "treemla bench");
  cli::configure(app);
  std::string cases = "default";
  app.add_option("--cases", cases,
                 "'default' for the standard grid, or semicolon-separated "
                 "batch:heads:q_len:prefix:page_size")
      ->check(CLI::Validator(
          [](std::string& s) {
            std::vector<Shape> shapes;
            return parse_cases(s, shapes);  // the message quotes the entry
          },
          "CASES"))
      ->capture_default_str();
  cli::add_choice(app, "--tiles", out.tiles, {"all", "smem99k", "smem-large"},
                  "tile configurations");
  cli::add_choice_list(app, "--families", out.families,
                       {"all", "cpasync", "cluster", "sm90a", "decode", "warpspec"},
                       "kernel families (all: every family the device runs)");
  app.add_option("--cost-table", out.cost_table,
                 "measure the verify cost table (docs/budget.md) instead of the grid and write it "
                 "to this file");
  cli::add_integer(app, "--cost-heads", out.cost_heads, 1, kMaxHeads, "heads H of the cost table");
  cli::add_integer(app, "--cost-page-size", out.cost_page_size, 1, 65536,
                   "page size of the cost table");
  cli::add_integer(app, "--reps", out.reps, 3, 1000,
                   "timed repetitions per measurement (median reported)");
  app.add_option("--json", out.json, "write results as JSON to this file");
  app.add_option("--commit", out.commit, "commit recorded in the table and the JSON")
      ->capture_default_str();
  if (auto rc = cli::parse(app, argc, argv)) return rc;
  parse_cases(cases, out.cases);  // checked above
  if (out.cost_page_size & (out.cost_page_size - 1)) {
    std::cerr << "treemla bench: --cost-page-size: '" << out.cost_page_size
              << "' must be a power of two\n";
    return 2;
  }
  return std::nullopt;
}

void print_header(std::ostream& os, const Header& h) {
  const Device& d = h.device;
  fmt::print(os,
             "# treemla bench  gpu: {} (sm_{}, {} SMs, {:.0f} MHz SM, {:.0f} MHz mem)  cuda "
             "runtime {} driver {}\n",
             d.name, d.sm, d.sm_count, d.sm_mhz, d.mem_mhz, d.cuda_runtime, d.driver);
  fmt::print(os, "# date {}  commit {}  reps {} (median)\n", h.date, h.commit, h.reps);
  fmt::print(os,
             "# ceilings measured now: HBM read {:.0f} GB/s, bf16 mma.sync m16n8k16 {:.1f} TFLOP/s",
             h.ceilings.hbm_read_gbps, h.ceilings.mma_tflops);
  if (h.ceilings.wgmma_tflops > 0)
    fmt::print(os, ", bf16 wgmma m64n256k16 {:.1f} TFLOP/s", h.ceilings.wgmma_tflops);
  fmt::print(os, "\n");
  fmt::print(
      os,
      "# us = prefix + tail + merge; prefix-only and tail-only are the same kernels on one part\n");
  fmt::print(os,
             "{:<8} {:<10} {:>5} {:>4} {:>5} {:>7} {:>5} | {:>9} {:>9} {:>9} | {:>8} {:>6} | {:>8} "
             "{:>6}\n",
             "family", "tile", "batch", "H", "q_len", "prefix", "page", "us", "us_pref", "us_tail",
             "TFLOP/s", "%mma", "KV GB/s", "%hbm");
}

void print_row(std::ostream& os, const Row& r) {
  const Shape& c = r.shape;
  fmt::print(os,
             "{:<8} {:<10} {:>5} {:>4} {:>5} {:>7} {:>5} | {:>9.1f} {:>9.1f} {:>9.1f} | {:>8.1f} "
             "{:>5.1f}% | {:>8.0f} "
             "{:>5.1f}%\n",
             r.family, r.tile, c.batch, c.heads, c.q_len, c.prefix, c.page_size, r.us, r.us_prefix,
             r.us_tail, r.tflops, 100 * r.frac_mma, r.kv_gbps, 100 * r.frac_hbm);
  os << std::flush;
}

void print_targets(std::ostream& os, const std::vector<Row>& rows) {
  fmt::print(os, "\n# targets (H200 figures in docs/benchmarks.md)\n");
  for (const Row& r : rows) {
    const Shape& c = r.shape;
    const std::string tn = r.family + "/" + r.tile;
    if (c.prefix == 0)
      fmt::print(os,
                 "fixed cost     {:<18} B={} H={} q={} L=0: {:.1f} us per call (target <= 8 us)\n",
                 tn, c.batch, c.heads, c.q_len, r.us);
    if (c.heads * c.q_len >= 256 && c.prefix >= 16384)
      fmt::print(
          os,
          "compute-bound  {:<18} B={} H={} q={} L={} page={}: {:.1f}% of mma.sync peak (target >= "
          "60%)\n",
          tn, c.batch, c.heads, c.q_len, c.prefix, c.page_size, 100 * r.frac_mma);
    if (r.family == "sm90a" && r.frac_wgmma > 0 && c.heads * c.q_len >= 256 && c.prefix >= 16384)
      fmt::print(os,
                 "wgmma          {:<18} B={} H={} q={} L={} page={}: {:.1f}% of the wgmma peak "
                 "(target >= 85% at 1,128,64,131072)\n",
                 tn, c.batch, c.heads, c.q_len, c.prefix, c.page_size, 100 * r.frac_wgmma);
    if (c.q_len == 1 && c.heads >= 8 && c.heads <= 16 && c.prefix >= 32768)
      fmt::print(os,
                 "memory-bound   {:<18} B={} H={} q=1 L={} page={}: {:.1f}% of HBM read (target >= "
                 "90%); the same pages read by a plain copy: {:.1f}% of HBM at full occupancy, "
                 "{:.1f}% with one 8-warp CTA per SM\n",
                 tn, c.batch, c.heads, c.prefix, c.page_size, 100 * r.frac_hbm,
                 100 * r.paged_read_gbps * r.frac_hbm / r.kv_gbps,
                 100 * r.paged_read_1cta_gbps * r.frac_hbm / r.kv_gbps);
    if (c.prefix == 32768 && c.q_len == 65)
      fmt::print(
          os,
          "tail + merge   {:<18} B={} H={} q=65 L=32768: fused tail adds {:.1f}% over prefix only; "
          "tail alone {:.1f}% of the whole (target <= 10%)\n",
          tn, c.batch, c.heads, 100 * std::max(0.0, r.us - r.us_prefix) / r.us,
          100 * r.us_tail / r.us);
    if (c.page_size == 1) {
      for (const Row& o : rows) {
        const Shape& oc = o.shape;
        if (oc.page_size == 64 && oc.batch == c.batch && oc.heads == c.heads &&
            oc.q_len == c.q_len && oc.prefix == c.prefix && o.tile == r.tile &&
            o.family == r.family)
          fmt::print(os,
                     "page size 1    {:<18} B={} H={} q={} L={}: {:.1f}% slower than page size 64 "
                     "(target <= 5%)\n",
                     tn, c.batch, c.heads, c.q_len, c.prefix, 100 * (r.us / o.us - 1));
      }
    }
  }
}

void write_json(std::ostream& os, const Header& h, const std::vector<Row>& rows) {
  using json = nlohmann::ordered_json;
  // Cases with no prefix measure the fixed cost of a call ("empty_calls"); they are kept out of
  // "results", whose readers take every q_len = 1 row for a decode (bandwidth) case.
  json results = json::array(), empty_calls = json::array();
  for (const Row& r : rows) {
    json row = {{"family", r.family},
                {"tile", r.tile},
                {"batch", r.shape.batch},
                {"heads", r.shape.heads},
                {"q_len", r.shape.q_len},
                {"prefix", r.shape.prefix},
                {"page_size", r.shape.page_size},
                {"us", r.us},
                {"us_prefix_only", r.us_prefix},
                {"us_tail_only", r.us_tail},
                {"tflops", r.tflops},
                {"kv_gbps", r.kv_gbps},
                {"frac_mma_peak", r.frac_mma},
                {"frac_wgmma_peak", r.frac_wgmma},
                {"frac_hbm", r.frac_hbm},
                {"paged_read_gbps", r.paged_read_gbps},
                {"paged_read_one_cta_per_sm_gbps", r.paged_read_1cta_gbps}};
    (r.shape.prefix == 0 ? empty_calls : results).push_back(std::move(row));
  }
  const json doc = {{"gpu", h.device.name},
                    {"sm", h.device.sm},
                    {"sm_count", h.device.sm_count},
                    {"date", h.date},
                    {"commit", h.commit},
                    {"cuda_runtime", h.device.cuda_runtime},
                    {"driver", h.device.driver},
                    {"hbm_read_gbps", h.ceilings.hbm_read_gbps},
                    {"mma_sync_bf16_tflops", h.ceilings.mma_tflops},
                    {"wgmma_bf16_tflops", h.ceilings.wgmma_tflops},
                    {"results", results},
                    {"empty_calls", empty_calls}};
  os << doc.dump(2) << "\n";
}

std::vector<int> cost_table_sizes() {
  std::vector<int> n;
  for (int32_t b : kCostTableBudgets) n.push_back(b + 1);
  return n;
}

std::vector<int64_t> cost_table_prefix_lens() {
  return {kCostTablePrefixLens.begin(), kCostTablePrefixLens.end()};
}

void write_cost_table(std::ostream& os, const Header& h, int heads, int page_size,
                      const std::string& family, const std::string& tile, const std::vector<int>& n,
                      const std::vector<int64_t>& L, const std::vector<CostPoint>& points) {
  using json = nlohmann::ordered_json;
  json us = json::array();
  for (int ni : n) {
    json row = json::array();
    for (int64_t l : L) {
      const auto it = std::find_if(points.begin(), points.end(),
                                   [&](const CostPoint& p) { return p.n == ni && p.L == l; });
      row.push_back(it == points.end() ? 0.0 : it->us);
    }
    us.push_back(row);
  }
  const json doc = {{"gpu", h.device.name},
                    {"date", h.date},
                    {"commit", h.commit},
                    {"heads", heads},
                    {"page_size", page_size},
                    {"family", family},
                    {"tile", tile},
                    {"n", n},
                    {"L", L},
                    {"us", us}};
  os << doc.dump(1) << "\n";
}

std::string utc_date() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  return date;
}

}  // namespace bench

int cmd_bench(int argc, char** argv) {
  bench::Options options;
  if (const auto rc = bench::parse_options(argc, argv, options)) return *rc;
#ifdef TREEMLA_WITH_CUDA
  return bench::run(options);
#else
  std::cerr << "treemla bench: this build has no CUDA kernels (configure with a CUDA compiler)\n";
  return 1;
#endif
}

}  // namespace treemla::tool
