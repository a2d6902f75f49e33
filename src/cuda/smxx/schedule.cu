// Schedule kernel (architecture-generic): one CTA reads the per-request lengths from device
// memory and writes the work list of the main kernel into the workspace, so a captured graph
// replays correctly with new lengths. No host synchronization.
//
// Cost model: a (request, row tile) pair costs one unit per 32-row prefix block; total is the
// sum over the batch. With target = waves * target_items, request b's prefix is cut into
//   splits_b = max(1, min(floor(pblocks_b * target / total), floor(pblocks_b / kMinChunkBlocks)))
// near-equal ranges (split s covers blocks [s * pblocks / splits, (s + 1) * pblocks / splits)),
// so items = sum tiles_b * splits_b never exceeds target (whole waves of the persistent grid, no
// straggler wave) unless requests with splits_b = 1 alone need more, and each split reads at
// least kMinChunkBlocks blocks so its Q load stays small next to its KV reads. The last split of
// a tile also does the tree tail. Partial slots (requests with splits_b > 1) <= target.
// `waves` is 1 unless an estimate (pass 1b: waves needed x the largest item) says a few more,
// smaller items are clearly faster: e.g. 136 row tiles on 132 CTAs would otherwise run a second
// wave of 4 whole tiles. At most kp.max_waves (kMaxWaves, fewer with several CTAs per SM); the
// plan sizes the partial slots for that.
//
// Pair mode (kp.pair_rows > 0, the cluster family): a request whose rows (q_len * H) fit in
// pair_rows and whose share is at least one item gets an even number of splits, and each work
// item carries two consecutive splits, one per row group of the CTA pair:
//   pairs_b = max(1, min(floor(pblocks_b * target_items / total), floor(pblocks_b / (2 *
//   kMinChunkBlocks))))
// items_b = pairs_b, splits_b = 2 * pairs_b, partial slots 2 * pairs_b <= 2 * target_items.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/smxx/kernels.h"

namespace treemla::cuda {

namespace {

constexpr int kSchedThreads = 256;
// Wave counts the schedule chooses from (kMaxWaves in verify_kernel_params.h is the largest: the
// partial slots are sized for it), and a work item's fixed cost in prefix blocks (its Q load,
// pipeline fill and partial output) for the estimate.
constexpr int kNumWaveChoices = 6;
__constant__ const int kWaveChoices[kNumWaveChoices] = {1, 2, 3, 4, 6, kMaxWaves};
constexpr int kItemOverheadBlocks = 8;

// Splits of a request with `pblocks` prefix blocks for a target item count (see the header).
__device__ __forceinline__ int splits_for(int pblocks, long long target, long long total_cost) {
  const long long by_share = static_cast<long long>(pblocks) * target / total_cost;
  const long long by_min = pblocks / kMinChunkBlocks;
  return static_cast<int>(max(1LL, min(by_share, by_min)));
}

__global__ void __launch_bounds__(kSchedThreads)
    verify_schedule_kernel(const __grid_constant__ VerifyKernelParams kp) {
  using Reduce = cub::BlockReduce<long long, kSchedThreads>;
  using Scan = cub::BlockScan<int, kSchedThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ long long s_total;
  __shared__ int s_carry[3];
  __shared__ unsigned long long s_wave_items[kNumWaveChoices];
  __shared__ int s_wave_item_max[kNumWaveChoices];
  __shared__ int s_waves;
  // The main kernel may start launching now; it waits for this kernel's completion (pdl_wait)
  // before it reads the work list.
  pdl_launch_dependents();

  const int batch = kp.p.batch;
  const int H = kp.p.num_heads;
  const int block_n = 32;
  const int* ip = kp.p.q_indptr;
  const bool with_prefix = kp.p.part != VerifyPart::kTail;

  // Pass 1: per-request shape, checks, total cost.
  long long cost = 0;
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
    cost += static_cast<long long>(rs.tiles) * rs.pblocks;
  }
  const long long total = Reduce(tmp.reduce).Sum(cost);
  if (threadIdx.x == 0) {
    s_total = total;
    for (int k = 0; k < kNumWaveChoices; ++k) {
      s_wave_items[k] = 0;
      s_wave_item_max[k] = 0;
    }
  }
  __syncthreads();
  const long long total_cost = s_total > 0 ? s_total : 1;

