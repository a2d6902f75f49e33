// treemla_sim: the synthetic drafter and targets (synthetic.h says what they model).
#include "sim/synthetic.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

namespace treemla::tool {

int32_t ddtree_nodes(int depth, int top_k, int budget) {
  int64_t paths = 0, level = 1;
  for (int d = 1; d <= depth && paths < budget; ++d) {
    level =
        std::min<int64_t>(level * top_k, int64_t{budget} + 1);  // only "reaches the budget" matters
    paths += level;
  }
  return static_cast<int32_t>(1 + std::min<int64_t>(paths, budget));
}

Draft draw_draft(Rng& rng, int depth, int top_k, double logit_range) {
  Draft w;
  w.depth = depth;
  w.top_k = top_k;
  w.tokens.resize(static_cast<size_t>(depth) * top_k);
  w.log_probs.assign(w.tokens.size(), 0.f);
  std::vector<double> logits(static_cast<size_t>(top_k));
  for (int d = 0; d < depth; ++d) {
    int32_t* tok = w.tokens.data() + static_cast<size_t>(d) * top_k;
    for (int k = 0; k < top_k; ++k) {
      do {
        tok[k] = static_cast<int32_t>(rng.uniform_int(0, kVocab - 1));
      } while (std::find(tok, tok + k, tok[k]) != tok + k);
    }
    for (double& l : logits) l = logit_range * rng.uniform01();
    std::sort(logits.begin(), logits.end(), std::greater<>());
    double z = std::exp(1.0);  // the rest of the vocabulary
    for (double l : logits) z += std::exp(l);
    for (int k = 0; k < top_k; ++k)
      w.log_probs[static_cast<size_t>(d) * top_k + k] = static_cast<float>(logits[k] - std::log(z));
  }
  return w;
}

Target parse_target(const std::string& name) {
  if (name == "children") return Target::kChildren;
  if (name == "drafter") return Target::kDrafter;
  throw std::invalid_argument("--target: '" + name + "' must be children or drafter");
}

const char* target_name(Target t) { return t == Target::kChildren ? "children" : "drafter"; }

namespace {

std::vector<int32_t> children_target(Rng& rng, const Draft& draft, const tree::DDTree& t,
                                     double accept_prob) {
  const int n = t.size();
  std::vector<std::vector<int32_t>> children(static_cast<size_t>(n));
  for (int i = 1; i < n; ++i) children[static_cast<size_t>(t.parents[i])].push_back(i);
  auto p = [&](int32_t c) { return std::exp(draft.log_prob(t.depths[c], t.ranks[c])); };
  std::vector<int32_t> target(static_cast<size_t>(n));
  for (int u = 0; u < n; ++u) {
    const auto& ch = children[static_cast<size_t>(u)];
    if (!ch.empty() && rng.uniform01() < accept_prob) {
      double total = 0;
      for (int32_t c : ch) total += p(c);
      double x = rng.uniform01() * total;
      int32_t pick = ch.back();
      for (int32_t c : ch) {
        x -= p(c);
        if (x < 0) {
          pick = c;
          break;
        }
      }
      target[static_cast<size_t>(u)] = t.tokens[static_cast<size_t>(pick)];
    } else {
      int32_t tok;
      do {
        tok = static_cast<int32_t>(rng.uniform_int(0, kVocab - 1));
      } while (std::any_of(ch.begin(), ch.end(),
                           [&](int32_t c) { return t.tokens[static_cast<size_t>(c)] == tok; }));
      target[static_cast<size_t>(u)] = tok;
    }
  }
  return target;
}

// after[d]: the target's token after a node at depth d (d = 0 .. depth; after the deepest
// depth no node has children, so any token).
std::vector<int32_t> drafter_target(Rng& rng, const Draft& draft, const tree::DDTree& t) {
  const int D = draft.depth, K = draft.top_k;
  std::vector<int32_t> after(static_cast<size_t>(D) + 1);
  for (int d = 0; d <= D; ++d) {
    const double x = rng.uniform01();
    const int32_t other = static_cast<int32_t>(rng.uniform_int(0, kVocab - 1));
    int32_t tok = -1;
    if (d < D) {
      const int32_t* top = draft.tokens.data() + static_cast<size_t>(d) * K;
      double cum = 0;
      for (int k = 0; k < K && tok < 0; ++k) {
        cum += std::exp(double(draft.log_prob(d + 1, k)));
        if (x < cum) tok = top[k];
      }
      // The rest bucket: a token outside this depth's top-K (the first free id from `other`).
      for (int32_t c = other; tok < 0; c = (c + 1) % kVocab) {
        if (std::find(top, top + K, c) == top + K) tok = c;
      }
    } else {
      tok = other;
    }
    after[static_cast<size_t>(d)] = tok;
  }
  std::vector<int32_t> target(static_cast<size_t>(t.size()));
  for (int u = 0; u < t.size(); ++u)
    target[static_cast<size_t>(u)] = after[static_cast<size_t>(t.depths[u])];
  return target;
}

}  // namespace

std::vector<int32_t> draw_target(Rng& rng, Target kind, const Draft& draft,
                                 const tree::DDTree& tree, double accept_prob) {
  return kind == Target::kChildren ? children_target(rng, draft, tree, accept_prob)
                                   : drafter_target(rng, draft, tree);
}

}  // namespace treemla::tool
