// Acceptance of a verified tree (greedy or sampled targets), target-token helpers, and the commit
// plan that moves the accepted path into sequential cache rows.
#include <cmath>

#include "treemla/error.h"
#include "treemla/tree.h"

namespace treemla::tree {

namespace {

void check_rows(size_t size, int n, int vocab, const char* what) {
  TREEMLA_CHECK(n >= 1, "n = " << n << " must be >= 1");
  TREEMLA_CHECK(vocab >= 1, "vocab = " << vocab << " must be >= 1");
  const size_t need = static_cast<size_t>(n) * static_cast<size_t>(vocab);
  TREEMLA_CHECK(size >= need, what << " has " << size << " entries; must hold n * vocab = " << n
                                   << " * " << vocab << " = " << need);
}

}  // namespace

Acceptance accept_path(std::span<const int32_t> parents, std::span<const int32_t> node_tokens,
                       std::span<const int32_t> target_tokens) {
  validate_parents(parents);
  const size_t n = parents.size();
  TREEMLA_CHECK(node_tokens.size() == n, "node_tokens has " << node_tokens.size()
                                                            << " entries; must equal the number "
                                                            << "of nodes, " << n);
  TREEMLA_CHECK(target_tokens.size() == n, "target_tokens has " << target_tokens.size()
                                                                << " entries; must equal the "
                                                                << "number of nodes, " << n);
  Acceptance a;
  a.nodes.push_back(0);
  int32_t cur = 0;
  // One ascending pass suffices: the children of cur all have indices above cur, so scanning
  // onward from cur + 1 meets them in increasing order and the first match is the lowest-index
  // child carrying t(cur); after moving to it the same holds for its children.
  for (size_t j = 1; j < n; ++j) {
    if (parents[j] == cur && node_tokens[j] == target_tokens[cur]) {
      cur = static_cast<int32_t>(j);
      a.nodes.push_back(cur);
    }
  }
  a.length = static_cast<int32_t>(a.nodes.size());
  a.bonus_token = target_tokens[cur];
  return a;
}

std::vector<int32_t> argmax_rows(std::span<const float> rows, int n, int vocab) {
  check_rows(rows.size(), n, vocab, "rows");
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) {
    const float* r = rows.data() + static_cast<size_t>(i) * vocab;
    int best = 0;
    for (int v = 0; v < vocab; ++v) {
      TREEMLA_CHECK(!std::isnan(r[v]), "rows[" << i << "][" << v << "] is NaN");
      if (r[v] > r[best]) best = v;  // strict: ties keep the lowest column
    }
    out[i] = best;
  }
  return out;
}

std::vector<int32_t> sample_rows(std::span<const float> probs, int n, int vocab,
                                 std::mt19937& rng) {
  check_rows(probs.size(), n, vocab, "probs");
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) {
    const float* r = probs.data() + static_cast<size_t>(i) * vocab;
    double total = 0.0;
    int last_positive = -1;
    for (int v = 0; v < vocab; ++v) {
      TREEMLA_CHECK(std::isfinite(r[v]) && r[v] >= 0.f,
                    "probs[" << i << "][" << v << "] = " << r[v] << " must be finite and >= 0");
      total += r[v];
      if (r[v] > 0.f) last_positive = v;
    }
    TREEMLA_CHECK(last_positive >= 0,
                  "probs row " << i << " sums to 0; must have a positive entry");
    // 53-bit uniform in [0, 1) from two raw 32-bit outputs (27 + 26 bits, as in genrand_res53):
    // std::uniform_real_distribution is implementation-defined, this is not.
    const uint64_t hi = rng() >> 5, lo = rng() >> 6;
    const double u = static_cast<double>(hi * 67108864u + lo) * (1.0 / 9007199254740992.0);
    const double target = u * total;
    int pick = last_positive;  // if rounding leaves target at total, the last positive column
    double cum = 0.0;
    for (int v = 0; v < vocab; ++v) {
      cum += r[v];
      // cum only grows at positive entries, so a zero-probability column is never the first
      // to exceed target.
      if (cum > target) {
        pick = v;
        break;
      }
    }
    out[i] = pick;
  }
  return out;
}

std::vector<int32_t> sample_rows(std::span<const float> probs, int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  return sample_rows(probs, n, vocab, rng);
}

CommitPlan plan_commit(std::span<const int32_t> parents, std::span<const int32_t> accepted,
                       int32_t prefix_len) {
  validate_parents(parents);
  const int32_t n = static_cast<int32_t>(parents.size());
  TREEMLA_CHECK(
      prefix_len >= 0 && prefix_len <= kMaxPrefixLen,
      "prefix_len = " << prefix_len << " must be in 0.." << kMaxPrefixLen << " (kMaxPrefixLen)");
  TREEMLA_CHECK(!accepted.empty() && accepted.size() <= parents.size(),
                "accepted has " << accepted.size() << " nodes; must be 1..tree size " << n);
  TREEMLA_CHECK(accepted[0] == 0, "accepted[0] = " << accepted[0] << " must be 0 (the root)");
  CommitPlan plan;
  plan.prefix_len = prefix_len;
  plan.old_len = prefix_len + n;
  plan.new_len = prefix_len + static_cast<int32_t>(accepted.size());
  for (size_t k = 1; k < accepted.size(); ++k) {
    const int32_t u = accepted[k];
    TREEMLA_CHECK(u >= 1 && u < n, "accepted[" << k << "] = " << u << " must be in 1.." << n - 1
                                               << " (a non-root node of the tree)");
    // Being a child of accepted[k - 1] makes depth(u) = k by induction from the root.
    TREEMLA_CHECK(parents[u] == accepted[k - 1],
                  "accepted[" << k << "] = " << u << " has parent " << parents[u]
                              << "; must be a child of accepted[" << k - 1 << "] = "
                              << accepted[k - 1] << " (depth " << k << " on the accepted path)");
  }
  for (size_t k = 0; k < accepted.size(); ++k) {
    const int32_t src = prefix_len + accepted[k];
    const int32_t dst = prefix_len + static_cast<int32_t>(k);
    if (src == dst) {
      ++plan.num_identity;
    } else {
      plan.copies.push_back({src, dst});
    }
  }
  return plan;
}

}  // namespace treemla::tree
