// Schedule kernel (architecture-generic): one CTA reads the per-request lengths from device
// memory and writes the work list of the main kernel into the workspace, so a captured graph
// replays correctly with new lengths. No host synchronization.
//
// Cost model: a (request, row tile) pair costs one unit per 32-row prefix block; total is the
// sum over the batch. With target = waves * target_items, request b's prefix is cut into
//   splits_b = max(1, min(floor(pblocks_b * target / total), floor(pblocks_b / kMinChunkBlocks)))
// near-equal ranges (split s covers blocks even_part(pblocks, s, splits, align): boundaries on
// 64-key boundaries for the sm90a family; in the item table split_part, the last split, which also
// does the tree tail, a few blocks lighter where the family has a weight: tail_weight in
// schedule_model.h),
// so items = sum tiles_b * splits_b never exceeds target (whole waves of the persistent grid, no
// straggler wave) unless requests with splits_b = 1 alone need more, and each split reads at
// least kMinChunkBlocks blocks so its Q load stays small next to its KV reads. The last split of
// a tile also does the tree tail. Partial slots (requests with splits_b > 1) <= target.
// `waves` is 1 unless an estimate (pass 1b) says a few more, smaller items are clearly faster.
// At most kp.max_waves (kMaxWaves, fewer with several CTAs per SM); the plan sizes the partial
// slots for that.
//
// The last wave: when the items fill F >= 1 whole waves of the grid G and R < G more, the R items
// after the first F G are each cut into q = min(G / R, (smallest item) / kMinChunkBlocks) pieces
// (WorkRefine in verify_kernel_params.h), so the last wave runs R q <= G short pieces instead of R
// whole items on R CTAs while the others wait: 8 x 16 x 65 at 32K has 136 row tiles for 132
// CTAs, and runs 132 whole tiles, then 4 tiles in 33 pieces each. The R items are consecutive
// in the list (tiles of the same splits), and piece k of each starts at the same key, so the
// tiles that share KV blocks still read them at the same time (the L2 serves the others; see
// docs/verify-kernel.md, "Idle CTAs"). The estimate (pass 1b) weighs, for each wave choice, the
// splits rounded down (as above) and rounded up (so that a few items spill into a refined last
// wave): F x (largest item + overhead) + the last wave's (largest piece + overhead).
//
// Pair mode (kp.pair_rows > 0, the cluster family): a request whose rows (q_len * H) fit in
// pair_rows and whose share is at least one item gets an even number of splits, and each work
// item carries two consecutive splits, one per row group of the CTA pair:
//   pairs_b = max(1, min(floor(pblocks_b * target_items / total), floor(pblocks_b / (2 *
//   kMinChunkBlocks))))
// items_b = pairs_b, splits_b = 2 * pairs_b, partial slots 2 * pairs_b <= 2 * target_items.
#include <climits>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/smxx/kernels.h"

