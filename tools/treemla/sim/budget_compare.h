// treemla_sim: the budget comparison behind `treemla simulate --budget-compare` (public header).
//
// For each prompt length, one request at a time runs `rounds` rounds of the synthetic drafter
// and target (synthetic.h) under every policy: fixed budgets and the picker (auto). No KV pool,
// no attention: each round is costed from the cost table (budget_model.h), which is what makes
// prompts up to the table's largest L cheap on the CPU. Every policy sees the same drafts and
// the same target draws (the same random stream, restarted for each prompt length), so their
// differences come from the budgets alone. The prefix stays at the prompt length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/budget_model.h"

namespace treemla::tool {

struct BudgetCompareConfig {
  uint32_t seed = 1;
  int64_t rounds = 400;  // per prompt length
  int depth = 15;        // GLM-5's drafter block of 16, minus the bonus position
  int top_k = 8;
  double draft_logit_range = 4.0;
  std::string target = "drafter";
  double accept_prob = 0.7;  // target "children" only
  std::vector<int64_t> prompts = {4096, 8192, 16384, 32768, 65536, 131072, 185000};
  std::vector<int32_t> budgets = {15, 63, 255,
                                  1023};  // the fixed budgets shown (n = 16, 64, 256, 1024)
  CostModelConfig cost_model;
};

// Bounds of the comparison's options.
inline constexpr int64_t kMaxCompareRounds = 1000000;
inline constexpr size_t kMaxComparePrompts = 64;

// Throws std::invalid_argument naming the option (--rounds, --depth, --topk, --draft-logit-range,
// --target, --accept-prob, --compare-prompts, --compare-budgets, the cost model's options) and
// the bound, the table's ranges included. The table must be set and valid.
void validate_compare_config(const BudgetCompareConfig& c);

// One policy at one prompt length.
struct PolicyResult {
  int32_t budget = -1;  // the fixed budget; -1 for auto
  CostTally tally;
  double calibration = 1;  // auto: the online calibration at the end
};

struct PromptResult {
  int64_t prompt = 0;
  PolicyResult automatic;
  // Every fixed budget run: the configured ones and the table's grid budgets that fit the tree,
  // in increasing order (the best fixed budget is searched among all of them).
  std::vector<PolicyResult> fixed;
  const PolicyResult& fixed_budget(int32_t budget) const;  // throws if it was not run
  // The best of the configured budgets, and of every budget run.
  const PolicyResult& best_listed(const std::vector<int32_t>& listed) const;
  const PolicyResult& best_any() const;
};

struct BudgetCompareReport {
  std::vector<PromptResult> prompts;
  // The one fixed budget for all prompt lengths with the highest geometric mean of tokens/s.
  int32_t best_single_budget = -1;
  double wall_seconds = 0;
};

BudgetCompareReport compare_budgets(const BudgetCompareConfig& config);

}  // namespace treemla::tool
