// treemla simulate: the cost model's options and output (simulate_budget.h).
#include "simulate_budget.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "cli.h"

namespace treemla::tool {

namespace {

using json = nlohmann::ordered_json;

CLI::Validator budget_value() {
  const std::string bound =
      fmt::format("auto or an integer in [{}, {}]", limits::kBudget.lo, limits::kBudget.hi);
  return CLI::Validator(
      [bound](std::string& s) -> std::string {
        int64_t x = 0;
        if (s == "auto" ||
            (cli::parse_integer(s, x) && x >= limits::kBudget.lo && x <= limits::kBudget.hi))
          return {};
        return "'" + s + "' must be " + bound;
      },
      bound);
}

// Options of the serving loop that a comparison does not use, and the reverse.
constexpr const char* kLoopOnly[] = {"--budget",
                                     "--device",
                                     "--num-pages",
                                     "--max-requests",
                                     "--prompt-min",
                                     "--prompt-max",
                                     "--gen-min",
                                     "--gen-max",
                                     "--policy",
                                     "--defrag-threshold",
                                     "--defrag-max-moves",
                                     "--check-every",
                                     "--check-max-context",
                                     "--progress-every",
                                     "--frag-report",
                                     "--frag-reps"};
constexpr const char* kCompareOnly[] = {"--compare-prompts", "--compare-budgets"};
constexpr const char* kModelOnly[] = {"--layers", "--round-fixed-us", "--round-per-node-us"};
constexpr const char* kPickerOnly[] = {"--calibration-window", "--budget-candidates"};

std::string describe(const CostTableFile& f) {
  const CostTable& t = f.table;
  std::string s = fmt::format("{}, {}, commit {}, H={}, page size {}", t.gpu, t.date, t.commit,
                              t.heads, t.page_size);
  if (!f.family.empty()) s += ", family " + f.family;
  if (!f.tile.empty()) s += ", tile " + f.tile;
  return s;
}

std::vector<int32_t> budgets_of(const CostTable& t) {
  std::vector<int32_t> b;
  for (int32_t n : t.n) b.push_back(n - 1);
  return b;
}

std::string candidates_text(const CostModelConfig& m) {
  return m.every_budget
             ? fmt::format("every budget in [{}, {}]", m.table.min_budget(), m.table.max_budget())
             : fmt::format("the table's budgets {{{}}}", fmt::join(budgets_of(m.table), ","));
}

std::string calibration_text(const CostModelConfig& m) {
  return m.calibration_window > 0
             ? fmt::format("calibration measured over the last {} request-rounds",
                           m.calibration_window)
             : "no calibration (1)";
}

json table_json(const CostTableFile& f) {
  const CostTable& t = f.table;
  return {{"path", f.path},     {"gpu", t.gpu},     {"date", t.date},
          {"commit", t.commit}, {"heads", t.heads}, {"page_size", t.page_size},
          {"family", f.family}, {"tile", f.tile}};
}

json model_json(const BudgetArgs& b) {
  return {{"table", table_json(b.file)},
          {"layers", b.model.cost.layers},
          {"round_fixed_us", b.model.cost.fixed_us},
          {"round_per_node_us", b.model.cost.per_node_us},
          {"budget_candidates", b.candidates},
          {"calibration_window", b.model.calibration_window}};
}

json tally_json(const CostTally& t) {
  json budgets = json::object();
  for (const auto& [budget, count] : t.budgets) budgets[std::to_string(budget)] = count;
  return {{"request_rounds", t.request_rounds},
          {"tokens_per_round", t.tokens_per_round()},
          {"round_us", t.mean_round_us()},
          {"verify_us", t.request_rounds ? t.verify_us / double(t.request_rounds) : 0.0},
          {"tokens_per_s", t.tokens_per_s()},
          {"mean_budget", t.mean_budget()},
          {"budgets", budgets}};
}

double gain(const PolicyResult& a, const PolicyResult& fixed) {
  return a.tally.tokens_per_s() / fixed.tally.tokens_per_s() - 1.0;
}

}  // namespace

void add_budget_options(CLI::App& app, BudgetArgs& b, SimulationConfig& c) {
  const BudgetCompareConfig d;
  b.compare_prompts.assign(d.prompts.begin(), d.prompts.end());
  b.compare_budgets.assign(d.budgets.begin(), d.budgets.end());
  app.add_option("--budget", b.budget,
                 "DDTree budget: draft nodes per tree besides the root; auto = picked per request "
                 "and round from "
                 "the cost table (docs/budget.md)")
      ->check(budget_value())
      ->capture_default_str();
  app.add_flag(
      "--budget-compare", b.compare,
      "instead of the serving loop: auto beside fixed budgets, one request at a time, for each of "
      "--compare-prompts, costed from the cost table (no pool, no attention; seconds). Unless "
      "given: "
      "--rounds 400 per prompt length, --depth 15, --topk 8, --target drafter");
  app.add_option(
      "--cost-table", b.cost_table,
      "verify cost table, JSON (docs/budget.md); default: the H200 table installed with the tool "
      "(docs/tool.md). Needed by --budget auto and --budget-compare; given with a fixed --budget, "
      "the run is costed too");
  cli::add_integer(
      app, "--layers", b.model.cost.layers, 1, kMaxLayers,
      "cost model: verify attention layers per round (GLM-5: 78); the table's time is per layer");
  cli::add_number(
      app, "--round-fixed-us", b.model.cost.fixed_us, 0, kMaxRoundFixedUs,
      "cost model: microseconds per round outside verify attention (drafting, the target forward's "
      "size-independent part)");
  cli::add_number(
      app, "--round-per-node-us", b.model.cost.per_node_us, 0, kMaxRoundPerNodeUs,
      "cost model: microseconds per tree node (root included) outside verify attention");
  cli::add_integer(
      app, "--calibration-window", b.model.calibration_window, 0, kMaxCalibrationWindow,
      "picker: request-rounds over which its calibration (accepted / predicted draft tokens) is "
      "measured; 0 = calibration 1");
  cli::add_choice(
      app, "--budget-candidates", b.candidates, {"grid", "every"},
      "picker: the budgets it considers: grid (the table's own, measured) or every (each B in the "
      "table's range, C_v interpolated in n)");
  cli::add_choice(
      app, "--target", c.target, {"children", "drafter"},
      "synthetic target: children (takes one of a node's drafted children with --accept-prob) or "
      "drafter (draws each depth's token from the drafter's distribution); --budget auto and "
      "--budget-compare default to drafter");
  cli::add_number(app, "--draft-logit-range", c.draft_logit_range, 0, limits::kMaxDraftLogitRange,
                  "synthetic drafter: top-k logits uniform in [0, this] against 1 for the rest of "
                  "the vocabulary "
                  "(larger = more confident)");
  cli::add_list(app, "--compare-prompts", b.compare_prompts, cli::integer_in(1, kMaxPrefixLen),
                "--budget-compare: prompt lengths, within the table's L range");
  cli::add_list(app, "--compare-budgets", b.compare_budgets, cli::integer_in(0, tree::kMaxBudget),
                "--budget-compare: the fixed budgets shown");
}

void finish_budget_options(const CLI::App& app, BudgetArgs& b, SimulationConfig& c,
                           BudgetCompareConfig& cmp) {
  auto given = [&](const char* name) { return app.count(name) > 0; };
  auto refuse = [&](const auto& names, const std::string& why) {
    for (const char* name : names) {
      if (given(name)) throw std::invalid_argument(std::string(name) + " " + why);
    }
  };
  const bool budget_auto = b.budget == "auto";
  if (b.compare) {
    refuse(kLoopOnly, "does not apply to --budget-compare (it runs no serving loop)");
  } else {
    refuse(kCompareOnly, "applies to --budget-compare only");
  }
  if (!b.compare && !budget_auto) {
    refuse(kPickerOnly, "applies to --budget auto and --budget-compare only");
    if (!given("--cost-table")) {
      refuse(kModelOnly, "needs the cost model: --budget auto, --budget-compare or --cost-table");
      int64_t budget = 0;
      cli::parse_integer(b.budget, budget);  // checked by budget_value()
      c.budget = static_cast<int>(budget);
      return;
    }
  }
  b.model.every_budget = b.candidates == "every";
  b.file = b.cost_table.empty()
               ? read_cost_table_file(find_default_cost_table(), "the default cost table")
               : read_cost_table_file(b.cost_table, "--cost-table");
  b.model.table = b.file.table;
  const CostTable& t = b.model.table;
  if (!given("--heads")) c.heads = t.heads;
  if (!given("--page-size")) c.page_size = t.page_size;
  c.cost_model = b.model;
  if (!b.compare) {
    c.budget_auto = budget_auto;
    if (budget_auto && !given("--target"))
      c.target = "drafter";  // the picker's own model (docs/budget.md)
    int64_t budget = t.max_budget();
    if (budget_auto && budget < limits::kBudget.lo)
      throw std::invalid_argument(
          "--budget auto: the cost table's largest tree, n = 1, leaves no budget to pick");
    if (!budget_auto) cli::parse_integer(b.budget, budget);
    c.budget = static_cast<int>(budget);
    return;
  }
  check_table_configuration(t, c.heads, c.page_size);
  cmp.seed = c.seed;
  if (given("--rounds")) cmp.rounds = c.rounds;
  if (given("--depth")) cmp.depth = c.depth;
  if (given("--topk")) cmp.top_k = c.top_k;
  if (given("--target")) cmp.target = c.target;
  cmp.accept_prob = c.accept_prob;
  cmp.draft_logit_range = c.draft_logit_range;
  cmp.prompts = b.compare_prompts;
  cmp.budgets.assign(b.compare_budgets.begin(), b.compare_budgets.end());
  cmp.cost_model = b.model;
  validate_compare_config(cmp);
}

void print_cost_header(std::ostream& os, const BudgetArgs& b, const SimulationConfig& c) {
  if (!c.cost_model.on()) return;
  const RoundCost& k = c.cost_model.cost;
  fmt::print(os, "  cost table: {} ({})\n", b.file.path, describe(b.file));
  fmt::print(
      os,
      "  cost model: round = {} layers x C_v(1 + B, L) + {:g} us + {:g} us per tree node; each "
      "request-round costed alone\n",
      k.layers, k.fixed_us, k.per_node_us);
  if (c.budget_auto) {
    fmt::print(os,
               "  budget auto: per request and round among {}; trees built at {}, cut to B; {}\n",
               candidates_text(c.cost_model), c.budget, calibration_text(c.cost_model));
  }
}

void print_cost_summary(std::ostream& os, const SimulationConfig& c, const SimulationReport& r) {
  if (!c.cost_model.on()) return;
  const CostTally& t = r.cost;
  const double verify_ms = t.request_rounds ? t.verify_us / double(t.request_rounds) * 1e-3 : 0.0;
  fmt::print(os,
             "  cost model        {:.3f} tokens/round, {:.3f} ms/round (verify attention {:.3f}), "
             "{:.1f} tokens/s, "
             "each request-round alone",
             t.tokens_per_round(), t.mean_round_us() * 1e-3, verify_ms, t.tokens_per_s());
  if (t.prefix_clamped > 0)
    fmt::print(os, "; {} prefixes below L = {} costed there", t.prefix_clamped,
               c.cost_model.table.L.front());
  fmt::print(os, "\n");
  std::string used;
  for (const auto& [budget, count] : t.budgets)
    used += fmt::format("{}{}:{}", used.empty() ? "" : " ", budget, count);
  fmt::print(os,
             "  budgets           {} (B:request-rounds), mean {:.1f}; predicted {:.3f} "
             "tokens/round at calibration 1",
             used, t.mean_budget(),
             t.request_rounds ? t.predicted_tokens / double(t.request_rounds) : 0.0);
  if (c.budget_auto) fmt::print(os, ", calibration at the end {:.3f}", r.calibration);
  fmt::print(os, "\n");
}

json cost_json(const BudgetArgs& b, const SimulationConfig& c, const SimulationReport& r) {
  if (!c.cost_model.on()) return nullptr;
  json doc = model_json(b);
  const CostTally& t = r.cost;
  doc.update(tally_json(t));
  doc["prefix_clamped"] = t.prefix_clamped;
  doc["predicted_tokens_per_round"] =
      t.request_rounds ? t.predicted_tokens / double(t.request_rounds) : 0.0;
  doc["calibration"] = c.budget_auto ? json(r.calibration) : json(nullptr);
  return doc;
}

int run_budget_compare(const BudgetArgs& b, const BudgetCompareConfig& cmp,
                       std::ofstream* json_file) {
  const RoundCost& k = cmp.cost_model.cost;
  std::ostream& os = std::cout;
  fmt::print(os,
             "treemla simulate --budget-compare: seed {}, {} rounds per prompt length, one request "
             "at a time\n",
             cmp.seed, cmp.rounds);
  fmt::print(os, "  cost table: {} ({})\n", b.file.path, describe(b.file));
  fmt::print(os,
             "  round cost: {} layers x C_v(1 + B, L) + {:g} us + {:g} us per tree node; the "
             "prefix stays at the "
             "prompt length\n",
             k.layers, k.fixed_us, k.per_node_us);
  fmt::print(os, "  drafter: depth {}, top-k {}, logits uniform in [0, {:g}]; target: {}",
             cmp.depth, cmp.top_k, cmp.draft_logit_range, cmp.target);
  if (cmp.target == "children") fmt::print(os, " (accept-prob {:g})", cmp.accept_prob);
  fmt::print(os, "\n  auto: per round among {}; {}\n\n", candidates_text(cmp.cost_model),
             calibration_text(cmp.cost_model));
  os << std::flush;

  const BudgetCompareReport rep = compare_budgets(cmp);
  fmt::print(os, "  {:>7} {:>7} {:>13} {:>9} {:>9} {:>8}\n", "prompt", "budget", "tokens/round",
             "ms/round", "tokens/s", "vs auto");
  for (const PromptResult& p : rep.prompts) {
    for (int32_t budget : cmp.budgets) {
      const PolicyResult& f = p.fixed_budget(budget);
      fmt::print(os, "  {:>7} {:>7} {:>13.3f} {:>9.3f} {:>9.1f} {:>+7.1f}%\n", p.prompt, budget,
                 f.tally.tokens_per_round(), f.tally.mean_round_us() * 1e-3, f.tally.tokens_per_s(),
                 100.0 * (f.tally.tokens_per_s() / p.automatic.tally.tokens_per_s() - 1.0));
    }
    const CostTally& a = p.automatic.tally;
    fmt::print(os, "  {:>7} {:>7} {:>13.3f} {:>9.3f} {:>9.1f}   mean B {:.1f}", p.prompt, "auto",
               a.tokens_per_round(), a.mean_round_us() * 1e-3, a.tokens_per_s(), a.mean_budget());
    if (cmp.cost_model.calibration_window > 0)
      fmt::print(os, ", calibration at the end {:.3f}", p.automatic.calibration);
    fmt::print(os, "\n");
  }
  fmt::print(os, "\n  gain of auto in tokens/s over\n");
  fmt::print(os, "  {:>7} {:>9} {:>22} {:>22} {:>22}\n", "prompt", "auto", "best listed budget",
             "best table budget", fmt::format("B={} at every prompt", rep.best_single_budget));
  json results = json::array();
  for (const PromptResult& p : rep.prompts) {
    const PolicyResult& listed = p.best_listed(cmp.budgets);
    const PolicyResult& any = p.best_any();
    const PolicyResult& single = p.fixed_budget(rep.best_single_budget);
    auto cell = [&](const PolicyResult& f) {
      return fmt::format("{:+.1f}% (B={})", 100 * gain(p.automatic, f), f.budget);
    };
    fmt::print(os, "  {:>7} {:>9.1f} {:>22} {:>22} {:>22}\n", p.prompt,
               p.automatic.tally.tokens_per_s(), cell(listed), cell(any),
               fmt::format("{:+.1f}%", 100 * gain(p.automatic, single)));
    json fixed = json::array();
    for (const PolicyResult& f : p.fixed) {
      json one = {{"budget", f.budget}};
      one.update(tally_json(f.tally));
      one.erase("budgets");
      one.erase("mean_budget");
      fixed.push_back(one);
    }
    json automatic = tally_json(p.automatic.tally);
    automatic["calibration"] = p.automatic.calibration;
    results.push_back(
        {{"prompt", p.prompt},
         {"auto", automatic},
         {"fixed", fixed},
         {"best_listed", {{"budget", listed.budget}, {"gain", gain(p.automatic, listed)}}},
         {"best_any", {{"budget", any.budget}, {"gain", gain(p.automatic, any)}}},
         {"single", {{"budget", single.budget}, {"gain", gain(p.automatic, single)}}}});
  }
  fmt::print(os,
             "  (best listed: the best of {}; best table budget: the best of every budget the "
             "table measures, "
             "known only after the fact; B={}: the one budget with the highest geometric mean of "
             "tokens/s over "
             "these prompts)\n",
             fmt::join(cmp.budgets, ","), rep.best_single_budget);
  fmt::print(os, "  {:.2f} s\n", rep.wall_seconds);
  if (json_file) {
    json doc;
    doc["mode"] = "budget-compare";
    doc["config"] = {{"seed", cmp.seed},
                     {"rounds", cmp.rounds},
                     {"depth", cmp.depth},
                     {"top_k", cmp.top_k},
                     {"target", cmp.target},
                     {"accept_prob", cmp.accept_prob},
                     {"draft_logit_range", cmp.draft_logit_range},
                     {"prompts", cmp.prompts},
                     {"budgets", cmp.budgets}};
    doc["cost_model"] = model_json(b);
    doc["results"] = results;
    doc["best_single_budget"] = rep.best_single_budget;
    doc["wall_seconds"] = rep.wall_seconds;
    *json_file << doc.dump(2) << "\n";
    json_file->close();
    if (!*json_file) {
      std::cerr << "treemla simulate: writing the --json file failed\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace treemla::tool