namespace treemla::cuda {

namespace {

constexpr int kSchedThreads = 256;
// The candidates, their estimates and the choice: cuda/common/schedule_model.h (shared with the
// host model behind `treemla schedule`).

// A request's work items, partial slots and combine groups, scanned in one pass (pass 2).
struct Counts {
  int items, parts, groups;
};
__device__ __forceinline__ Counts operator+(const Counts& a, const Counts& b) {
  return Counts{a.items + b.items, a.parts + b.parts, a.groups + b.groups};
}

// The combine groups of the call (CombineGroup, verify_kernel_params.h), one thread a group, from
// the entries the kernel wrote above: what the combine kernel would otherwise look up with a chain
// of dependent loads a row.
// num_groups, refined (the last wave is cut into pieces) and rf: what thread 0 wrote to the
// header and kp.refine, passed through shared memory rather than read back from global memory.
__device__ void write_combine_groups(const VerifyKernelParams& kp, int batch, int num_groups,
                                     bool refined, const WorkRefine& rf) {
  for (int grp = threadIdx.x; grp < num_groups; grp += kSchedThreads) {
    CombineGroup g{};
    g.q = refined ? max(rf.q, 1) : 1;
    g.extra_base = refined ? rf.extra_base : 0;
    if (!refined || grp < rf.base_groups) {
      const int b = find_base(kp.group_base, batch, grp);
      const RequestSched rs = kp.sched[b];
      g.tile = grp - kp.group_base[b];
      g.tiles = rs.tiles;
      g.part0 = rs.part_base + static_cast<long long>(g.tile);
      g.s0 = g.n = rs.splits;
      g.q_start = rs.q_start;
      g.q_len = rs.q_len;
      if (refined) {
        // 32-bit: work item indices are below num_items (an int).
        const int ib = kp.item_base[b] + g.tile;  // split 0's item
        g.item0 = ib - rf.first;
        if (ib + (rs.splits - 1) * rs.tiles >= rf.first)
          g.s0 = ib >= rf.first ? 0 : (rf.first - ib + rs.tiles - 1) / rs.tiles;
        g.n = g.s0 + (rs.splits - g.s0) * g.q;
      }
    } else {
      const int r = grp - rf.base_groups;
      const int item = rf.first + r;
      const int b = find_base(kp.item_base, batch, item);
      const RequestSched rs = kp.sched[b];
      g.tile = item - kp.item_base[b];  // one split: the item's index in the request is its tile
      g.tiles = 1;
      g.part0 = 0;
      g.item0 = r;
      g.s0 = 0;
      g.n = rs.splits == 1 ? g.q : 0;
      g.q_start = rs.q_start;
      g.q_len = rs.q_len;
    }
    kp.groups[grp] = g;
  }
}

__global__ void __launch_bounds__(kSchedThreads, 1)
    verify_schedule_kernel(const __grid_constant__ VerifyKernelParams kp) {
  using Reduce = cub::BlockReduce<long long, kSchedThreads>;
  using Scan = cub::BlockScan<Counts, kSchedThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ long long s_total;
  __shared__ Counts s_carry;
  __shared__ unsigned s_cand_items[kNumCandidates], s_cand_parts[kNumCandidates];
  __shared__ int s_cand_max[kNumCandidates], s_cand_min[kNumCandidates];
  __shared__ Estimate s_cand_est[kNumCandidates];
  __shared__ int s_cand;        // the chosen candidate
  __shared__ int s_refine_q;    // its last wave's pieces an item (1: not refined)
  __shared__ WorkRefine s_rf;   // the refinement, the group count and whether it cuts any item,
  __shared__ int s_num_groups;  // as written to kp.refine and the header
  __shared__ int s_num_items;
  __shared__ bool s_refined;
  // The main kernel may start launching now; it waits for this kernel's completion (pdl_wait)
  // before it reads the work list.
  pdl_launch_dependents();

  const int batch = kp.p.batch;
  const int H = kp.p.num_heads;
  const int block_n = 32;
  const int* ip = kp.p.q_indptr;
  const bool with_prefix = kp.p.part != VerifyPart::kTail;

  // Pass 1: per-request shape, checks, total cost. Each thread keeps its first request (all of
  // them when batch <= kSchedThreads) in registers for the passes below: the schedule is on
  // every call's critical path, and a read back of kp.sched is a round trip to the L2.
  long long cost = 0;
  RequestSched rs_own{};
  for (int b = threadIdx.x; b < batch; b += kSchedThreads) {
    const int lo = ip[b], hi = ip[b + 1];
    int prefix = kp.p.prefix_lens[b];
    int q_len = hi - lo;
    if (b == 0 && lo != 0) {
      record_status(kp.hdr, kStatusBadIndptr, 0, lo, 0);
      q_len = 0;
    }
    if (q_len < 0) {
      record_status(kp.hdr, kStatusBadIndptr, b, lo, hi);
      q_len = 0;
    }
    if (q_len > kp.max_q_len) {  // limits.max_q_len, at most kMaxTreeNodes
      record_status(kp.hdr, kStatusQLen, b, q_len, kp.max_q_len);
      q_len = 0;
    }
    if (hi > kp.max_total_q) {
      record_status(kp.hdr, kStatusTotalQ, b, hi, kp.max_total_q);
      q_len = 0;
    }
    if (prefix < 0 || prefix > kMaxPrefixLen) {
      record_status(kp.hdr, kStatusPrefix, b, prefix, kMaxPrefixLen);
      q_len = 0;
      prefix = 0;
    }
    RequestSched rs{};
    rs.pair = 0;
    rs.q_start = lo;
    rs.q_len = q_len;
    rs.prefix_len = prefix;
    rs.tiles = (q_len * H + kBlockM - 1) / kBlockM;
    rs.pblocks = with_prefix ? (prefix + block_n - 1) / block_n : 0;
    kp.sched[b] = rs;
    if (b == static_cast<int>(threadIdx.x)) rs_own = rs;
    cost += static_cast<long long>(rs.tiles) * rs.pblocks;
  }
  const long long total = Reduce(tmp.reduce).Sum(cost);
  if (threadIdx.x == 0) {
    s_total = total;
    for (int k = 0; k < kNumCandidates; ++k) {
      s_cand_items[k] = s_cand_parts[k] = 0;
      s_cand_max[k] = 0;
      s_cand_min[k] = INT_MAX;
    }
  }
  __syncthreads();
  const long long total_cost = s_total > 0 ? s_total : 1;

  // Pass 1b: how many waves to aim for. For each candidate (a wave choice k, splits rounded down
  // or up), the splits below give an item count, the largest and smallest item and the partial
  // slots; the estimate (candidate_estimate) is the waves of the largest item, the last one
  // refined when it can be. One wave rounded down (candidate 0) unless another is clearly (3%)
  // better. Each warp reduces its requests' figures before one thread adds them in.
  const double grid_share = static_cast<double>(kp.target_items) / static_cast<double>(total_cost);
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < batch; base += kSchedThreads) {
    const int b = base + threadIdx.x;
    RequestSched rs{};
    if (b < batch) rs = base == 0 ? rs_own : kp.sched[b];
    const bool live = b < batch && rs.q_len > 0;
    if (!__any_sync(0xffffffffu, live)) continue;  // warp-uniform: no request of this warp counts
    const double x = static_cast<double>(rs.pblocks) * grid_share;
    // Unrolled over the candidates (compile-time wave counts), so their reductions overlap: this
    // pass is on every call's critical path.
#pragma unroll
    for (int c = 0; c < kNumCandidates; ++c) {
      const int splits = live ? splits_for(rs.pblocks, x, cand_waves(c), cand_up(c)) : 1;
      // A request's items are at most about k x grid + its tiles (its share x <= grid / tiles),
      // so the batch's sums stay far below 2^31 (at most 8 grids plus every row tile).
      const unsigned items = live ? static_cast<unsigned>(rs.tiles * splits) : 0u;
      const unsigned parts = live && splits > 1 ? items : 0u;
      const int imax = live ? (rs.pblocks + splits - 1) / splits : 0;
      const int imin = live ? rs.pblocks / splits : INT_MAX;
      const unsigned w_items = __reduce_add_sync(0xffffffffu, items);
      const unsigned w_parts = __reduce_add_sync(0xffffffffu, parts);
      const int w_max = __reduce_max_sync(0xffffffffu, imax);
      const int w_min = __reduce_min_sync(0xffffffffu, imin);
      if (lane == 0 && cand_waves(c) <= kp.max_waves) {
        atomicAdd(&s_cand_items[c], w_items);
        atomicAdd(&s_cand_parts[c], w_parts);
        atomicMax(&s_cand_max[c], w_max);
        atomicMin(&s_cand_min[c], w_min);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kNumCandidates) {
    const int c = threadIdx.x;
    s_cand_est[c] =
        cand_waves(c) <= kp.max_waves
            ? candidate_estimate(s_cand_items[c], s_cand_max[c], s_cand_min[c], s_cand_parts[c],
                                 kp.target_items, kp.partial_slots, kp.pair_rows == 0)
            : Estimate{-1, -1, 1};
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The plain estimates in order, a later candidate taken only when 3% better; a refined last
    // wave only when its estimate is under kp.refine_pct % of that (choose_candidate,
    // schedule_model.h; VerifyGpu.ScheduleMatchesHostModel checks the kernel against the host
    // model that uses the same function). Pair mode keeps one wave, rounded down, unrefined.
    const Choice ch = choose_candidate(s_cand_est, kp.refine_pct, kp.pair_rows > 0);
    s_cand = ch.cand;
    s_refine_q = ch.refine_q;
  }
  __syncthreads();
  const int waves = cand_waves(s_cand);
  const bool round_up = cand_up(s_cand);
  const long long target = static_cast<long long>(waves) * kp.target_items;

  // Pass 2: splits and one exclusive scan of items, partial slots and combine groups.
  if (threadIdx.x == 0) s_carry = Counts{0, 0, 0};
  __syncthreads();
  for (int base = 0; base < batch; base += kSchedThreads) {
    const int b = base + threadIdx.x;
    Counts mine{0, 0, 0};
    RequestSched rs{};
    if (b < batch) {
      rs = base == 0 ? rs_own : kp.sched[b];
      const long long by_share = static_cast<long long>(rs.pblocks) * target / total_cost;
      const long long by_min = rs.pblocks / kMinChunkBlocks;
      rs.pair = kp.pair_rows > 0 && rs.q_len > 0 && rs.q_len * H <= kp.pair_rows && by_share >= 1 &&
                rs.pblocks >= 2 * kMinChunkBlocks;
      if (rs.pair) {
        rs.splits = 2 * static_cast<int>(max(1LL, min(by_share, by_min / 2)));
        mine.items = rs.tiles * rs.splits / 2;
      } else {
        rs.splits =
            splits_for(rs.pblocks, static_cast<double>(rs.pblocks) * grid_share, waves, round_up);
        mine.items = rs.tiles * rs.splits;
      }
      rs.align = kp.split_align;
      mine.parts = rs.splits > 1 ? rs.tiles * rs.splits : 0;
      mine.groups = rs.splits > 1 ? rs.tiles : 0;
    }
    Counts ex, agg;
    Scan(tmp.scan).ExclusiveSum(mine, ex, agg);
    if (b < batch) {
      rs.part_base = s_carry.parts + ex.parts;
      kp.sched[b] = rs;
      kp.item_base[b] = s_carry.items + ex.items;
      kp.group_base[b] = s_carry.groups + ex.groups;
    }
    __syncthreads();
    if (threadIdx.x == 0) s_carry = s_carry + agg;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    kp.item_base[batch] = s_carry.items;
    kp.group_base[batch] = s_carry.groups;
    int items = s_carry.items, groups = s_carry.groups;
    // The last wave (header): the items after F whole waves, each cut into q pieces.
    WorkRefine rf{};
    rf.first = items;
    rf.count = 0;
    rf.q = 1;
    rf.extra_base = s_carry.parts;
    rf.base_groups = groups;
    const int g = kp.target_items > 0 ? kp.target_items : 1;
    if (s_refine_q > 1 && items > g && items % g != 0) {
      rf.first = items / g * g;
      rf.count = items - rf.first;
      rf.q = s_refine_q;
      items = rf.first + rf.count * rf.q;
      groups += rf.count;
    }
    // The tree tail's weight (tail_weight, schedule_model.h) goes only into the item table: a call
    // with items past it, which the main kernels look up themselves, and the families that do not
    // read the table (cpasync, and the cluster family's pairs: weights 0, dispatch.h) cut their
    // splits unweighted. Recorded here for the tests (gpu_case.h, tail_weight_of).
    const bool weigh =
        kp.p.part != VerifyPart::kPrefix && kp.pair_rows == 0 && items <= kp.item_capacity;
    rf.tail_one = weigh ? kp.tail_w_one : 0;
    rf.tail_tree = weigh ? kp.tail_w_tree : 0;
    *kp.refine = rf;
    kp.hdr->refine_first = rf.first;
    const int slots = rf.extra_base + rf.count * rf.q;
    if (slots > kp.partial_slots) {
      record_status(kp.hdr, kStatusPartials, -1, slots, kp.partial_slots);
      items = 0;
      groups = 0;
    }
    kp.hdr->num_items = items;
    kp.hdr->num_groups = groups;
    kp.hdr->counter = 0;
    s_rf = rf;
    s_num_groups = groups;
    s_num_items = items;
    s_refined = rf.first < items;
  }
  __syncthreads();  // the requests' entries, the bases, the refinement and the header
  write_combine_groups(kp, batch, s_num_groups, s_refined, s_rf);
  // The item table (WorkItem, verify_kernel_params.h): each item resolved once here, so that a
  // main kernel reads it without the lookups (fetch_item). Pair-mode items (the cluster family,
  // which looks its items up itself) are not in it.
  if (kp.pair_rows == 0) {
    const int n = min(s_num_items, kp.item_capacity);
    for (int i = threadIdx.x; i < n; i += kSchedThreads)
      kp.items[i] = resolve_work_item(kp, i, s_rf.first, s_rf.tail_one, s_rf.tail_tree);
  }
}

}  // namespace

void launch_verify_schedule(const VerifyKernelParams& kp, cudaStream_t stream) {
  // Launched in stream order (no programmatic dependency): it rewrites the work list that the
  // previous call's kernels read.
  verify_schedule_kernel<<<1, kSchedThreads, 0, stream>>>(kp);
}

}  // namespace treemla::cuda
