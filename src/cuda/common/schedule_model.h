// The verify schedule's arithmetic (src/cuda/smxx/schedule.cu, docs/verify-kernel.md "The work
// list"), shared by the schedule kernel and by host code that explains its choices without a GPU
// (`treemla schedule`). Plain C++ as well as CUDA: the functions are __host__ __device__ under
// nvcc. model_schedule() (host only) replays the kernel's passes for a list of request shapes;
// the kernel computes the same sums with warp reductions (integers: the order does not matter).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TREEMLA_SCHED_HD __host__ __device__ __forceinline__
#else
#define TREEMLA_SCHED_HD inline
#endif

#include <algorithm>
#include <climits>
#include <vector>

// Host code calls std::max / std::min where the device code calls CUDA's max / min overloads.
#if !defined(__CUDA_ARCH__)
#define TREEMLA_SCHED_MINMAX \
  using std::max;            \
  using std::min
#else
#define TREEMLA_SCHED_MINMAX static_assert(true, "")
#endif

namespace treemla::cuda {

constexpr int kBlockM = 64;          // folded (node, head) rows per work item
constexpr int kMinChunkBlocks = 8;   // a work item reads at least this many prefix blocks
constexpr int kMaxWaves = 8;         // the schedule aims for at most this many waves of work items
constexpr int kScheduleBlockN = 32;  // keys of a schedule (prefix) block

// Candidates of the schedule's estimate: a wave choice and the splits rounded down or up
// (rounding up pays where a few items spill into a refined last wave: one or two waves).
// Candidate c: waves {1, 1, 2, 2, 3, 4, 6, kMaxWaves}, rounded up at c = 1 and 3.
constexpr int kNumCandidates = 8;
TREEMLA_SCHED_HD constexpr int cand_waves(int c) {
  return c < 2 ? 1 : c < 4 ? 2 : c == 4 ? 3 : c == 5 ? 4 : c == 6 ? 6 : kMaxWaves;
}
TREEMLA_SCHED_HD constexpr bool cand_up(int c) { return c == 1 || c == 3; }
// A work item's fixed cost in prefix blocks (its Q load, pipeline fill and partial output) for
// the estimate.
constexpr int kItemOverheadBlocks = 8;
// The refined last wave is taken when its estimate is under this share (percent) of the best
// plain plan's (VerifyKernelParams::refine_pct; measured on the H200, seventeenth session).
constexpr int kRefinePctSm90a = 96;
constexpr int kRefinePctOther = 97;
// The threshold of a plan's family (the launch code's default, the host model's and the tests').
TREEMLA_SCHED_HD constexpr int refine_pct_for(bool sm90a_family) {
  return sm90a_family ? kRefinePctSm90a : kRefinePctOther;
}

// Part k of n near-equal parts of `len` prefix blocks (32 keys): blocks [begin, end), every
// boundary inside the range a multiple of `align` blocks from its start. A request's split (len =
// pblocks, n = splits) and a refined piece of a split (len = the split's blocks, n = q) are cut
// this way. align = 1 is the plain cut k len / n. The sm90a family cuts with align = 2
// (kSplitAlignSm90a): its 64-key blocks then start on a 64-key boundary of the prefix, so on pages
// of 64 rows or more each is one 64-row TMA box; a split starting on an odd block made every block
// of it two 32-row boxes, and that split 7% slower (H200, the GLM-5 shape: 14 splits of 413
// blocks, the odd ones the last to finish; docs/verify-kernel.md). The parts differ by at most one
// unit of `align` blocks; n <= len / kMinChunkBlocks keeps every part non-empty.
TREEMLA_SCHED_HD void even_part(long long len, long long k, long long n, int align, int& begin,
                                int& end) {
  TREEMLA_SCHED_MINMAX;
  const long long a = max(align, 1);
  const long long units = (len + a - 1) / a;
  begin = static_cast<int>(min(a * (k * units / n), len));
  end = static_cast<int>(min(a * ((k + 1) * units / n), len));
}
// The split alignment of a family (VerifyKernelParams::split_align, RequestSched::align).
constexpr int kSplitAlignSm90a = 2;
TREEMLA_SCHED_HD constexpr int split_align_for(bool sm90a_family) {
  return sm90a_family ? kSplitAlignSm90a : 1;
}

// The tree tail's weight: the split that carries a request's tree tail (its last) also computes
// the tail's blocks, with row-by-row copies and mask loads, and was the last of its row tile to
// finish; so the schedule cuts the prefix blocks as if there were `tail_w` more and the last split
// had them (split_part), in the item table only (schedule.cu). The weight a request gets: the
// family's weight for its q_len (`one`: q_len = 1, `tree`: more rows; VerifyKernelParams::
// tail_w_one / tail_w_tree, recorded in WorkRefine::tail_one / tail_tree), 0 when the call has no
// tail or the request one split, and at most half a split's share, so that the last split keeps
// at least half of one (every part stays non-empty: SplitParts tests).
TREEMLA_SCHED_HD int tail_weight(int q_len, int pblocks, int splits, bool with_tail, int one,
                                 int tree) {
  TREEMLA_SCHED_MINMAX;
  if (!with_tail || q_len <= 0 || splits <= 1) return 0;
  const int w = q_len == 1 ? one : tree;
  return max(0, min(w, pblocks / splits / 2));
}
// Prefix blocks [begin, end) of split s of `splits` over `pblocks` blocks whose last split is
// `tail_w` blocks lighter: even_part of pblocks + tail_w, the last part cut back to pblocks.
TREEMLA_SCHED_HD void split_part(int pblocks, int tail_w, int s, int splits, int align, int& begin,
                                 int& end) {
  TREEMLA_SCHED_MINMAX;
  even_part(static_cast<long long>(pblocks) + tail_w, s, splits, align, begin, end);
  begin = min(begin, pblocks);
  end = min(end, pblocks);
}

// Splits of a request with `pblocks` prefix blocks for a target of `waves` x the grid, given its
// share x = pblocks * grid / total: the share rounded down (or up), at least 1, at most
// pblocks / kMinChunkBlocks.
TREEMLA_SCHED_HD int splits_for(int pblocks, double x, int waves, bool up) {
  TREEMLA_SCHED_MINMAX;
  const double t = x * waves;
  const long long by_share = static_cast<long long>(up ? ceil(t) : floor(t));
  const long long by_min = pblocks / kMinChunkBlocks;
  return static_cast<int>(max(1LL, min(by_share, by_min)));
}

// The estimates of one candidate: its items n, their largest and smallest prefix blocks, and the
// partial slots of its splits. `plain`: the waves of the largest item (the last one partly idle);
// `refined`: the whole waves, then the last wave's items cut into q pieces, or -1 when that
// cannot be (no whole wave, nothing left over, pieces under kMinChunkBlocks, or too few partial
// slots). plain = -1: the splits' partial slots do not fit.
struct Estimate {
  long long plain, refined;
  int q;
};
TREEMLA_SCHED_HD Estimate candidate_estimate(unsigned n, int item_max, int item_min, unsigned parts,
                                             int grid, int slots, bool refine_ok) {
  TREEMLA_SCHED_MINMAX;
  Estimate e{-1, -1, 1};
  if (parts > static_cast<unsigned>(slots)) return e;
  // 32-bit arithmetic (the item count is below 2^31: at most 8 grids plus every row tile).
  const unsigned g = grid > 0 ? static_cast<unsigned>(grid) : 1u;
  const unsigned full = n / g, rest = n - full * g;
  const long long per = item_max + kItemOverheadBlocks;
  e.plain = (full + (rest > 0 ? 1 : 0)) * per;
  if (refine_ok && full >= 1 && rest > 0) {
    const unsigned q = min(g / rest, static_cast<unsigned>(item_min / kMinChunkBlocks));
    if (q >= 2 && parts + static_cast<unsigned long long>(rest) * q <=
                      static_cast<unsigned long long>(slots)) {
      e.q = static_cast<int>(q);
      e.refined = full * per + (item_max + e.q - 1) / e.q + kItemOverheadBlocks;
    }
  }
  return e;
}

// The choice among the candidates' estimates: the plain estimates in order, a later candidate
// taken only when 3% better; a refined last wave only when its estimate is under refine_pct % of
// that. Pair mode keeps one wave, rounded down, unrefined. `refine_q`: the chosen candidate's
// pieces an item (1: not refined). The schedule kernel's thread 0 calls it (schedule.cu), as does
// the host model below; VerifyGpu.ScheduleMatchesHostModel checks the kernel against the model.
struct Choice {
  int cand, refine_q;
};
TREEMLA_SCHED_HD Choice choose_candidate(const Estimate* est, int refine_pct, bool pair) {
  int best = 0, best_r = -1;
  long long best_est = -1, best_ref = -1;
  for (int c = 0; c < kNumCandidates; ++c) {
    const Estimate e = est[c];
    if (e.plain >= 0 && (best_est < 0 || e.plain * 100 < best_est * 97)) {
      best = c;
      best_est = e.plain;
    }
    if (e.refined >= 0 && (best_ref < 0 || e.refined < best_ref)) {
      best_r = c;
      best_ref = e.refined;
    }
  }
  const bool refine = best_r >= 0 && best_ref * 100 < best_est * refine_pct;
  return Choice{pair ? 0 : refine ? best_r : best, pair || !refine ? 1 : est[best_r].q};
}

// The plan's wave bound (make_verify_plan) for a grid of `resident` CTAs (or CTA pairs) on
// `sm_count` SMs: up to kMaxWaves waves, fewer with several CTAs per SM, so that the partial
// slots (that many waves of items, one slot each; two a pair-mode item) stay at kMaxWaves per SM,
// 128 KB each.
inline int plan_max_waves(int sm_count, int resident) {
  const int w = kMaxWaves * sm_count / (resident > 1 ? resident : 1);
  return w < 1 ? 1 : w > kMaxWaves ? kMaxWaves : w;
}

// ---- host only (plain inline functions: nvcc's device pass parses them but emits nothing) ----

// One request as the schedule sees it.
struct ModelRequest {
  int q_len, prefix_len;
};

// What the schedule makes of a call (host replay of schedule.cu's passes; requests assumed valid,
// the prefix part included). Candidate arrays are indexed by candidate.
struct ScheduleModel {
  unsigned cand_items[kNumCandidates] = {}, cand_parts[kNumCandidates] = {};
  int cand_max[kNumCandidates] = {}, cand_min[kNumCandidates] = {};
  bool cand_allowed[kNumCandidates] = {};  // cand_waves(c) <= max_waves
  Estimate est[kNumCandidates] = {};
  int chosen = 0, refine_q = 1;
  std::vector<int> tiles, pblocks, splits;  // per request
  int items = 0;                            // work items, refined pieces included
  int groups = 0;                           // combine groups, refined ones included
  int partials = 0;                         // partial slots used
  int refine_first = 0, refine_count = 0;   // the refined last wave (count 0: none)
};

// refine_pct: refine_pct_for(the plan's family is sm90a). Pair mode (the cluster
// family) is not modeled.
inline ScheduleModel model_schedule(const std::vector<ModelRequest>& reqs, int heads, int grid,
                                    int partial_slots, int max_waves, int refine_pct) {
  ScheduleModel m;
  long long total = 0;
  for (const ModelRequest& r : reqs) {
    const int tiles = (r.q_len * heads + kBlockM - 1) / kBlockM;
    const int pb = (r.prefix_len + kScheduleBlockN - 1) / kScheduleBlockN;
    m.tiles.push_back(tiles);
    m.pblocks.push_back(pb);
    total += static_cast<long long>(tiles) * pb;
  }
  const long long total_cost = total > 0 ? total : 1;
  const double grid_share = static_cast<double>(grid) / static_cast<double>(total_cost);
  for (int c = 0; c < kNumCandidates; ++c) {
    m.cand_min[c] = INT_MAX;
    m.cand_allowed[c] = cand_waves(c) <= max_waves;
    for (size_t b = 0; b < reqs.size(); ++b) {
      if (reqs[b].q_len <= 0) continue;
      const int pb = m.pblocks[b];
      const int s = splits_for(pb, static_cast<double>(pb) * grid_share, cand_waves(c), cand_up(c));
      const unsigned items = static_cast<unsigned>(m.tiles[b] * s);
      m.cand_items[c] += items;
      m.cand_parts[c] += s > 1 ? items : 0u;
      const int imax = (pb + s - 1) / s, imin = pb / s;
      m.cand_max[c] = imax > m.cand_max[c] ? imax : m.cand_max[c];
      m.cand_min[c] = imin < m.cand_min[c] ? imin : m.cand_min[c];
    }
    m.est[c] = m.cand_allowed[c] ? candidate_estimate(m.cand_items[c], m.cand_max[c], m.cand_min[c],
                                                      m.cand_parts[c], grid, partial_slots, true)
                                 : Estimate{-1, -1, 1};
  }
  const Choice ch = choose_candidate(m.est, refine_pct, false);
  m.chosen = ch.cand;
  m.refine_q = ch.refine_q;
  const int waves = cand_waves(m.chosen);
  const bool up = cand_up(m.chosen);
  int items = 0, parts = 0, groups = 0;
  for (size_t b = 0; b < reqs.size(); ++b) {
    int s = 1;
    if (reqs[b].q_len > 0)
      s = splits_for(m.pblocks[b], static_cast<double>(m.pblocks[b]) * grid_share, waves, up);
    if (reqs[b].q_len <= 0) m.tiles[b] = 0;
    m.splits.push_back(s);
    items += m.tiles[b] * s;
    parts += s > 1 ? m.tiles[b] * s : 0;
    groups += s > 1 ? m.tiles[b] : 0;
  }
  const int g = grid > 0 ? grid : 1;
  m.refine_first = items;
  if (m.refine_q > 1 && items > g && items % g != 0) {
    m.refine_first = items / g * g;
    m.refine_count = items - m.refine_first;
    items = m.refine_first + m.refine_count * m.refine_q;
    groups += m.refine_count;  // one each (empty where the item's request has several splits)
    parts += m.refine_count * m.refine_q;
  }
  m.items = items;
  m.groups = groups;
  m.partials = parts;
  return m;
}

}  // namespace treemla::cuda
