// treemla_sim: the cost model and the budget picker (include/treemla/budget.h) as the serving
// loop (`simulate --budget auto`) and the budget comparison (`simulate --budget-compare`) use
// them. docs/budget.md gives the model, docs/tool.md the options.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>

#include "treemla/budget.h"
#include "treemla/tree.h"

namespace treemla::tool {

// The round cost outside verify attention, by default (docs/budget.md says where they come from):
// GLM-5's 78 layers, 10 ms per round, 10 us per tree node.
inline constexpr int32_t kDefaultLayers = 78;
inline constexpr double kDefaultRoundFixedUs = 10000.0;
inline constexpr double kDefaultRoundPerNodeUs = 10.0;

// Bounds of the cost model's options (validate_cost_model checks them, --help shows them).
inline constexpr int32_t kMaxLayers = 1000;
inline constexpr double kMaxRoundFixedUs = 1e9;  // 1000 s
inline constexpr double kMaxRoundPerNodeUs = 1e6;
inline constexpr int kMaxCalibrationWindow = 1000000;

struct CostModelConfig {
  CostTable table;  // validated by the caller; an empty one (no n) turns the cost model off
  RoundCost cost{kDefaultLayers, kDefaultRoundFixedUs, kDefaultRoundPerNodeUs};
  bool every_budget =
      false;  // the picker considers every B in the table's range, not only its grid
  // Request-rounds the online calibration looks back over; 0 (the default): calibration 1. In the
  // tool's simulations calibration costs tokens/s (docs/budget.md, "Calibration, measured").
  int calibration_window = 0;

  bool on() const { return !table.n.empty(); }
};

// Throws std::invalid_argument naming the option whose value is out of bounds: --layers,
// --round-fixed-us, --round-per-node-us, --calibration-window. The table is not checked here.
void validate_cost_model(const CostModelConfig& model);

// Throws std::invalid_argument naming --heads or --page-size when the run's differs from the
// table's: a table describes one configuration (docs/budget.md, assumption 6).
void check_table_configuration(const CostTable& table, int heads, int page_size);

// The prefix length a request-round is costed at: the table's first L for shorter prefixes (an
// overestimate: verify is launch-bound there), the prefix itself otherwise. A prefix past the
// table's last L is an error of the caller (the loop's options are checked against it up front).
int64_t costed_prefix(const CostTable& table, int64_t prefix);

// The budget the picker chooses for one request-round: `full` is the request's tree built at the
// largest budget considered, prefix its committed length.
int32_t pick_auto_budget(const CostModelConfig& model, const tree::DDTree& full, int64_t prefix,
                         double calibration);

// The picker's calibration, measured online: (accepted + 1) / (predicted + 1) draft tokens over
// the last `window` request-rounds, where predicted is E[tokens](B) - 1 at calibration 1 for the
// budget each round used. The + 1 on both sides keeps the first rounds near 1 and the value
// above 0. A round with B = 0 predicts and accepts no draft token: it only pushes older rounds
// out of the window, so a calibration low enough to pick B = 0 is forgotten after `window` rounds.
class OnlineCalibration {
 public:
  explicit OnlineCalibration(int window) : window_(window) {}
  double value() const { return window_ > 0 ? (accepted_ + 1.0) / (predicted_ + 1.0) : 1.0; }
  void add(double accepted, double predicted);

 private:
  struct Entry {
    double accepted, predicted;
  };
  int window_;
  std::deque<Entry> recent_;
  double accepted_ = 0, predicted_ = 0;
};

// Request-rounds costed by the model, each as if its request ran alone (the table is timed for
// one request), and the budgets they verified.
struct CostTally {
  int64_t request_rounds = 0, tokens = 0;
  int64_t prefix_clamped = 0;          // request-rounds costed at the table's first L
  double round_us = 0;                 // sum of round_us(B) = fixed + per node x (1 + B) + verify
  double verify_us = 0;                // sum of its verify part, layers x C_v(1 + B, L)
  double predicted_tokens = 0;         // sum of E[tokens](B) at calibration 1 (the bonus included)
  std::map<int32_t, int64_t> budgets;  // B verified -> request-rounds

  // One request-round: `verified` is the tree verified (scores in pop order), `accepted` the
  // tokens it committed (acceptance length, the bonus included).
  void add(const CostModelConfig& model, const tree::DDTree& verified, int64_t prefix,
           int64_t accepted);

  double tokens_per_round() const {
    return request_rounds ? double(tokens) / double(request_rounds) : 0.0;
  }
  double mean_round_us() const { return request_rounds ? round_us / double(request_rounds) : 0.0; }
  double tokens_per_s() const { return round_us > 0 ? double(tokens) / round_us * 1e6 : 0.0; }
  double mean_budget() const;
};

}  // namespace treemla::tool
