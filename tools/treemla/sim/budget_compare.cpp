// treemla_sim: the budget comparison (budget_compare.h says what it runs).
#include "sim/budget_compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>

#include "sim/simulation.h"
#include "sim/synthetic.h"
#include "treemla/budget.h"
#include "treemla/error.h"
#include "treemla/tree.h"

namespace treemla::tool {

namespace {

std::string str(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

[[noreturn]] void bad(const std::string& name, const std::string& value, const std::string& want) {
  throw std::invalid_argument("--" + name + ": '" + value + "' must be " + want);
}

// Nodes of the comparison's full tree (built at the table's largest budget).
int32_t full_tree_nodes(const BudgetCompareConfig& c) {
  return ddtree_nodes(c.depth, c.top_k, c.cost_model.table.max_budget());
}

// The fixed budgets run: the configured ones and the table's grid budgets the tree can hold.
std::vector<int32_t> fixed_budgets(const BudgetCompareConfig& c) {
  std::vector<int32_t> b = c.budgets;
  const int32_t most = full_tree_nodes(c) - 1;
  for (int32_t n : c.cost_model.table.n) {
    if (n - 1 <= most) b.push_back(n - 1);
  }
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

}  // namespace

void validate_compare_config(const BudgetCompareConfig& c) {
  auto range = [](const char* name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      bad(name, std::to_string(v),
          "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  range("rounds", c.rounds, 1, kMaxCompareRounds);
  range("depth", c.depth, limits::kDepth.lo, limits::kDepth.hi);
  range("topk", c.top_k, limits::kTopK.lo, limits::kTopK.hi);
  if (!(c.draft_logit_range >= 0.0 && c.draft_logit_range <= limits::kMaxDraftLogitRange))
    bad("draft-logit-range", str(c.draft_logit_range),
        "a number in [0, " + str(limits::kMaxDraftLogitRange) + "]");
  parse_target(c.target);
  if (!(c.accept_prob >= 0.0 && c.accept_prob <= 1.0))
    bad("accept-prob", str(c.accept_prob), "a number in [0, 1]");
  validate_cost_model(c.cost_model);
  if (!c.cost_model.on())
    throw std::invalid_argument("--budget-compare needs a cost table (--cost-table)");
  const CostTable& t = c.cost_model.table;
  if (c.prompts.empty() || c.prompts.size() > kMaxComparePrompts)
    bad("compare-prompts", std::to_string(c.prompts.size()) + " lengths",
        "1 to " + std::to_string(kMaxComparePrompts) + " lengths");
  for (int64_t p : c.prompts) {
    if (p < t.L.front() || p > t.L.back())
      bad("compare-prompts", std::to_string(p),
          "within the cost table's L range [" + std::to_string(t.L.front()) + ", " +
              std::to_string(t.L.back()) + "]");
  }
  const int32_t most = full_tree_nodes(c) - 1;  // draft nodes the drafter's paths allow
  if (most < t.min_budget()) {
    bad("depth", std::to_string(c.depth),
        "large enough (with --topk " + std::to_string(c.top_k) +
            ") for trees of the cost table's smallest budget, " + std::to_string(t.min_budget()));
  }
  if (c.budgets.empty()) bad("compare-budgets", "", "at least one budget");
  for (int32_t b : c.budgets) {
    const int32_t hi = std::min(t.max_budget(), most);
    if (b < t.min_budget() || b > hi) {
      bad("compare-budgets", std::to_string(b),
          "in [" + std::to_string(t.min_budget()) + ", " + std::to_string(hi) +
              "] (the cost table's budgets, and the paths of --depth " + std::to_string(c.depth) +
              " x --topk " + std::to_string(c.top_k) + ")");
    }
  }
}

const PolicyResult& PromptResult::fixed_budget(int32_t budget) const {
  for (const PolicyResult& p : fixed) {
    if (p.budget == budget) return p;
  }
  throw std::invalid_argument("budget " + std::to_string(budget) + " was not run");
}

const PolicyResult& PromptResult::best_listed(const std::vector<int32_t>& listed) const {
  const PolicyResult* best = nullptr;
  for (const PolicyResult& p : fixed) {
    if (std::find(listed.begin(), listed.end(), p.budget) == listed.end()) continue;
    if (!best || p.tally.tokens_per_s() > best->tally.tokens_per_s()) best = &p;
  }
  if (!best) throw std::invalid_argument("none of the listed budgets was run");
  return *best;
}

const PolicyResult& PromptResult::best_any() const {
  const PolicyResult* best = &fixed.front();
  for (const PolicyResult& p : fixed) {
    if (p.tally.tokens_per_s() > best->tally.tokens_per_s()) best = &p;
  }
  return *best;
}

BudgetCompareReport compare_budgets(const BudgetCompareConfig& c) {
  validate_compare_config(c);
  const auto t0 = std::chrono::steady_clock::now();
  const Target target = parse_target(c.target);
  const std::vector<int32_t> budgets = fixed_budgets(c);
  const int32_t build_budget = c.cost_model.table.max_budget();
  BudgetCompareReport report;
  for (int64_t prompt : c.prompts) {
    PromptResult pr;
    pr.prompt = prompt;
    for (int32_t b : budgets) pr.fixed.push_back({b, {}, 1.0});
    Rng rng(c.seed);  // the same drafts and target draws at every prompt length
    OnlineCalibration calibration(c.cost_model.calibration_window);
    for (int64_t r = 0; r < c.rounds; ++r) {
      const Draft draft = draw_draft(rng, c.depth, c.top_k, c.draft_logit_range);
      const auto bonus = static_cast<int32_t>(rng.uniform_int(0, kVocab - 1));
      const tree::DDTree full = tree::build_ddtree(draft.view(), bonus, build_budget, c.depth);
      const uint32_t target_seed = rng.bits();
      // Verifies the first 1 + b nodes; every policy draws the target from the same seed.
      auto verify = [&](PolicyResult& p, int32_t b) {
        const tree::DDTree t = b + 1 < full.size() ? truncate_ddtree(full, b) : full;
        Rng target_rng(target_seed);
        const std::vector<int32_t> want = draw_target(target_rng, target, draft, t, c.accept_prob);
        const int32_t accepted = tree::accept_path(t.parents, t.tokens, want).length;
        p.tally.add(c.cost_model, t, prompt, accepted);
        return accepted;
      };
      for (PolicyResult& p : pr.fixed) verify(p, p.budget);
      const int32_t b = pick_auto_budget(c.cost_model, full, prompt, calibration.value());
      const int32_t accepted = verify(pr.automatic, b);
      calibration.add(double(accepted - 1),
                      expected_tokens(std::span(full.scores).subspan(1), b) - 1.0);
    }
    pr.automatic.calibration = calibration.value();
    report.prompts.push_back(std::move(pr));
  }
  double best_score = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < budgets.size(); ++i) {
    double log_sum = 0;
    for (const PromptResult& pr : report.prompts)
      log_sum += std::log(std::max(pr.fixed[i].tally.tokens_per_s(), 1e-300));
    if (log_sum > best_score) {
      best_score = log_sum;
      report.best_single_budget = budgets[i];
    }
  }
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace treemla::tool
