// treemla: draft trees on the host -- validation, derived layouts (depths, positions, ancestor
// bitmasks), the DDTree builder, acceptance of a verified tree and the commit plan that follows.
//
// A tree of n nodes is given by its parent array: parents[0] = -1 (the root, the last accepted
// "bonus" token) and 0 <= parents[i] < i for i > 0. Node order is otherwise arbitrary (DDTree
// emits heap-pop order). Every function here validates its inputs and throws treemla::Error with
// a message naming the argument, the node and the rule it broke.
//
// Arrays are taken as std::span; a pointer and a count convert with std::span(ptr, count).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "treemla/attention.h"

namespace treemla::tree {

constexpr int kMaxBudget = kMaxTreeNodes - 1;  // 1024 draft nodes besides the root
constexpr int kDefaultMaxDepth = 15;           // DFlash block size 16 minus the bonus position

// ---- structure -------------------------------------------------------------------------------

// uint64 words needed for one mask row of an n-node tree: ceil(n / 64).
constexpr int mask_words_for(int n) { return (n + 63) / 64; }

// Checks 1 <= n <= kMaxTreeNodes, parents[0] == -1 and 0 <= parents[i] < i for i > 0.
void validate_parents(std::span<const int32_t> parents);

// depth[0] = 0, depth[i] = depth[parents[i]] + 1.
std::vector<int32_t> compute_depths(std::span<const int32_t> parents);

// RoPE positions: positions[i] = prefix_len + depth[i], 0 <= prefix_len <= kMaxPrefixLen.
std::vector<int32_t> compute_positions(std::span<const int32_t> parents, int32_t prefix_len);

// Packed ancestor rows: bit j of row i (word j / 64, bit j % 64) is set iff j == i or j is an
// ancestor of i. Row i = row parents[i] | bit i; the root's row holds only bit 0.
// This overload uses the tight stride mask_words_for(n); the result has n * stride words.
std::vector<uint64_t> build_ancestor_mask(std::span<const int32_t> parents);

// Same rows written with a caller-given stride (so a batch of trees can share one stride):
// mask_words >= mask_words_for(n); out must hold n * mask_words words. Every word of the n rows is
// written, padding words included (as zero).
void write_ancestor_mask(std::span<const int32_t> parents, int mask_words, std::span<uint64_t> out);

// The reverse: checks that mask ([n, mask_words]) is the ancestor mask of some tree and returns
// its parent array. Rules: every row i has bit i set, no bit above i (ancestors precede their
// descendants) and no bit in the padding; row 0 is exactly {0}; and for i > 0, with p the highest
// set bit below i (the parent, since ancestors have increasing indices down the path),
// row i == row p | bit i.
std::vector<int32_t> parents_from_mask(std::span<const uint64_t> mask, int n, int mask_words);

// The VerifyParams layout for a batch of trees (see attention.h): request b owns the query rows
// [q_indptr[b], q_indptr[b + 1]); tree_mask holds its rows in the same global order, with the
// bits of a row indexing tail nodes of the same request.
struct BatchLayout {
  int batch = 0;
  int total_q = 0;
  int mask_words = 0;                // shared stride of tree_mask rows
  std::vector<int32_t> q_indptr;     // [batch + 1], q_indptr[0] = 0
  std::vector<int32_t> prefix_lens;  // [batch], a copy of the input
  std::vector<int32_t> positions;    // [total_q], prefix_lens[b] + depth
  std::vector<uint64_t> tree_mask;   // [total_q, mask_words]
};

// mask_words = 0 picks the smallest stride, mask_words_for(max q_len); otherwise it must be
// >= that and <= kMaxMaskWords. trees and prefix_lens must have the same size, >= 1.
BatchLayout build_batch_layout(std::span<const std::vector<int32_t>> trees,
                               std::span<const int32_t> prefix_lens, int mask_words = 0);

// ---- DDTree builder --------------------------------------------------------------------------

// The drafter's per-depth top-K: row d - 1 (d = 1..num_depths) holds the K best tokens for depth
// d and their log-probabilities, best first. Row-major [num_depths, top_k].
struct DraftTopK {
  int num_depths = 0;                // D, 1..max_depth
  int top_k = 0;                     // K >= 1
  std::span<const int32_t> tokens;   // [D, K], token ids >= 0, distinct within a row
  std::span<const float> log_probs;  // [D, K], <= 0 (may be -inf), non-increasing along a row
};

struct DDTree {
  std::vector<int32_t> parents;  // [n], parents[0] = -1
  std::vector<int32_t> tokens;   // [n], tokens[0] = the bonus token
  std::vector<int32_t> depths;   // [n], depths[0] = 0
  std::vector<int32_t> ranks;    // [n], rank of the node in its depth's top-K; ranks[0] = -1
  std::vector<double> scores;    // [n], sum of log-probs along the path; scores[0] = 0
  int size() const { return static_cast<int>(parents.size()); }
};

// Best-first DDTree construction. A path is a rank choice (r_1, .., r_d), r_k < K, d <= D; its
// score is log_probs[0][r_1] + .. + log_probs[d-1][r_d], summed in double in that order. A
// max-heap starts with the path (0); each pop adds one node (its parent is the node of the path
// without its last rank, the root for d = 1) and pushes the next sibling (r_d + 1 if < K) and the
// first child (r_1, .., r_d, 0) if d < D. Exactly `budget` pops, 1 <= budget <= kMaxBudget, so
// the tree has 1 + budget nodes -- fewer only when all K + K^2 + .. + K^D paths fit in the budget
// (the heap empties; the result is then the full tree of all paths).
//
// Ties pop in a fixed order: higher score, then lower depth, then the lexicographically smaller
// rank tuple. Since scores never increase along a path (log-probs <= 0) nor along siblings, this
// order is consistent with the heap's push structure, so the nodes come out in exactly that
// global order: node i (i >= 1) is the i-th best path, and the node set is the `budget` best
// paths. The node order is the pop order.
DDTree build_ddtree(const DraftTopK& draft, int32_t bonus_token, int budget,
                    int max_depth = kDefaultMaxDepth);

// ---- acceptance ------------------------------------------------------------------------------

struct Acceptance {
  std::vector<int32_t> nodes;  // accepted node indices, root first; nodes[k] has depth k
  int32_t length = 0;          // nodes.size(): the root plus the accepted draft nodes (>= 1)
  int32_t bonus_token = 0;     // target_tokens[nodes.back()], the next round's root token
};

// Walks the verified tree: at node u (starting at the root) take t(u) = target_tokens[u]; if a
// child of u carries token t(u), move to it, else stop. node_tokens[u] is the token node u carries
// (node_tokens[0], the root's, is not compared). Both arrays are aligned with the nodes.
//   Greedy (temperature 0): target_tokens = the target's argmax at every node (argmax_rows).
//   Sampled (temperature > 0): target_tokens = one independent sample of the target's
//   distribution at every node (sample_rows). The walk is the same; given the samples the result
//   is identical, and every committed token is the target's own choice, so it is lossless.
// If several children of u carry t(u) (impossible in a DDTree, whose top-K tokens are distinct;
// possible in a caller's tree) the one with the lowest index is taken.
Acceptance accept_path(std::span<const int32_t> parents, std::span<const int32_t> node_tokens,
                       std::span<const int32_t> target_tokens);

// Row-wise argmax of rows ([n, vocab] float); ties go to the lowest column. NaN is rejected.
std::vector<int32_t> argmax_rows(std::span<const float> rows, int n, int vocab);

// One sample per row of probs ([n, vocab], >= 0, finite, each row's sum > 0; rows need not be
// normalized). Inverse-CDF sampling with u in [0, 1) built from two raw mt19937 outputs (53 bits),
// so the result depends only on the engine's state, not on the standard library's distributions.
// A column of probability 0 is never drawn.
std::vector<int32_t> sample_rows(std::span<const float> probs, int n, int vocab, std::mt19937& rng);
std::vector<int32_t> sample_rows(std::span<const float> probs, int n, int vocab, uint32_t seed);

// ---- commit ----------------------------------------------------------------------------------

// A copy of one latent row between logical rows of the same request (logical row t lives at
// page_table[t / page_size], slot t % page_size; see attention.h).
struct RowCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

// Where the accepted path goes. Before verify the tail was written right after the prefix:
// logical row prefix_len + j holds node j, j < tree_size. Accepted node accepted[k] (depth k)
// moves to row prefix_len + k, its sequential position, so no re-rotation is needed. Rows
// [new_len, old_len) are dead afterwards and may be released.
struct CommitPlan {
  int32_t prefix_len = 0;
  int32_t old_len = 0;  // prefix_len + tree_size, the rows written for verify
  int32_t new_len = 0;  // prefix_len + accepted.size()
  // Copies with src != dst only, in increasing dst. Identity copies (accepted[k] == k: always the
  // root, and every node of a fully accepted chain) are skipped and counted in num_identity.
  // Applying the copies in this order in place is safe: accepted indices strictly increase and
  // accepted[k] >= k, so every later source row prefix_len + accepted[k'] (k' > k) lies above every
  // row written so far.
  std::vector<RowCopy> copies;
  int32_t num_identity = 0;
};

// accepted: node indices, root first, each a child of the previous one (so accepted[k] has depth
// k), as returned by accept_path. 0 <= prefix_len <= kMaxPrefixLen.
CommitPlan plan_commit(std::span<const int32_t> parents, std::span<const int32_t> accepted,
                       int32_t prefix_len);

}  // namespace treemla::tree
