// Budget picker: cost-table validation and interpolation, the expected-tokens model, and the
// search over candidate budgets for the highest expected accepted tokens per second.
#include "treemla/budget.h"

#include <algorithm>
#include <cmath>

#include "treemla/error.h"
#include "treemla/paged_cache.h"

namespace treemla {

namespace {

template <typename T>
void validate_axis(const std::vector<T>& axis, const char* name, T lo, T hi) {
  TREEMLA_CHECK(!axis.empty(), "cost table: " << name << " is empty; the grid needs >= 1 point");
  TREEMLA_CHECK(axis.front() >= lo,
                "cost table: " << name << "[0] = " << axis.front() << " must be >= " << lo);
  for (size_t i = 1; i < axis.size(); ++i)
    TREEMLA_CHECK(axis[i] > axis[i - 1], "cost table: " << name << "[" << i << "] = " << axis[i]
                                                        << " must be > " << name << "[" << i - 1
                                                        << "] = " << axis[i - 1]
                                                        << " (the axis strictly increases)");
  TREEMLA_CHECK(axis.back() <= hi, "cost table: " << name << "[" << axis.size() - 1
                                                  << "] = " << axis.back() << " must be <= " << hi);
}

// Where x falls on a strictly increasing axis: value = (1 - t) * f[lo] + t * f[hi]. On a grid
// point lo == hi and t == 0, so the result is that point's value bit for bit.
struct Bracket {
  size_t lo = 0;
  size_t hi = 0;
  double t = 0.0;
};

template <typename T>
Bracket bracket(const std::vector<T>& axis, int64_t x) {
  const auto it = std::upper_bound(axis.begin(), axis.end(), static_cast<T>(x));
  const size_t lo = static_cast<size_t>(it - axis.begin()) - 1;  // axis[lo] <= x, x in range
  if (axis[lo] == x) return {lo, lo, 0.0};
  const double t = static_cast<double>(x - axis[lo]) / static_cast<double>(axis[lo + 1] - axis[lo]);
  return {lo, lo + 1, t};
}

double lerp(double a, double b, double t) { return (1.0 - t) * a + t * b; }

void check_prefix_len(const CostTable& table, int64_t prefix_len) {
  TREEMLA_CHECK(prefix_len >= table.L.front() && prefix_len <= table.L.back(),
                "prefix_len = " << prefix_len << " is outside the cost table's L range ["
                                << table.L.front() << ", " << table.L.back()
                                << "] (no extrapolation)");
}

void check_n(const CostTable& table, int32_t n) {
  TREEMLA_CHECK(n >= table.n.front() && n <= table.n.back(),
                "n = " << n << " is outside the cost table's n range [" << table.n.front() << ", "
                       << table.n.back() << "] (B = n - 1 in [" << table.min_budget() << ", "
                       << table.max_budget() << "]; no extrapolation)");
}

// C_v on a validated table, n and prefix_len inside its ranges.
double interpolate(const CostTable& table, int32_t n, int64_t prefix_len) {
  const Bracket bn = bracket(table.n, n);
  const Bracket bl = bracket(table.L, prefix_len);
  auto row = [&](size_t i) { return lerp(table.us[i][bl.lo], table.us[i][bl.hi], bl.t); };
  return lerp(row(bn.lo), row(bn.hi), bn.t);
}

void validate_round_cost(const RoundCost& cost) {
  TREEMLA_CHECK(cost.layers >= 1, "cost.layers = " << cost.layers << " must be >= 1");
  TREEMLA_CHECK(std::isfinite(cost.fixed_us) && cost.fixed_us >= 0.0,
                "cost.fixed_us = " << cost.fixed_us << " must be finite and >= 0");
  TREEMLA_CHECK(std::isfinite(cost.per_node_us) && cost.per_node_us >= 0.0,
                "cost.per_node_us = " << cost.per_node_us << " must be finite and >= 0");
}

void validate_calibration(double calibration) {
  TREEMLA_CHECK(std::isfinite(calibration) && calibration >= 0.0,
                "calibration = " << calibration << " must be finite and >= 0");
}

void validate_path_logprobs(std::span<const double> lp) {
  for (size_t i = 0; i < lp.size(); ++i) {
    TREEMLA_CHECK(!std::isnan(lp[i]) && lp[i] <= 0.0,
                  "path_logprobs[" << i << "] = " << lp[i]
                                   << " must be a log-probability: <= 0, not NaN (-inf allowed)");
    TREEMLA_CHECK(i == 0 || lp[i] <= lp[i - 1],
                  "path_logprobs[" << i << "] = " << lp[i] << " must be <= path_logprobs[" << i - 1
                                   << "] = " << lp[i - 1] << " (pop order: scores never increase)");
  }
}

// tokens[b] = E[tokens](b) for b = 0..max_budget, summed in pop order.
std::vector<double> cumulative_tokens(std::span<const double> lp, int32_t max_budget,
                                      double calibration) {
  std::vector<double> tokens(static_cast<size_t>(max_budget) + 1);
  tokens[0] = 1.0;
  for (int32_t b = 0; b < max_budget; ++b) {
    // exp(-inf) = 0; calibration * p may pass 1 when calibration > 1, hence the clamp.
    const double p = std::clamp(calibration * std::exp(lp[b]), 0.0, 1.0);
    tokens[b + 1] = tokens[b] + p;
  }
  return tokens;
}

// The candidate budgets of a pick, increasing and distinct; every one fits the table and the
// scored nodes.
std::vector<int32_t> resolve_candidates(const CostTable& table, int64_t num_scored,
                                        const PickOptions& options) {
  const int32_t lo = table.min_budget(), hi = table.max_budget();
  std::vector<int32_t> out;
  if (!options.candidates.empty()) {
    TREEMLA_CHECK(!options.every_budget,
                  "options.every_budget and options.candidates are exclusive; set one");
    for (size_t i = 0; i < options.candidates.size(); ++i) {
      const int32_t b = options.candidates[i];
      TREEMLA_CHECK(b >= lo && b <= hi, "options.candidates["
                                            << i << "] = " << b
                                            << " is outside the cost table's budgets [" << lo
                                            << ", " << hi << "]");
      TREEMLA_CHECK(b <= num_scored, "options.candidates["
                                         << i << "] = " << b << " exceeds the " << num_scored
                                         << " scored draft nodes (path_logprobs.size())");
      out.push_back(b);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  if (options.every_budget) {
    for (int64_t b = lo; b <= std::min<int64_t>(hi, num_scored); ++b)
      out.push_back(static_cast<int32_t>(b));
  } else {
    for (const int32_t n : table.n)
      if (n - 1 <= num_scored) out.push_back(n - 1);
  }
  TREEMLA_CHECK(!out.empty(), "no budget of the cost table (smallest B = "
                                  << lo << ") fits the " << num_scored
                                  << " scored draft nodes (path_logprobs.size())");
  return out;
}

}  // namespace

void validate_cost_table(const CostTable& table) {
  TREEMLA_CHECK(table.heads >= 1 && table.heads <= kMaxHeads,
                "cost table: heads = " << table.heads << " must be in 1.." << kMaxHeads);
  check_page_size(table.page_size,
                  "cost table: page_size");  // the verify call's bound (paged_cache.h)
  validate_axis<int32_t>(table.n, "n", 1, kMaxTreeNodes);
  validate_axis<int64_t>(table.L, "L", 0, kMaxPrefixLen);
  TREEMLA_CHECK(table.us.size() == table.n.size(),
                "cost table: us has " << table.us.size() << " rows; must be n.size() = "
                                      << table.n.size() << " (one row per n)");
  for (size_t i = 0; i < table.us.size(); ++i) {
    TREEMLA_CHECK(table.us[i].size() == table.L.size(),
                  "cost table: us[" << i << "] has " << table.us[i].size()
                                    << " entries; must be L.size() = " << table.L.size());
    for (size_t j = 0; j < table.us[i].size(); ++j) {
      const double v = table.us[i][j];
      TREEMLA_CHECK(std::isfinite(v) && v > 0.0,
                    "cost table: us[" << i << "][" << j << "] = " << v << " (n = " << table.n[i]
                                      << ", L = " << table.L[j] << ") must be finite and > 0");
    }
  }
}

double verify_cost_us(const CostTable& table, int32_t n, int64_t prefix_len) {
  validate_cost_table(table);
  check_n(table, n);
  check_prefix_len(table, prefix_len);
  return interpolate(table, n, prefix_len);
}

double round_cost_us(const CostTable& table, int32_t budget, int64_t prefix_len,
                     const RoundCost& cost) {
  validate_round_cost(cost);
  TREEMLA_CHECK(budget >= 0 && budget <= tree::kMaxBudget,
                "budget = " << budget << " must be in 0.." << tree::kMaxBudget);
  const double verify = verify_cost_us(table, budget + 1, prefix_len);
  return cost.fixed_us + cost.per_node_us * (budget + 1) + cost.layers * verify;
}

double expected_tokens(std::span<const double> path_logprobs, int32_t budget, double calibration) {
  validate_path_logprobs(path_logprobs);
  validate_calibration(calibration);
  TREEMLA_CHECK(budget >= 0 && static_cast<size_t>(budget) <= path_logprobs.size(),
                "budget = " << budget << " must be in 0.." << path_logprobs.size()
                            << " (path_logprobs.size(), the scored draft nodes)");
  return cumulative_tokens(path_logprobs, budget, calibration)[budget];
}

BudgetChoice pick_budget(const CostTable& table, std::span<const double> path_logprobs,
                         int64_t prefix_len, const RoundCost& cost, const PickOptions& options) {
  validate_cost_table(table);
  validate_round_cost(cost);
  validate_path_logprobs(path_logprobs);
  validate_calibration(options.calibration);
  check_prefix_len(table, prefix_len);
  const std::vector<int32_t> budgets =
      resolve_candidates(table, static_cast<int64_t>(path_logprobs.size()), options);
  const std::vector<double> tokens =
      cumulative_tokens(path_logprobs, budgets.back(), options.calibration);

  BudgetChoice choice;
  bool first = true;
  for (const int32_t b : budgets) {
    BudgetPoint p;
    p.budget = b;
    p.expected_tokens = tokens[b];
    p.verify_us = cost.layers * interpolate(table, b + 1, prefix_len);
    p.round_us = cost.fixed_us + cost.per_node_us * (b + 1) + p.verify_us;
    p.tokens_per_s = p.expected_tokens / p.round_us * 1e6;
    // Strictly better only: budgets increase, so a tie keeps the smaller tree.
    if (first || p.tokens_per_s > choice.best.tokens_per_s) choice.best = p;
    first = false;
    if (options.report_all) choice.all.push_back(p);
  }
  return choice;
}

BudgetChoice pick_budget(const CostTable& table, const tree::DDTree& tree, int64_t prefix_len,
                         const RoundCost& cost, const PickOptions& options) {
  TREEMLA_CHECK(tree.size() >= 1 && tree.scores.size() == tree.parents.size(),
                "tree.scores has " << tree.scores.size() << " entries; must be tree.size() = "
                                   << tree.size() << " >= 1 (the root's score first)");
  return pick_budget(table, std::span(tree.scores).subspan(1), prefix_len, cost, options);
}

tree::DDTree truncate_ddtree(const tree::DDTree& tree, int32_t budget) {
  const size_t n = tree.parents.size();
  TREEMLA_CHECK(tree.tokens.size() == n && tree.depths.size() == n && tree.ranks.size() == n &&
                    tree.scores.size() == n,
                "tree: parents, tokens, depths, ranks and scores have "
                    << n << ", " << tree.tokens.size() << ", " << tree.depths.size() << ", "
                    << tree.ranks.size() << ", " << tree.scores.size()
                    << " entries; all must have tree.size()");
  TREEMLA_CHECK(budget >= 0 && static_cast<size_t>(budget) < n,
                "budget = " << budget << " must be in 0.." << static_cast<int64_t>(n) - 1
                            << " (tree.size() - 1)");
  const auto keep = static_cast<std::ptrdiff_t>(budget) + 1;
  tree::DDTree out;
  out.parents.assign(tree.parents.begin(), tree.parents.begin() + keep);
  out.tokens.assign(tree.tokens.begin(), tree.tokens.begin() + keep);
  out.depths.assign(tree.depths.begin(), tree.depths.begin() + keep);
  out.ranks.assign(tree.ranks.begin(), tree.ranks.begin() + keep);
  out.scores.assign(tree.scores.begin(), tree.scores.begin() + keep);
  return out;
}

}  // namespace treemla
