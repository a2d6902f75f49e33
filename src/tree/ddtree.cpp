// DDTree: best-first selection of the `budget` most probable draft paths under a max-heap, from
// the drafter's per-depth top-K marginals.
#include <algorithm>
#include <cmath>

#include "treemla/error.h"
#include "treemla/tree.h"

namespace treemla::tree {

namespace {

void validate_draft(const DraftTopK& draft, int32_t bonus_token, int budget, int max_depth) {
  TREEMLA_CHECK(max_depth >= 1 && max_depth <= kMaxBudget,
                "max_depth = " << max_depth << " must be in 1.." << kMaxBudget);
  TREEMLA_CHECK(budget >= 1 && budget <= kMaxBudget,
                "budget = " << budget << " must be in 1.." << kMaxBudget << " (kMaxBudget)");
  TREEMLA_CHECK(
      draft.num_depths >= 1 && draft.num_depths <= max_depth,
      "draft.num_depths = " << draft.num_depths << " must be in 1..max_depth = " << max_depth);
  TREEMLA_CHECK(draft.top_k >= 1, "draft.top_k = " << draft.top_k << " must be >= 1");
  TREEMLA_CHECK(bonus_token >= 0, "bonus_token = " << bonus_token << " must be >= 0");
  const int64_t cells = static_cast<int64_t>(draft.num_depths) * draft.top_k;
  TREEMLA_CHECK(static_cast<int64_t>(draft.tokens.size()) == cells,
                "draft.tokens has " << draft.tokens.size()
                                    << " entries; must be num_depths * top_k = " << draft.num_depths
                                    << " * " << draft.top_k << " = " << cells);
  TREEMLA_CHECK(static_cast<int64_t>(draft.log_probs.size()) == cells,
                "draft.log_probs has " << draft.log_probs.size()
                                       << " entries; must be num_depths * top_k = " << cells);
  const int K = draft.top_k;
  std::vector<int32_t> sorted(K);
  for (int d = 0; d < draft.num_depths; ++d) {
    const int32_t* tok = draft.tokens.data() + static_cast<size_t>(d) * K;
    const float* lp = draft.log_probs.data() + static_cast<size_t>(d) * K;
    for (int r = 0; r < K; ++r) {
      // Depth d + 1 in messages: depths count from 1 (the root is depth 0).
      TREEMLA_CHECK(tok[r] >= 0, "draft.tokens[depth " << d + 1 << "][rank " << r
                                                       << "] = " << tok[r] << " must be >= 0");
      TREEMLA_CHECK(!std::isnan(lp[r]) && lp[r] <= 0.f,
                    "draft.log_probs[depth " << d + 1 << "][rank " << r << "] = " << lp[r]
                                             << " must be <= 0 (a log-probability; -inf allowed)");
      TREEMLA_CHECK(r == 0 || lp[r] <= lp[r - 1],
                    "draft.log_probs[depth " << d + 1 << "][rank " << r << "] = " << lp[r]
                                             << " must be <= rank " << r - 1 << "'s " << lp[r - 1]
                                             << " (top-K is sorted best first)");
    }
    std::copy(tok, tok + K, sorted.begin());
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      const int first = static_cast<int>(std::find(tok, tok + K, *dup) - tok);
      const int second = static_cast<int>(std::find(tok + first + 1, tok + K, *dup) - tok);
      TREEMLA_FAIL("draft.tokens[depth " << d + 1 << "][rank " << second << "] = " << *dup
                                         << " repeats rank " << first
                                         << " (top-K tokens must be distinct)");
    }
  }
}

// A path waiting in the heap: rank `rank` at depth `depth`, below the existing node `parent`.
struct Candidate {
  double score;
  int32_t depth;
  int32_t rank;
  int32_t parent;
};

}  // namespace

DDTree build_ddtree(const DraftTopK& draft, int32_t bonus_token, int budget, int max_depth) {
  validate_draft(draft, bonus_token, budget, max_depth);
  const int K = draft.top_k;
  const int D = draft.num_depths;
  auto lp = [&](int depth, int rank) {
    return static_cast<double>(draft.log_probs[static_cast<size_t>(depth - 1) * K + rank]);
  };

  DDTree t;
  for (auto* v : {&t.parents, &t.tokens, &t.depths, &t.ranks}) v->reserve(budget + 1);
  t.scores.reserve(budget + 1);
  t.parents.push_back(-1);
  t.tokens.push_back(bonus_token);
  t.depths.push_back(0);
  t.ranks.push_back(-1);
  t.scores.push_back(0.0);

  // True when b pops before a: higher score, then lower depth, then the lexicographically smaller
  // rank tuple. Same-depth paths with different parents are ordered by the ranks where their
  // ancestor chains first diverge: walk both parents up in lockstep until they share a parent.
  auto pops_later = [&t](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score < b.score;
    if (a.depth != b.depth) return a.depth > b.depth;
    if (a.parent == b.parent) return a.rank > b.rank;
    int32_t pa = a.parent, pb = b.parent;
    while (t.parents[pa] != t.parents[pb]) {
      pa = t.parents[pa];
      pb = t.parents[pb];
    }
    return t.ranks[pa] > t.ranks[pb];
  };

  std::vector<Candidate> heap;
  heap.reserve(budget + 2);  // each pop removes one entry and adds at most two
  heap.push_back({lp(1, 0), 1, 0, 0});
  while (static_cast<int>(t.parents.size()) <= budget && !heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), pops_later);
    const Candidate c = heap.back();
    heap.pop_back();
    const int32_t node = static_cast<int32_t>(t.parents.size());
    t.parents.push_back(c.parent);
    t.tokens.push_back(draft.tokens[static_cast<size_t>(c.depth - 1) * K + c.rank]);
    t.depths.push_back(c.depth);
    t.ranks.push_back(c.rank);
    t.scores.push_back(c.score);
    // Both successors are scored from their own parent's score, so every node's score is the
    // left-to-right sum of its path's log-probs, bit for bit.
    if (c.rank + 1 < K) {
      heap.push_back({t.scores[c.parent] + lp(c.depth, c.rank + 1), c.depth, c.rank + 1, c.parent});
      std::push_heap(heap.begin(), heap.end(), pops_later);
    }
    if (c.depth + 1 <= D) {
      heap.push_back({c.score + lp(c.depth + 1, 0), c.depth + 1, 0, node});
      std::push_heap(heap.begin(), heap.end(), pops_later);
    }
  }
  return t;
}

}  // namespace treemla::tree
