// treemla_sim: the synthetic drafter and targets of the serving loop (simulation.h) and of the
// budget comparison (budget_compare.h), and the random stream they draw from.
//
// The drafter: per depth, top_k distinct tokens and a random softmax over them plus one
// "everything else" bucket: logits uniform in [0, logit_range], sorted, against a logit of 1 for
// the rest of the vocabulary. A larger range makes a more confident drafter.
//
// Two targets (what the target model chooses at each verified node):
// - children: at a node with children, with probability accept_prob one of them, weighted by the
//   drafter's probabilities; otherwise a token no child carries. The chance of accepting a node
//   depends on the tree around it (a lone child is taken with probability accept_prob).
// - drafter: the target's token after depth d is drawn from the drafter's distribution at depth
//   d + 1 (a token outside the top-K with the rest bucket's probability), one draw per depth
//   shared by every node of that depth, independently of the tree. A node is then accepted with
//   probability exp(its path log-prob): exactly the picker's model (docs/budget.md).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "treemla/tree.h"

namespace treemla::tool {

constexpr int32_t kVocab = 32000;

// Integers and uniforms from raw mt19937 outputs, not the standard distributions, so that a seed
// means the same run on every standard library.
class Rng {
 public:
  explicit Rng(uint32_t seed) : eng_(seed) {}
  // Inclusive [lo, hi] from 64 raw bits; the modulo bias is far below anything a run can see.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t x = (uint64_t{eng_()} << 32) | eng_();
    return lo + static_cast<int64_t>(x % (static_cast<uint64_t>(hi - lo) + 1));
  }
  double uniform01() { return (eng_() >> 8) * (1.0 / 16777216.0); }  // [0, 1), 24 bits
  float symmetric() { return static_cast<float>(uniform01() * 2.0 - 1.0); }
  uint32_t bits() { return static_cast<uint32_t>(eng_()); }

 private:
  std::mt19937 eng_;
};

// One round's drafter output for one request: [depth, top_k] tokens and log-probabilities.
struct Draft {
  int depth = 0, top_k = 0;
  std::vector<int32_t> tokens;   // [depth, top_k], distinct within a depth
  std::vector<float> log_probs;  // [depth, top_k], negative, non-increasing within a depth
  tree::DraftTopK view() const { return {depth, top_k, tokens, log_probs}; }
  // Log-probability of the node at depth d >= 1 with rank r in its depth's top-K.
  float log_prob(int d, int r) const { return log_probs[static_cast<size_t>(d - 1) * top_k + r]; }
};

Draft draw_draft(Rng& rng, int depth, int top_k, double logit_range);

// Nodes of a DDTree built with `budget` from a drafter of depth x top_k: 1 + budget, unless the
// budget exceeds all K + K^2 + .. + K^D paths.
int32_t ddtree_nodes(int depth, int top_k, int budget);

enum class Target { kChildren, kDrafter };
Target parse_target(
    const std::string& name);  // "children" or "drafter"; throws std::invalid_argument
const char* target_name(Target t);

// The target's token at every node of `tree` (drawn from `draft`): tree::accept_path's
// target_tokens. accept_prob is used by Target::kChildren only.
std::vector<int32_t> draw_target(Rng& rng, Target kind, const Draft& draft,
                                 const tree::DDTree& tree, double accept_prob);

}  // namespace treemla::tool