  // Pass 1b: how many waves to aim for. For each choice k, the splits below with a target of
  // k * target_items give an item count and a largest item; the estimate is
  // ceil(items / target_items) waves of that largest item (plus kItemOverheadBlocks). One wave
  // (k = 1) unless more waves are clearly better, as when the row tiles alone outnumber the CTAs.
  for (int b = threadIdx.x; b < batch; b += kSchedThreads) {
    const RequestSched rs = kp.sched[b];
    if (rs.q_len == 0) continue;
    for (int k = 0; k < kNumWaveChoices && kWaveChoices[k] <= kp.max_waves; ++k) {
      const int splits = splits_for(rs.pblocks, kWaveChoices[k] * kp.target_items, total_cost);
      atomicAdd(&s_wave_items[k], static_cast<unsigned long long>(rs.tiles) * splits);
      atomicMax(&s_wave_item_max[k], (rs.pblocks + splits - 1) / splits + kItemOverheadBlocks);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const long long t = kp.target_items > 0 ? kp.target_items : 1;
    int best = 0;
    long long best_est = -1;
    for (int k = 0; k < kNumWaveChoices && kWaveChoices[k] <= kp.max_waves; ++k) {
      const long long waves = (static_cast<long long>(s_wave_items[k]) + t - 1) / t;
      const long long est = waves * s_wave_item_max[k];
      if (best_est < 0 || est * 100 < best_est * 97) {  // a later choice must win by 3%
        best = k;
        best_est = est;
      }
    }
    s_waves = kp.pair_rows > 0 ? 1 : kWaveChoices[best];  // pair mode keeps one wave
  }
  __syncthreads();
  const long long target = static_cast<long long>(s_waves) * kp.target_items;

  // Pass 2: splits and exclusive scans of items, partial slots and combine groups.
  if (threadIdx.x == 0) s_carry[0] = s_carry[1] = s_carry[2] = 0;
  __syncthreads();
  for (int base = 0; base < batch; base += kSchedThreads) {
    const int b = base + threadIdx.x;
    int items = 0, parts = 0, groups = 0;
    RequestSched rs{};
    if (b < batch) {
      rs = kp.sched[b];
      const long long by_share = static_cast<long long>(rs.pblocks) * target / total_cost;
      const long long by_min = rs.pblocks / kMinChunkBlocks;
      rs.pair = kp.pair_rows > 0 && rs.q_len > 0 && rs.q_len * H <= kp.pair_rows && by_share >= 1 &&
                rs.pblocks >= 2 * kMinChunkBlocks;
      if (rs.pair) {
        rs.splits = 2 * static_cast<int>(max(1LL, min(by_share, by_min / 2)));
        items = rs.tiles * rs.splits / 2;
      } else {
        rs.splits = splits_for(rs.pblocks, target, total_cost);
        items = rs.tiles * rs.splits;
      }
      parts = rs.splits > 1 ? rs.tiles * rs.splits : 0;
      groups = rs.splits > 1 ? rs.tiles : 0;
    }
    int ex_items, ex_parts, ex_groups, agg_items, agg_parts, agg_groups;
    Scan(tmp.scan).ExclusiveSum(items, ex_items, agg_items);
    __syncthreads();
    Scan(tmp.scan).ExclusiveSum(parts, ex_parts, agg_parts);
    __syncthreads();
    Scan(tmp.scan).ExclusiveSum(groups, ex_groups, agg_groups);
    if (b < batch) {
      rs.part_base = s_carry[1] + ex_parts;
      kp.sched[b] = rs;
      kp.item_base[b] = s_carry[0] + ex_items;
      kp.group_base[b] = s_carry[2] + ex_groups;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      s_carry[0] += agg_items;
      s_carry[1] += agg_parts;
      s_carry[2] += agg_groups;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    kp.item_base[batch] = s_carry[0];
    kp.group_base[batch] = s_carry[2];
    int items = s_carry[0], groups = s_carry[2];
    if (s_carry[1] > kp.partial_slots) {
      record_status(kp.hdr, kStatusPartials, -1, s_carry[1], kp.partial_slots);
      items = 0;
      groups = 0;
    }
    kp.hdr->num_items = items;
    kp.hdr->num_groups = groups;
    kp.hdr->counter = 0;
  }
}

}  // namespace

void launch_verify_schedule(const VerifyKernelParams& kp, cudaStream_t stream) {
  // Launched in stream order (no programmatic dependency): it rewrites the work list that the
  // previous call's kernels read.
  verify_schedule_kernel<<<1, kSchedThreads, 0, stream>>>(kp);
}

}  // namespace treemla::cuda
