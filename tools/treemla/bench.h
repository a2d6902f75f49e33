// treemla bench: what the command line asks for (Options, parse_options) and what a run reports
// (the table and the JSON). Host code in bench.cpp, built with or without CUDA, so that the
// options are checked before anything asks for a GPU; the measurement is bench_gpu.cu (run).
// Plain C++17: bench_gpu.cu includes it.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace treemla::tool::bench {

struct Shape {
  int batch = 0, heads = 0, q_len = 0, prefix = 0, page_size = 0;
};

struct Options {
  std::vector<Shape> cases;   // empty: the standard grid (bench_gpu.cu)
  std::string tiles = "all";  // all, smem99k or smem-large
  // "all" (every family the device runs), or any of cpasync, cluster, sm90a, decode, warpspec
  std::vector<std::string> families{"all"};
  // --cost-table FILE: instead of the grid, measure verify time per layer on the cost-table grid
  // (include/treemla/budget.h) for cost_heads and cost_page_size, with the plan's default family
  // and tile, and write it to FILE as the JSON docs/budget.md describes.
  std::string cost_table;
  int cost_heads = 8;
  int cost_page_size = 64;
  int reps = 20;     // timed repetitions per measurement (median)
  std::string json;  // write the results here as JSON; empty: no JSON
  std::string commit = "unknown";
};

// "default", or semicolon-separated batch:heads:q_len:prefix:page_size entries into `shapes`
// (none for "default"). Returns the error ("" if none), which quotes the entry.
std::string parse_cases(const std::string& text, std::vector<Shape>& shapes);

// Parses `treemla bench` (argv[1] is "bench"). Returns nothing when the benchmark should run,
// or the exit code when it should not (0 after --help, 2 after a bad option, message printed).
std::optional<int> parse_options(int argc, char** argv, Options& out);

// Runs the benchmark on GPU 0 and prints it; the exit code (1 without a GPU). bench_gpu.cu.
int run(const Options& options);

// ---- the report ----------------------------------------------------------------------------

struct Device {
  std::string name;
  int sm = 0, sm_count = 0;  // sm: 10 * major + minor
  double sm_mhz = 0, mem_mhz = 0;
  int cuda_runtime = 0, driver = 0;
};

struct Ceilings {  // measured in the same run
  double hbm_read_gbps = 0, mma_tflops = 0;
  double wgmma_tflops = 0;  // 0 where the device or the build has no sm_90a wgmma
};

struct Row {  // one case on one kernel family and tile configuration
  std::string family, tile;
  Shape shape;
  double us = 0, us_prefix = 0, us_tail = 0;  // whole call; prefix part alone; tail part alone
  double tflops = 0, kv_gbps = 0, frac_mma = 0, frac_hbm = 0;
  double frac_wgmma = 0;            // of the wgmma peak, where measured
  double paged_read_gbps = 0;       // q_len = 1 cases: the same pages read at full occupancy
  double paged_read_1cta_gbps = 0;  // ... and by one 8-warp CTA per SM, as the verify grid
};

struct Header {
  Device device;
  Ceilings ceilings;
  std::string date, commit;
  int reps = 0;
};

void print_header(std::ostream& os, const Header& h);
void print_row(std::ostream& os, const Row& r);
// The design targets, read off the rows (no new measurement).
void print_targets(std::ostream& os, const std::vector<Row>& rows);
// The JSON document (docs/tool.md lists the keys).
void write_json(std::ostream& os, const Header& h, const std::vector<Row>& rows);

// One measured point of a cost table.
struct CostPoint {
  int n = 0;      // 1 + B query rows per request
  int64_t L = 0;  // prefix length
  double us = 0;  // verify time per layer (prefix + tail + merge), microseconds
};
// The cost table's grid, from include/treemla/budget.h (which needs C++20, unlike this header's
// CUDA users): tree sizes 1 + B for kCostTableBudgets, and kCostTablePrefixLens.
std::vector<int> cost_table_sizes();
std::vector<int64_t> cost_table_prefix_lens();
// The cost table JSON (docs/budget.md): gpu, date, commit, heads, page_size, n, L, us[n][L].
void write_cost_table(std::ostream& os, const Header& h, int heads, int page_size,
                      const std::string& family, const std::string& tile, const std::vector<int>& n,
                      const std::vector<int64_t>& L, const std::vector<CostPoint>& points);

// Today's date in UTC, YYYY-MM-DD.
std::string utc_date();

}  // namespace treemla::tool::bench
