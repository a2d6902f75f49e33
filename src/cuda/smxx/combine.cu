// Combine kernel (architecture-generic): merges the split partial states of every
// (request, row tile) group with more than one split into the final O and LSE.
// Grid: a fixed number of CTAs (graph safe). Each warp of the grid takes one (group, row) at a
// time, strided over all of them (a group's rows: at most max_q_len x H of its 64, so a decode
// plan's warps are not spent on rows no tile has), each lane owning 16 of the 512 output columns;
// when the rows are few (four warps a row fit in the grid at once) each row is taken by four
// neighbouring warps instead, one 128-column quarter each, a float4 a lane, so that four times the
// warps have loads in flight (1 x 16 x 16 x 131072 on the H200: 4 groups x 33 splits, 256 rows for
// 1,056 warps). With many rows the one-warp form is faster (fewer per-row setup loads a warp):
// measured, docs/verify-kernel.md. A row's chain of dependent loads is kept short: its group's
// slots and request come from one entry of the table the schedule kernel writes (CombineGroup),
// loaded beside the header, and the splits are merged in one pass with a running maximum, their
// loads issued a batch at a time, so they do not wait for a pass over the LSEs. Both forms add
// the splits in split order. Partial LSEs are log2-domain; an
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

// Merges row `rl` of combine group `gs`: all 512 columns (kParts = 1: 16 a lane, float4 indices
// lane + 32 i, i < 4) or the 128 of part `part` (kParts = 4: a float4 a lane, index 32 part +
// lane). One pass over the splits in order with a running maximum (online merge): the loads of a
// split's LSE and partial row depend on nothing before them, so a batch of splits' loads is in
// flight at once and no separate pass over the LSEs (their maximum) sits in the row's chain.
// The additions run in split order, so the result does not depend on timing. One unrolled loop
// over the plain splits and a rolled one over the refined pieces: code size shows in every call,
// even one with nothing to merge (docs/verify-kernel.md, "The combine kernel").
template <typename T, int kParts>
__device__ __forceinline__ void combine_row(const VerifyKernelParams& kp, const CombineGroup& gs,
                                            int rl, int part, int lane) {
  constexpr int kF4 = 4 / kParts;  // float4 a lane and split
  constexpr float kLn2 = 0.69314718055994530942f;
  const int H = kp.p.num_heads;
  if (gs.n == 0) return;
  const int r = gs.tile * kBlockM + rl;
  if (r >= gs.q_len * H) return;
  const int64_t grow = static_cast<int64_t>(gs.q_start) * H + r;
  T* out = static_cast<T*>(kp.o) + grow * kHeadDimV;
  const int f0 = 32 * part + lane;  // the lane's first float4 of the row
  float acc[4 * kF4];
#pragma unroll
  for (int i = 0; i < 4 * kF4; ++i) acc[i] = 0.f;
  float m = -INFINITY, sum = 0.f;
  // Adds a partial (its LSE and the lane's float4 of its row): the running state moves to
  // max(m, lse) and the split enters at 2^(lse - max). A row that no split has seen keeps max -inf
  // and state 0 (both factors are 0, not NaN). Partials are finite (an empty split wrote O = 0).
  auto add = [&](float lse, const float4(&v)[kF4]) {
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
  auto load = [&](int64_t slot, float& lse, float4(&v)[kF4]) {
    lse = kp.part_lse[slot * kBlockM + rl];
    const float4* src =
        reinterpret_cast<const float4*>(kp.part_o + (slot * kBlockM + rl) * kHeadDimV);
#pragma unroll
    for (int i = 0; i < kF4; ++i) v[i] = src[f0 + 32 * i];
  };
  // The plain splits in batches whose loads are all issued before the first is used (one round
  // trip a batch: 8 splits with a float4 a lane, 2 with four; larger batches need more than the
  // 128 registers that keep two CTAs an SM), then the refined pieces one by one (rare, and a
  // rolled loop keeps the code small). Split order throughout.
  constexpr int kBatch = kParts == 1 ? 2 : 8;
  for (int f = 0; f < gs.s0; f += kBatch) {
    float lse[kBatch];
    float4 v[kBatch][kF4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (f + u < gs.s0) load(gs.part0 + static_cast<int64_t>(f + u) * gs.tiles, lse[u], v[u]);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (f + u < gs.s0) add(lse[u], v[u]);
  }
#pragma unroll 1
  for (int f = gs.s0; f < gs.n; ++f) {
    float lse;
    float4 v[kF4];
    load(group_slot(gs, f), lse, v);
    add(lse, v);
  }
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

// The merge of every group (the kernel's work when some request has several splits). e4, e1:
// the group entries of this warp's first row in the four-warps-a-row and the one-warp-a-row form,
// loaded beside the header (a row's chain: the header and its group's entry in one round trip,
// then its splits' partials).
template <typename T>
__device__ __forceinline__ void combine_groups(const VerifyKernelParams& kp, int num_groups,
                                               int group_rows, long long first,
                                               const CombineGroup& e4, const CombineGroup& e1) {
  constexpr int kWarps = kCombineThreads / 32;
  const int lane = threadIdx.x & 31;
  const long long total_rows = static_cast<long long>(num_groups) * group_rows;
  const long long grid_warps = static_cast<long long>(gridDim.x) * kWarps;
  // Rows strided over every warp of the grid: a few groups of many splits (one long request)
  // still spread over all SMs.
  if (4 * total_rows <= grid_warps) {
    for (long long task = first; task < 4 * total_rows; task += grid_warps) {
      const long long gr = task >> 2;
      const int grp = static_cast<int>(gr / group_rows);
      const CombineGroup g = task == first ? e4 : kp.groups[grp];
      combine_row<T, 4>(kp, g, static_cast<int>(gr % group_rows), static_cast<int>(task & 3), lane);
    }
  } else {
    for (long long gr = first; gr < total_rows; gr += grid_warps) {
      const int grp = static_cast<int>(gr / group_rows);
      const CombineGroup g = gr == first ? e1 : kp.groups[grp];
      combine_row<T, 1>(kp, g, static_cast<int>(gr % group_rows), 0, lane);
    }
  }
}

// Two CTAs an SM: the decode family's grid (the main kernel's) has two an SM.
template <typename T>
__global__ void __launch_bounds__(kCombineThreads, 2)
    verify_combine_kernel(const __grid_constant__ VerifyKernelParams kp) {
  constexpr int kWarps = kCombineThreads / 32;
  // Rows of a group that can hold a row: a row tile has at most max_q_len x H rows (a decode
  // plan's tiles have 16 or fewer), so the warps are spread over those rows only.
  const int group_rows =
      static_cast<int>(min(static_cast<long long>(kBlockM),
                           static_cast<long long>(max(kp.max_q_len, 1)) * kp.p.num_heads));
  const long long first = static_cast<long long>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  // The entries of this warp's first row in either form, loaded with the header before it is
  // known which form (or whether any group) applies; past the call's groups they are unused.
  // Only the schedule kernel writes them, and it has completed: this kernel starts once every
  // main-kernel CTA has passed its own pdl_wait on the kernel before it (the schedule, or a
  // later kernel of the stream). So they load while the main kernel finishes, and pdl_wait
  // guards the main kernel's partials only (about an L2 round trip off every call).
  const long long last = kp.partial_slots - 1;
  const CombineGroup e4 = kp.groups[min((first >> 2) / group_rows, last)];
  const CombineGroup e1 = kp.groups[min(first / group_rows, last)];
  const int num_groups = kp.hdr->num_groups;
  pdl_wait();  // the main kernel has completed: its partials are visible
  pdl_launch_dependents();
  if (num_groups > 0) combine_groups<T>(kp, num_groups, group_rows, first, e4, e1);
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
