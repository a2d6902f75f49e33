// Combine kernel (architecture-generic): merges the split partial states of every
// (request, row tile) group with more than one split into the final O and LSE.
// Grid: a fixed number of CTAs (graph safe). Each warp of the grid takes one (group, row) at a
// time, strided over all of them (a group's rows: at most max_q_len x H of its 64, so a decode
// plan's warps are not spent on rows no tile has), each lane owning 16 of the 512 output columns;
// when the rows are few (four warps a row fit in the grid at once) each row is taken by four
// neighbouring warps instead, one 128-column quarter each, a float4 a lane, so that four times the
// warps have loads in flight (1 x 16 x 16 x 131072 on the H200: 4 groups x 33 splits, 256 rows for
// 1,056 warps). With many rows the one-warp form is faster (fewer per-row setup loads a warp):
// measured, docs/verify-kernel.md. A row's chain of dependent loads is kept short: its request
// is found by a warp-wide search (one round trip for up to 32 requests, find_base_warp), and the
// splits are merged in one pass with a running maximum, so their loads do not wait for a pass
// over the LSEs. Both forms add the splits in split order. Partial LSEs are log2-domain; an
// empty partial (-inf) gets weight 0; if all are empty the row is O = 0, LSE = -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/mma.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/smxx/kernels.h"

