// Combine kernel (architecture-generic): merges the split partial states of every
// (request, row tile) group with more than one split into the final O and LSE.
// Grid: a fixed number of CTAs (graph safe); each warp of the grid takes one (group, row) at a
// time, strided over all of them; each lane owns 16 of the 512 output columns. Partial LSEs are
// log2-domain; an empty partial (-inf) gets weight 0; if all are empty the row is O = 0, LSE =
// -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/mma.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/smxx/kernels.h"

namespace treemla::cuda {

namespace {

constexpr int kCombineThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    verify_combine_kernel(const __grid_constant__ VerifyKernelParams kp) {
  constexpr int kWarps = kCombineThreads / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  pdl_wait();  // the main kernel has completed
  pdl_launch_dependents();
  const int num_groups = kp.hdr->num_groups;
  const int H = kp.p.num_heads;
  constexpr float kLn2 = 0.69314718055994530942f;
  // One row of one group per warp, strided over every warp of the grid: a few groups of many
  // splits (one long request) still spread over all SMs.
  const long long total_rows = static_cast<long long>(num_groups) * kBlockM;
  for (long long gr = static_cast<long long>(blockIdx.x) * kWarps + warp; gr < total_rows;
       gr += static_cast<long long>(gridDim.x) * kWarps) {
    const int grp = static_cast<int>(gr / kBlockM), rl = static_cast<int>(gr % kBlockM);
    const int b = find_base(kp.group_base, kp.p.batch, grp);
    const RequestSched rs = kp.sched[b];
    const int tile = grp - kp.group_base[b];
    const int r = tile * kBlockM + rl;
    if (r >= rs.q_len * H) continue;
    auto slot_of = [&](int s) { return rs.part_base + static_cast<int64_t>(s) * rs.tiles + tile; };
    float mx = -INFINITY;
    for (int s = lane; s < rs.splits; s += 32)
      mx = fmaxf(mx, kp.part_lse[slot_of(s) * kBlockM + rl]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const int64_t grow = static_cast<int64_t>(rs.q_start) * H + r;
    T* out = static_cast<T*>(kp.o) + grow * kHeadDimV;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    float sum = 0.f;
    if (mx != -INFINITY) {
      // Partials are finite (an empty split wrote O = 0), so weight-0 ones need no skip and the
      // loop unrolls: several splits' loads in flight at once.
#pragma unroll 4
      for (int s = 0; s < rs.splits; ++s) {
        const int64_t slot = slot_of(s);
        const float w = exp2f(kp.part_lse[slot * kBlockM + rl] - mx);
        sum += w;
        const float4* src =
            reinterpret_cast<const float4*>(kp.part_o + (slot * kBlockM + rl) * kHeadDimV);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 v = src[lane + 32 * i];
          acc[4 * i] += w * v.x;
          acc[4 * i + 1] += w * v.y;
          acc[4 * i + 2] += w * v.z;
          acc[4 * i + 3] += w * v.w;
        }
      }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 4 * (lane + 32 * i);
      uint2 packed;
      packed.x = pack2<T>(acc[4 * i] * inv, acc[4 * i + 1] * inv);
      packed.y = pack2<T>(acc[4 * i + 2] * inv, acc[4 * i + 3] * inv);
      *reinterpret_cast<uint2*>(out + col) = packed;
    }
    if (lane == 0) kp.lse[grow] = sum > 0.f ? (mx + log2f(sum)) * kLn2 : -INFINITY;
  }
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
