// treemla_sim: the rules of SimulationConfig (bounds, pool size, the ties between options).
#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>

#include "sim/simulation.h"
#include "sim/synthetic.h"

namespace treemla::tool {

int32_t tree_nodes(const SimulationConfig& c) { return ddtree_nodes(c.depth, c.top_k, c.budget); }

int64_t default_num_pages(const SimulationConfig& c) {
  return int64_t{c.max_requests} *
             pages_for_rows(int64_t{c.prompt_max} + c.gen_max + tree_nodes(c), c.page_size) +
         1;
}

namespace {

// The run must be one the cost table can cost: its configuration, its tree sizes and its prefixes.
void check_against_table(const SimulationConfig& c) {
  const CostTable& t = c.cost_model.table;
  check_table_configuration(t, c.heads, c.page_size);
  const int32_t nodes = tree_nodes(c);
  if (nodes < t.n.front() || nodes > t.n.back()) {
    throw std::invalid_argument(
        "--budget " + std::to_string(c.budget) + " with --depth " + std::to_string(c.depth) +
        " and --topk " + std::to_string(c.top_k) + " makes trees of " + std::to_string(nodes) +
        " nodes, outside the cost table's n range [" + std::to_string(t.n.front()) + ", " +
        std::to_string(t.n.back()) + "]");
  }
  const int64_t longest = int64_t{c.prompt_max} + c.gen_max - 1;  // a request's longest prefix
  if (longest > t.L.back()) {
    throw std::invalid_argument("--prompt-max " + std::to_string(c.prompt_max) +
                                " with --gen-max " + std::to_string(c.gen_max) +
                                " gives prefixes up to " + std::to_string(longest) +
                                " rows, past the cost table's largest L, " +
                                std::to_string(t.L.back()) + " (no extrapolation)");
  }
}

}  // namespace

void validate_config(const SimulationConfig& c) {
  auto bad = [](const std::string& name, const std::string& value, const std::string& want) {
    throw std::invalid_argument("--" + name + ": '" + value + "' must be " + want);
  };
  auto real = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  auto range = [&](const char* name, int64_t v, IntRange r) {
    if (v < r.lo || v > r.hi)
      bad(name, std::to_string(v),
          "an integer in [" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]");
  };
  check_device(c.device);
  range("rounds", c.rounds, limits::kRounds);
  range("heads", c.heads, limits::kHeads);
  range("budget", c.budget, limits::kBudget);
  range("depth", c.depth, limits::kDepth);
  range("topk", c.top_k, limits::kTopK);
  range("page-size", c.page_size, limits::kPageSize);
  if (c.page_size & (c.page_size - 1))
    bad("page-size", std::to_string(c.page_size), "a power of two");
  range("max-requests", c.max_requests, limits::kMaxRequests);
  range("prompt-min", c.prompt_min, limits::kPromptLen);
  range("prompt-max", c.prompt_max, limits::kPromptLen);
  if (c.prompt_max < c.prompt_min)
    bad("prompt-max", std::to_string(c.prompt_max),
        ">= --prompt-min (" + std::to_string(c.prompt_min) + ")");
  range("gen-min", c.gen_min, limits::kGenLen);
  range("gen-max", c.gen_max, limits::kGenLen);
  if (c.gen_max < c.gen_min)
    bad("gen-max", std::to_string(c.gen_max), ">= --gen-min (" + std::to_string(c.gen_min) + ")");
  range("defrag-max-moves", c.defrag_max_moves, limits::kDefragMaxMoves);
  range("check-every", c.check_every, limits::kCheckEvery);
  range("check-max-context", c.check_max_context, limits::kCheckMaxContext);
  range("frag-reps", c.frag_reps, limits::kFragReps);
  if (c.frag_report < -1 || c.frag_report > 1)
    bad("frag-report", std::to_string(c.frag_report), "auto, on or off");
  range("progress-every", c.progress_every, limits::kProgressEvery);
  if (!(c.accept_prob >= 0.0 && c.accept_prob <= 1.0))
    bad("accept-prob", real(c.accept_prob), "a number in [0, 1]");
  if (!(c.defrag_threshold == 0.0 || (c.defrag_threshold >= 1.0 && c.defrag_threshold <= 1e9)))
    bad("defrag-threshold", real(c.defrag_threshold),
        "0 (off) or a number of runs per request in [1, 1e9]");
  if (!(c.draft_logit_range >= 0.0 && c.draft_logit_range <= limits::kMaxDraftLogitRange))
    bad("draft-logit-range", real(c.draft_logit_range),
        "a number in [0, " + real(limits::kMaxDraftLogitRange) + "]");
  parse_target(c.target);
  validate_cost_model(c.cost_model);
  if (c.budget_auto && !c.cost_model.on())
    throw std::invalid_argument("--budget auto needs a cost table (--cost-table)");
  if (c.cost_model.on()) check_against_table(c);
  range("num-pages", c.num_pages, limits::kNumPages);
  if (c.num_pages > 0) {
    // A request must fit alone, or it would wait for admission forever.
    const int64_t need = pages_for_rows(int64_t{c.prompt_max} + tree_nodes(c), c.page_size);
    if (c.num_pages < need)
      bad("num-pages", std::to_string(c.num_pages),
          "at least " + std::to_string(need) + " (one --prompt-max prompt plus one tree of " +
              std::to_string(tree_nodes(c)) + " rows), or 0 for the default");
  }
  // A host cache is capped at 4 GiB; a device cache at 64 GiB (the loop's host memory stays
  // proportional to the live requests, and 128k-token requests at page size 1 need ~150 MiB each).
  const int gib = c.device == "cuda" ? 64 : 4;
  const int64_t page_bytes = int64_t{c.page_size} * kHeadDimQK * 2;
  const int64_t max_pages = (int64_t{gib} << 30) / page_bytes;
  const std::string cap = std::to_string(gib) + " GiB a " + c.device + " cache may take";
  if (c.num_pages > max_pages)
    bad("num-pages", std::to_string(c.num_pages),
        "at most " + std::to_string(max_pages) + " at --page-size " + std::to_string(c.page_size) +
            ", the " + cap + " (--num-pages x --page-size x 1152 B)");
  if (c.num_pages == 0 && default_num_pages(c) > max_pages) {
    // The default pool holds every live request at its largest: name the options that size it.
    const int64_t per_request =
        pages_for_rows(int64_t{c.prompt_max} + c.gen_max + tree_nodes(c), c.page_size);
    std::ostringstream os;
    os << "--max-requests " << c.max_requests << " with --prompt-max " << c.prompt_max
       << " and --gen-max " << c.gen_max << " needs a pool of " << std::fixed
       << std::setprecision(1)
       << double(default_num_pages(c)) * double(page_bytes) / double(1 << 30)
       << " GiB (the default pool holds every live request at its largest), over the " << cap
       << ": use --max-requests " << (max_pages - 1) / per_request
       << " or fewer, a smaller --prompt-max or --gen-max, or a smaller pool with --num-pages "
          "(requests then wait "
          "for free pages)";
    throw std::invalid_argument(os.str());
  }
}

}  // namespace treemla::tool
