// treemla simulate: the options and output of the cost model -- `--budget auto`, `--cost-table`
// and the budget comparison `--budget-compare` (docs/tool.md, docs/budget.md).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "cost_table_file.h"
#include "sim/budget_compare.h"
#include "sim/simulation.h"

namespace treemla::tool {

struct BudgetArgs {
  std::string budget = "15";        // --budget: an integer, or auto
  bool compare = false;             // --budget-compare
  std::string cost_table;           // --cost-table; empty: the default table, where one is needed
  std::string candidates = "grid";  // --budget-candidates: grid or every
  std::vector<int64_t> compare_prompts, compare_budgets;
  CostModelConfig model;  // the options; the table is set by finish_budget_options
  CostTableFile file;     // the table read, when the cost model is on
};

// --budget, --budget-compare, --cost-table, the cost model's options, --target,
// --draft-logit-range, --compare-prompts, --compare-budgets.
void add_budget_options(CLI::App& app, BudgetArgs& b, SimulationConfig& c);

// After parsing: reads the table where one is needed (--budget auto, --budget-compare, or
// --cost-table given), fills the config's budget and cost model, gives --heads and --page-size the
// table's values when they were not given, and sets the comparison's config (its own defaults
// for --rounds, --depth, --topk and --target when they were not given). Throws
// std::invalid_argument naming the option: a table that cannot be read or found, a cost option
// without a cost model, an option that does not apply to the mode.
void finish_budget_options(const CLI::App& app, BudgetArgs& b, SimulationConfig& c,
                           BudgetCompareConfig& compare);

// The serving loop's lines about the cost model (none when it is off), and its JSON (null when
// off).
void print_cost_header(std::ostream& os, const BudgetArgs& b, const SimulationConfig& c);
void print_cost_summary(std::ostream& os, const SimulationConfig& c, const SimulationReport& r);
nlohmann::ordered_json cost_json(const BudgetArgs& b, const SimulationConfig& c,
                                 const SimulationReport& r);

// Runs the comparison, prints it, writes its JSON to `json` (if not null); the exit code.
int run_budget_compare(const BudgetArgs& b, const BudgetCompareConfig& compare,
                       std::ofstream* json);

}  // namespace treemla::tool
