// treemla_sim: the cost model and the budget picker as the tool uses them (budget_model.h).
#include "sim/budget_model.h"

#include <algorithm>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>

namespace treemla::tool {

namespace {

std::span<const double> draft_scores(const tree::DDTree& t) {
  return std::span(t.scores).subspan(1);
}

}  // namespace

void validate_cost_model(const CostModelConfig& m) {
  auto bad = [](const char* name, double value, double hi, const char* what) {
    std::ostringstream os;
    os << "--" << name << ": '" << value << "' must be " << what << " in [0, " << hi << "]";
    throw std::invalid_argument(os.str());
  };
  if (m.cost.layers < 1 || m.cost.layers > kMaxLayers) {
    throw std::invalid_argument("--layers: '" + std::to_string(m.cost.layers) +
                                "' must be an integer in [1, " + std::to_string(kMaxLayers) + "]");
  }
  if (!(m.cost.fixed_us >= 0 && m.cost.fixed_us <= kMaxRoundFixedUs))
    bad("round-fixed-us", m.cost.fixed_us, kMaxRoundFixedUs, "a number");
  if (!(m.cost.per_node_us >= 0 && m.cost.per_node_us <= kMaxRoundPerNodeUs))
    bad("round-per-node-us", m.cost.per_node_us, kMaxRoundPerNodeUs, "a number");
  if (m.calibration_window < 0 || m.calibration_window > kMaxCalibrationWindow)
    bad("calibration-window", m.calibration_window, kMaxCalibrationWindow, "an integer");
}

void check_table_configuration(const CostTable& t, int heads, int page_size) {
  auto mismatch = [](const char* name, int value, const char* what, int want) {
    throw std::invalid_argument("--" + std::string(name) + ": '" + std::to_string(value) +
                                "' must be the cost table's " + what + ", " + std::to_string(want) +
                                " (a table describes one configuration)");
  };
  if (heads != t.heads) mismatch("heads", heads, "heads", t.heads);
  if (page_size != t.page_size) mismatch("page-size", page_size, "page size", t.page_size);
}

int64_t costed_prefix(const CostTable& table, int64_t prefix) {
  return std::max(prefix, table.L.front());
}

int32_t pick_auto_budget(const CostModelConfig& model, const tree::DDTree& full, int64_t prefix,
                         double calibration) {
  PickOptions options;
  options.calibration = calibration;
  options.every_budget = model.every_budget;
  return pick_budget(model.table, full, costed_prefix(model.table, prefix), model.cost, options)
      .best.budget;
}

void OnlineCalibration::add(double accepted, double predicted) {
  if (window_ <= 0) return;
  recent_.push_back({accepted, predicted});
  accepted_ += accepted;
  predicted_ += predicted;
  if (recent_.size() > static_cast<size_t>(window_)) {
    accepted_ -= recent_.front().accepted;
    predicted_ -= recent_.front().predicted;
    recent_.pop_front();
  }
}

void CostTally::add(const CostModelConfig& model, const tree::DDTree& verified, int64_t prefix,
                    int64_t accepted) {
  const int32_t budget = verified.size() - 1;
  const int64_t L = costed_prefix(model.table, prefix);
  prefix_clamped += L != prefix;
  round_us += round_cost_us(model.table, budget, L, model.cost);
  verify_us += model.cost.layers * verify_cost_us(model.table, budget + 1, L);
  predicted_tokens += expected_tokens(draft_scores(verified), budget);
  tokens += accepted;
  ++request_rounds;
  ++budgets[budget];
}

double CostTally::mean_budget() const {
  double sum = 0;
  for (const auto& [b, count] : budgets) sum += double(b) * double(count);
  return request_rounds ? sum / double(request_rounds) : 0.0;
}

}  // namespace treemla::tool
