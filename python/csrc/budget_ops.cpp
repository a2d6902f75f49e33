// The DDTree budget picker (include/treemla/budget.h) for Python: a cost table given as plain
// Python values (treemla.budget.load_cost_table reads the JSON), the drafter's path
// log-probabilities, the prefix length and the round cost outside verify attention. Host only;
// the library's checks surface as ValueError through guarded().
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common.h"
#include "ops.h"
#include "treemla/budget.h"

namespace treemla::binding {

namespace {

pybind11::dict point_dict(const BudgetPoint& p) {
  pybind11::dict d;
  d["budget"] = p.budget;
  d["expected_tokens"] = p.expected_tokens;
  d["verify_us"] = p.verify_us;
  d["round_us"] = p.round_us;
  d["tokens_per_s"] = p.tokens_per_s;
  return d;
}

}  // namespace

void define_budget_python(pybind11::module& m) {
  m.def("pick_budget",
        [](const std::string& gpu, const std::string& date, const std::string& commit,
           int32_t heads, int32_t page_size, const std::vector<int32_t>& n,
           const std::vector<int64_t>& L, const std::vector<std::vector<double>>& us,
           const std::vector<double>& path_logprobs, int64_t prefix_len, int32_t layers,
           double fixed_us, double per_node_us, double calibration,
           const std::vector<int32_t>& candidates, bool every_budget, bool report_all) {
          return guarded([&] {
            CostTable table{gpu, date, commit, heads, page_size, n, L, us};
            const RoundCost cost{layers, fixed_us, per_node_us};
            PickOptions opt;
            opt.calibration = calibration;
            opt.candidates = candidates;
            opt.every_budget = every_budget;
            opt.report_all = report_all;
            const BudgetChoice c = pick_budget(table, path_logprobs, prefix_len, cost, opt);
            pybind11::dict out = point_dict(c.best);
            pybind11::list all;
            for (const BudgetPoint& p : c.all) all.append(point_dict(p));
            out["all"] = all;
            return out;
          });
        });
}

}  // namespace treemla::binding