namespace treemla::cuda {

namespace {

constexpr int kCombineThreads = 256;

// The partial slots of combine group `grp`: n of them (0: nothing to merge here), slot(f) for
// f < n. Groups below refine.base_groups are the (request, tile) pairs of requests with several
// splits: split f < s0 wrote slot part_base + f * tiles + tile; the splits from s0 on are work
// items of the refined last wave (WorkRefine), each cut into q pieces with consecutive slots.
// Group base_groups + r is refined item r when its request has one split (else that item is
// merged with its tile's group above, and n = 0).
struct GroupSlots {
  int b, tile, n, s0, q, tiles;
  int64_t part0;  // slot of split 0 (part_base + tile)
  int item0;      // work item of split 0, minus refine.first
  int extra_base;
  RequestSched rs;  // request b's schedule entry
  __device__ __forceinline__ int64_t slot(int f) const {
    if (f < s0) return part0 + static_cast<int64_t>(f) * tiles;
    const int j = (f - s0) / q;  // the refined split, and piece f - s0 - j q of it
    return extra_base + static_cast<int64_t>(item0 + (s0 + j) * tiles) * q + (f - s0 - j * q);
  }
};
// Group grp as (request, tile) of a request with several splits: every split a plain slot.
__device__ __forceinline__ void split_group(const VerifyKernelParams& kp, int grp, GroupSlots& g,
                                            int lane) {
  g.b = find_base_warp(kp.group_base, kp.p.batch, grp, lane);
  g.rs = kp.sched[g.b];
  g.tile = grp - kp.group_base[g.b];
  g.tiles = g.rs.tiles;
  g.part0 = g.rs.part_base + static_cast<int64_t>(g.tile);
  g.s0 = g.n = g.rs.splits;
}
__device__ __forceinline__ GroupSlots group_slots(const VerifyKernelParams& kp, int grp,
                                                  bool refined, int lane) {
  GroupSlots g;
  g.q = 1;
  g.item0 = 0;
  g.extra_base = 0;
  if (!refined) {
    // Most calls (refine_first >= num_items, from the header): no load waits for the refinement.
    split_group(kp, grp, g, lane);
    return g;
  }
  const WorkRefine rf = *kp.refine;
  g.q = max(rf.q, 1);
  g.extra_base = rf.extra_base;
  if (grp < rf.base_groups) {
    split_group(kp, grp, g, lane);
    const RequestSched& rs = g.rs;
    // 32-bit: work item indices are below num_items (an int).
    const int ib = kp.item_base[g.b] + g.tile;  // split 0's item
    g.item0 = ib - rf.first;
    if (ib + (rs.splits - 1) * rs.tiles >= rf.first)
      g.s0 = ib >= rf.first ? 0 : (rf.first - ib + rs.tiles - 1) / rs.tiles;
    g.n = g.s0 + (rs.splits - g.s0) * g.q;
  } else {
    const int r = grp - rf.base_groups;
    const int item = rf.first + r;
    g.b = find_base_warp(kp.item_base, kp.p.batch, item, lane);
    g.rs = kp.sched[g.b];
    g.tile = item - kp.item_base[g.b];  // one split: the item's index in the request is its tile
    g.tiles = 1;
    g.part0 = 0;
    g.item0 = r;
    g.s0 = 0;
    g.n = g.rs.splits == 1 ? g.q : 0;
  }
  return g;
}

// Merges row `rl` of group `grp`: all 512 columns (kParts = 1: 16 a lane, float4 indices lane +
// 32 i, i < 4) or the 128 of part `part` (kParts = 4: a float4 a lane, index 32 part + lane). One
// pass over the splits in order with a running maximum (online merge): the loads of a split's LSE
// and partial row depend on nothing before them, so the unrolled loop keeps several splits' loads
// in flight and no separate pass over the LSEs (their maximum) sits in the row's chain of loads.
// The additions run in split order, so the result does not depend on timing. One unrolled loop
// over the plain splits and a rolled one over the refined pieces: code size shows in every call,
// even one with nothing to merge (docs/verify-kernel.md, "The combine kernel").
template <typename T, int kParts>
__device__ __forceinline__ void combine_row(const VerifyKernelParams& kp, int grp, int rl, int part,
                                            int lane, bool refined) {
  constexpr int kF4 = 4 / kParts;  // float4 a lane and split
  constexpr float kLn2 = 0.69314718055994530942f;
  const int H = kp.p.num_heads;
  const GroupSlots gs = group_slots(kp, grp, refined, lane);
  if (gs.n == 0) return;
  const RequestSched& rs = gs.rs;
  const int r = gs.tile * kBlockM + rl;
  if (r >= rs.q_len * H) return;
  const int64_t grow = static_cast<int64_t>(rs.q_start) * H + r;
  T* out = static_cast<T*>(kp.o) + grow * kHeadDimV;
  const int f0 = 32 * part + lane;  // the lane's first float4 of the row
  float acc[4 * kF4];
#pragma unroll
  for (int i = 0; i < 4 * kF4; ++i) acc[i] = 0.f;
  float m = -INFINITY, sum = 0.f;
  // Adds partial `slot`: the running state moves to max(m, lse) and the split enters at
  // 2^(lse - max). A row that no split has seen keeps max -inf and state 0 (both factors are 0,
  // not NaN). Partials are finite (an empty split wrote O = 0), so none is skipped and the plain
  // loop unrolls.
  auto add = [&](int64_t slot) {
    const float lse = kp.part_lse[slot * kBlockM + rl];
    const float4* src =
        reinterpret_cast<const float4*>(kp.part_o + (slot * kBlockM + rl) * kHeadDimV);
    float4 v[kF4];
#pragma unroll
    for (int i = 0; i < kF4; ++i) v[i] = src[f0 + 32 * i];
    const float mn = fmaxf(m, lse);
    const float base = mn == -INFINITY ? 0.f : mn;
    const float a = exp2f(m - base), w = exp2f(lse - base);
    sum = fmaf(sum, a, w);
#pragma unroll
    for (int i = 0; i < kF4; ++i) {
      acc[4 * i] = fmaf(acc[4 * i], a, w * v[i].x);
      acc[4 * i + 1] = fmaf(acc[4 * i + 1], a, w * v[i].y);
      acc[4 * i + 2] = fmaf(acc[4 * i + 2], a, w * v[i].z);
      acc[4 * i + 3] = fmaf(acc[4 * i + 3], a, w * v[i].w);
    }
    m = mn;
  };
#pragma unroll(kParts == 1 ? 2 : 8)
  for (int f = 0; f < gs.s0; ++f) add(gs.part0 + static_cast<int64_t>(f) * gs.tiles);
#pragma unroll 1
  for (int f = gs.s0; f < gs.n; ++f) add(gs.slot(f));
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
  for (int i = 0; i < kF4; ++i) {
    const int col = 4 * (f0 + 32 * i);
    uint2 packed;
    packed.x = pack2<T>(acc[4 * i] * inv, acc[4 * i + 1] * inv);
    packed.y = pack2<T>(acc[4 * i + 2] * inv, acc[4 * i + 3] * inv);
    *reinterpret_cast<uint2*>(out + col) = packed;
  }
  if (part == 0 && lane == 0) kp.lse[grow] = sum > 0.f ? (m + log2f(sum)) * kLn2 : -INFINITY;
}

// The merge of every group (the kernel's work when some request has several splits). Out of
// line: the kernel's idle path (no group) is then a few instructions at its entry instead of a
// jump past this code. Measured in the fourteenth session, that did not change the cost of an
// idle combine (docs/verify-kernel.md, "The combine kernel"); it stays because its build is the
// one the GPU tests ran on.
template <typename T>
__device__ __noinline__ void combine_groups(const VerifyKernelParams& kp, int num_groups) {
  constexpr int kWarps = kCombineThreads / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Rows of a group that can hold a row: a row tile has at most max_q_len x H rows (a decode
  // plan's tiles have 16 or fewer), so the warps are spread over those rows only.
  const int group_rows =
      static_cast<int>(min(static_cast<long long>(kBlockM),
                           static_cast<long long>(max(kp.max_q_len, 1)) * kp.p.num_heads));
  const long long total_rows = static_cast<long long>(num_groups) * group_rows;
  const bool refined = kp.hdr->refine_first < kp.hdr->num_items;  // a refined last wave
  const long long grid_warps = static_cast<long long>(gridDim.x) * kWarps;
  const long long first = static_cast<long long>(blockIdx.x) * kWarps + warp;
  // Rows strided over every warp of the grid: a few groups of many splits (one long request)
  // still spread over all SMs.
  if (4 * total_rows <= grid_warps) {
    for (long long task = first; task < 4 * total_rows; task += grid_warps) {
      const long long gr = task >> 2;
      combine_row<T, 4>(kp, static_cast<int>(gr / group_rows), static_cast<int>(gr % group_rows),
                        static_cast<int>(task & 3), lane, refined);
    }
  } else {
    for (long long gr = first; gr < total_rows; gr += grid_warps)
      combine_row<T, 1>(kp, static_cast<int>(gr / group_rows), static_cast<int>(gr % group_rows), 0,
                        lane, refined);
  }
}

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    verify_combine_kernel(const __grid_constant__ VerifyKernelParams kp) {
  pdl_wait();  // the main kernel has completed
  pdl_launch_dependents();
  const int num_groups = kp.hdr->num_groups;
  if (num_groups > 0) combine_groups<T>(kp, num_groups);
  // Every main-kernel CTA has finished (kernel boundary): reset its counter for the next run.
  if (blockIdx.x == 0 && threadIdx.x == 0) kp.hdr->counter = 0;
}

}  // namespace

cudaError_t launch_verify_combine(const VerifyKernelParams& kp, int grid, bool pdl,
                                  cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1] = {pdl_launch_attr()};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kCombineThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  if (kp.p.dtype == DType::kBF16)
    return cudaLaunchKernelEx(&cfg, verify_combine_kernel<__nv_bfloat16>, kp);
  return cudaLaunchKernelEx(&cfg, verify_combine_kernel<__half>, kp);
}

}  // namespace treemla::cuda
