// treemla: choosing the DDTree budget B from what verify costs -- a measured cost table of verify
// attention, its interpolation, and a picker that maximises expected accepted tokens per second.
//
// The model (docs/budget.md gives it in full, with its assumptions):
//   E[tokens](B) = 1 + sum_{i < B} p_i,  p_i = clamp(calibration * exp(path_logprobs[i]), 0, 1)
//   round_us(B)  = fixed_us + per_node_us * (1 + B) + layers * C_v(1 + B, L)
//   B*           = argmax over the candidates of E[tokens](B) / round_us(B)
// where path_logprobs are the draft nodes' path log-probabilities in the builder's pop order
// (tree::DDTree::scores without the root) and C_v(n, L) is the table's verify time per layer.
//
// Every function validates its inputs and throws treemla::Error with a message naming the field or
// argument and the bound it broke. No file format lives here: the tool and the Python binding read
// the JSON file (schema in docs/budget.md) into a CostTable.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "treemla/tree.h"

namespace treemla {

// The grid `treemla bench --cost-table` measures: B in kCostTableBudgets (n = 1 + B) and L on a
// log grid from 1K to 256K. A table may use any other grid that passes validate_cost_table.
constexpr std::array<int32_t, 8> kCostTableBudgets = {0, 15, 31, 63, 127, 255, 511, 1023};
constexpr std::array<int64_t, 9> kCostTablePrefixLens = {1024,  2048,  4096,   8192,  16384,
                                                         32768, 65536, 131072, 262144};

// Verify attention time per layer, C_v(n[i], L[j]) = us[i][j] microseconds, for one request of
// n tree nodes (the root and B = n - 1 draft nodes) over a prefix of L rows, measured for one
// configuration. Fields mirror the JSON file one to one.
struct CostTable {
  std::string gpu;         // device name, e.g. "NVIDIA H200"
  std::string date;        // measurement date, YYYY-MM-DD
  std::string commit;      // treemla commit the kernel was built from
  int32_t heads = 0;       // query heads H, 1..kMaxHeads
  int32_t page_size = 0;   // KV page size, a power of two in [1, 65536] (paged_cache.h)
  std::vector<int32_t> n;  // [num_n] tree sizes 1 + B: 1 <= n[0] < n[1] < .. <= kMaxTreeNodes
  std::vector<int64_t> L;  // [num_L] prefix lengths: 0 <= L[0] < L[1] < .. <= kMaxPrefixLen
  std::vector<std::vector<double>> us;  // [num_n][num_L], finite and > 0

  int32_t min_budget() const { return n.empty() ? -1 : n.front() - 1; }
  int32_t max_budget() const { return n.empty() ? -1 : n.back() - 1; }
};

// Throws treemla::Error naming the first field that breaks the rules above (an empty axis, an
// axis that does not strictly increase, a row of the wrong length, a time that is not finite and
// positive, heads or page_size out of range).
void validate_cost_table(const CostTable& table);

// C_v(n, L) between grid points: piecewise bilinear in (n, L) -- linear in L between the two
// nearest L grid points, for each of the two nearest n grid points, then linear in n between
// those. Exact at grid points; along either axis it is monotone between neighbours; any cost of
// the form a + b n + c L + d n L is reproduced exactly. n outside [n.front(), n.back()] or L
// outside [L.front(), L.back()] is an error naming the range (no extrapolation).
double verify_cost_us(const CostTable& table, int32_t n, int64_t prefix_len);

// The per-round cost outside verify attention, and how many verify attention layers a round runs.
struct RoundCost {
  int32_t layers = 1;        // attention layers per verify forward, >= 1; C_v is per layer
  double fixed_us = 0.0;     // per round whatever the tree size (drafting, launch overheads, the
                             // target forward's size-independent part), finite, >= 0
  double per_node_us = 0.0;  // per verified node, n = 1 + B of them, root included (the target
                             // forward's per-token work outside attention), finite, >= 0
};

// round_us(B) above: fixed_us + per_node_us * (1 + budget) + layers * C_v(1 + budget, L).
double round_cost_us(const CostTable& table, int32_t budget, int64_t prefix_len,
                     const RoundCost& cost);

// E[tokens](budget) above: 1 + the sum of the first `budget` acceptance probabilities.
// path_logprobs: one per draft node in pop order, each <= 0 (-inf allowed: probability 0; NaN and
// +inf are errors), non-increasing (as build_ddtree emits them). 0 <= budget <= size;
// calibration finite and >= 0.
double expected_tokens(std::span<const double> path_logprobs, int32_t budget,
                       double calibration = 1.0);

struct PickOptions {
  // Multiplies every path probability before the clamp to [0, 1]; 1 trusts the drafter. Measured
  // online, e.g. accepted draft tokens / (expected_tokens(.., calibration 1) - 1) over recent
  // rounds (docs/budget.md).
  double calibration = 1.0;
  // Budgets to consider, in any order (duplicates are ignored). Each must lie in
  // [table.min_budget(), table.max_budget()] and be <= path_logprobs.size().
  // Empty: the table's own budgets n[i] - 1 that are <= path_logprobs.size().
  std::vector<int32_t> candidates;
  // Consider every B from table.min_budget() to min(table.max_budget(), path_logprobs.size())
  // instead (C_v interpolated in n between grid rows). Not together with `candidates`.
  bool every_budget = false;
  bool report_all = false;  // fill BudgetChoice::all
};

// One candidate budget, evaluated.
struct BudgetPoint {
  int32_t budget = 0;            // B; the tree has 1 + B nodes
  double expected_tokens = 0.0;  // E[tokens](B), >= 1
  double verify_us = 0.0;        // layers * C_v(1 + B, L)
  double round_us = 0.0;         // fixed_us + per_node_us * (1 + B) + verify_us
  double tokens_per_s = 0.0;     // expected_tokens / round_us * 1e6
};

struct BudgetChoice {
  BudgetPoint best;              // the highest tokens_per_s; ties go to the smaller B
  std::vector<BudgetPoint> all;  // every candidate in increasing B, when options.report_all
};

// The budget that maximises expected accepted tokens per second for one request of prefix length
// prefix_len (inside the table's L range). To apply it, build the tree once with the largest
// budget considered and keep its first 1 + B nodes (truncate_ddtree): build_ddtree's pop order
// makes that exactly the tree build_ddtree gives for budget B.
BudgetChoice pick_budget(const CostTable& table, std::span<const double> path_logprobs,
                         int64_t prefix_len, const RoundCost& cost,
                         const PickOptions& options = {});

// The same from a built tree: path_logprobs = tree.scores without the root's.
BudgetChoice pick_budget(const CostTable& table, const tree::DDTree& tree, int64_t prefix_len,
                         const RoundCost& cost, const PickOptions& options = {});

// The first 1 + budget nodes of tree (parents, tokens, depths, ranks, scores), 0 <= budget <
// tree.size(). For a DDTree built with a larger budget this is the DDTree of the smaller one.
tree::DDTree truncate_ddtree(const tree::DDTree& tree, int32_t budget);

}  // namespace treemla
