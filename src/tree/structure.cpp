// Tree structure: parent-array validation, depths, positions, ancestor bitmasks (both ways) and
// the batched VerifyParams layout.
#include <algorithm>
#include <bit>

#include "treemla/error.h"
#include "treemla/tree.h"

namespace treemla::tree {

void validate_parents(std::span<const int32_t> parents) {
  const int64_t n = static_cast<int64_t>(parents.size());
  TREEMLA_CHECK(n >= 1 && n <= kMaxTreeNodes, "parents has "
                                                  << n << " nodes; must be 1.." << kMaxTreeNodes
                                                  << " (kMaxTreeNodes, the root plus at most "
                                                  << kMaxBudget << " draft nodes)");
  TREEMLA_CHECK(parents[0] == -1,
                "parents[0] = " << parents[0] << " must be -1 (node 0 is the root)");
  for (int64_t i = 1; i < n; ++i) {
    TREEMLA_CHECK(parents[i] >= 0, "parents[" << i << "] = " << parents[i]
                                              << " must be >= 0 (only node 0 is a root)");
    TREEMLA_CHECK(parents[i] < i, "parents[" << i << "] = " << parents[i] << " must be < " << i
                                             << " (a node's parent precedes it)");
  }
}

namespace {

// Depths of an already validated parent array; parents precede children, so one forward pass.
void fill_depths(std::span<const int32_t> parents, int32_t* depth) {
  depth[0] = 0;
  for (size_t i = 1; i < parents.size(); ++i) depth[i] = depth[parents[i]] + 1;
}

void check_prefix_len(int32_t prefix_len, const char* what) {
  TREEMLA_CHECK(
      prefix_len >= 0 && prefix_len <= kMaxPrefixLen,
      what << " = " << prefix_len << " must be in 0.." << kMaxPrefixLen << " (kMaxPrefixLen)");
}

// Rows of a validated tree at the given stride; out holds n * stride words.
void fill_mask(std::span<const int32_t> parents, int stride, uint64_t* out) {
  const size_t n = parents.size();
  std::fill(out, out + n * stride, uint64_t{0});
  out[0] = 1;  // the root sees only itself
  for (size_t i = 1; i < n; ++i) {
    const uint64_t* up = out + static_cast<size_t>(parents[i]) * stride;
    uint64_t* row = out + i * stride;
    // Only words up to i's own word can be non-zero: every ancestor index is below i.
    const size_t last = i / 64;
    for (size_t w = 0; w <= last; ++w) row[w] = up[w];
    row[last] |= uint64_t{1} << (i % 64);
  }
}

}  // namespace

std::vector<int32_t> compute_depths(std::span<const int32_t> parents) {
  validate_parents(parents);
  std::vector<int32_t> depth(parents.size());
  fill_depths(parents, depth.data());
  return depth;
}

std::vector<int32_t> compute_positions(std::span<const int32_t> parents, int32_t prefix_len) {
  check_prefix_len(prefix_len, "prefix_len");
  std::vector<int32_t> pos = compute_depths(parents);
  for (int32_t& p : pos) p += prefix_len;  // depth <= 1024, so no overflow under kMaxPrefixLen
  return pos;
}

std::vector<uint64_t> build_ancestor_mask(std::span<const int32_t> parents) {
  validate_parents(parents);
  const int stride = mask_words_for(static_cast<int>(parents.size()));
  std::vector<uint64_t> mask(parents.size() * stride);
  fill_mask(parents, stride, mask.data());
  return mask;
}

void write_ancestor_mask(std::span<const int32_t> parents, int mask_words,
                         std::span<uint64_t> out) {
  validate_parents(parents);
  const int n = static_cast<int>(parents.size());
  TREEMLA_CHECK(mask_words >= mask_words_for(n),
                "mask_words = " << mask_words << " must be >= ceil(n / 64) = " << mask_words_for(n)
                                << " for a tree of n = " << n << " nodes");
  const size_t need = static_cast<size_t>(n) * static_cast<size_t>(mask_words);
  TREEMLA_CHECK(out.size() >= need, "out has " << out.size()
                                               << " words; must hold n * mask_words = " << n
                                               << " * " << mask_words << " = " << need);
  fill_mask(parents, mask_words, out.data());
}

std::vector<int32_t> parents_from_mask(std::span<const uint64_t> mask, int n, int mask_words) {
  TREEMLA_CHECK(n >= 1 && n <= kMaxTreeNodes,
                "n = " << n << " must be in 1.." << kMaxTreeNodes << " (kMaxTreeNodes)");
  TREEMLA_CHECK(mask_words >= mask_words_for(n),
                "mask_words = " << mask_words << " must be >= ceil(n / 64) = " << mask_words_for(n)
                                << " for n = " << n << " rows");
  const size_t stride = static_cast<size_t>(mask_words);
  TREEMLA_CHECK(mask.size() >= n * stride,
                "mask has " << mask.size() << " words; must hold n * mask_words = " << n * stride);
  std::vector<int32_t> parents(n);
  parents[0] = -1;
  for (int i = 0; i < n; ++i) {
    const uint64_t* row = mask.data() + i * stride;
    const int own_word = i / 64;
    const uint64_t own_bit = uint64_t{1} << (i % 64);
    TREEMLA_CHECK(row[own_word] & own_bit,
                  "mask row " << i << " lacks its own bit " << i << " (a node sees itself)");
    // Bits above i in i's own word: mask of the bits strictly greater than i % 64.
    const uint64_t above = ~(own_bit | (own_bit - 1));
    TREEMLA_CHECK((row[own_word] & above) == 0,
                  "mask row " << i << " word " << own_word << " has a bit above " << i
                              << " (a node sees only itself and its ancestors, which precede it)");
    for (size_t w = own_word + 1; w < stride; ++w) {
      TREEMLA_CHECK(row[w] == 0, "mask row " << i << " word " << w << " = " << row[w]
                                             << " must be 0 (bits above node " << i
                                             << " and padding past n = " << n << ")");
    }
    if (i == 0) continue;  // row 0 == {0} follows from the two checks above
    // Parent = highest set bit below i: the nearest ancestor has the largest index.
    int p = -1;
    for (int w = own_word; w >= 0 && p < 0; --w) {
      const uint64_t bits = (w == own_word) ? (row[w] & (own_bit - 1)) : row[w];
      if (bits) p = w * 64 + static_cast<int>(std::bit_width(bits)) - 1;
    }
    TREEMLA_CHECK(p >= 0, "mask row " << i
                                      << " has no ancestor bit (every node but the root "
                                         "sees the root, bit 0)");
    const uint64_t* up = mask.data() + static_cast<size_t>(p) * stride;
    for (int w = 0; w <= own_word; ++w) {
      const uint64_t expect = up[w] | (w == own_word ? own_bit : 0);
      TREEMLA_CHECK(row[w] == expect,
                    "mask row " << i << " word " << w << " = " << row[w] << " must equal row " << p
                                << " (its parent) plus bit " << i << " = " << expect);
    }
    parents[i] = p;
  }
  return parents;
}

BatchLayout build_batch_layout(std::span<const std::vector<int32_t>> trees,
                               std::span<const int32_t> prefix_lens, int mask_words) {
  TREEMLA_CHECK(!trees.empty(), "trees is empty; batch must be >= 1");
  TREEMLA_CHECK(prefix_lens.size() == trees.size(),
                "prefix_lens has " << prefix_lens.size() << " entries; must equal the number of "
                                   << "trees, " << trees.size());
  BatchLayout out;
  out.batch = static_cast<int>(trees.size());
  int max_q = 0;
  int64_t total = 0;
  for (size_t b = 0; b < trees.size(); ++b) {
    try {
      validate_parents(trees[b]);
    } catch (const Error& e) {
      TREEMLA_FAIL("trees[" << b << "]: " << e.message());
    }
    if (prefix_lens[b] < 0 || prefix_lens[b] > kMaxPrefixLen) {
      TREEMLA_FAIL("prefix_lens[" << b << "] = " << prefix_lens[b] << " must be in 0.."
                                  << kMaxPrefixLen << " (kMaxPrefixLen)");
    }
    max_q = std::max(max_q, static_cast<int>(trees[b].size()));
    total += static_cast<int64_t>(trees[b].size());
  }
  TREEMLA_CHECK(total <= INT32_MAX, "total nodes " << total << " must fit int32 (q_indptr)");
  const int need = mask_words_for(max_q);
  if (mask_words == 0) mask_words = need;
  TREEMLA_CHECK(mask_words >= need && mask_words <= kMaxMaskWords,
                "mask_words = " << mask_words << " must be in ceil(max q_len / 64) = " << need
                                << " .. " << kMaxMaskWords
                                << " (kMaxMaskWords); max q_len = " << max_q);
  out.total_q = static_cast<int>(total);
  out.mask_words = mask_words;
  out.prefix_lens.assign(prefix_lens.begin(), prefix_lens.end());
  out.q_indptr.resize(out.batch + 1);
  out.positions.resize(out.total_q);
  out.tree_mask.resize(static_cast<size_t>(out.total_q) * mask_words);
  out.q_indptr[0] = 0;
  for (int b = 0; b < out.batch; ++b) {
    const std::vector<int32_t>& t = trees[b];
    const int32_t begin = out.q_indptr[b];
    out.q_indptr[b + 1] = begin + static_cast<int32_t>(t.size());
    fill_depths(t, out.positions.data() + begin);
    for (size_t j = 0; j < t.size(); ++j) out.positions[begin + j] += prefix_lens[b];
    fill_mask(t, mask_words, out.tree_mask.data() + static_cast<size_t>(begin) * mask_words);
  }
  return out;
}

}  // namespace treemla::tree
