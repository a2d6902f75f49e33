// treemla bench's helper kernels (tool_kernels.h): the ceilings measured in the same run as
// verify attention (HBM read bandwidth, the bf16 mma.sync peak, the bf16 wgmma peak on sm_90a),
// the paged-read ceiling of the decode cases, and random inputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/sm90a/wgmma.cuh"
#include "cuda/tool_kernels.h"
#include "treemla/attention.h"

namespace treemla::tool::kernels {

namespace {

__global__ void hbm_read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = i + k * stride < n ? __ldcs(src + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (acc == 0x12345679u) sink[0] = acc;  // keeps the loads alive
}

__global__ void mma_peak_kernel(int iters, float* sink) {
  constexpr int kAcc = 8;
  float acc[kAcc][4];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const uint32_t x = threadIdx.x * 2654435761u;
  uint32_t a[4] = {x & 0x3f803f80u, (x >> 1) & 0x3f803f80u, (x >> 2) & 0x3f803f80u,
                   (x >> 3) & 0x3f803f80u};
  const uint32_t b0 = (x >> 4) & 0x3f803f80u, b1 = (x >> 5) & 0x3f803f80u;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) treemla::cuda::mma_16816<__nv_bfloat16>(acc[i], a, b0, b1);
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  if (s == 1.2345f) sink[0] = s;
}

// Three warpgroups per CTA, each issuing `iters` x 4 wgmma m64n256k16 (bf16 in, fp32 accumulators,
// both operands from shared memory as the sm90a verify family's P V products read them) into
// one accumulator set, one commit group per 4 and at most two groups in flight.
constexpr int kWgmmaPeakThreads = 384;
constexpr int kWgmmaPeakSmem = 5 * 8192 + 1024;  // A: one 8 KB chunk; B: four; alignment slack

__global__ void __launch_bounds__(kWgmmaPeakThreads, 1) wgmma_peak_kernel(int iters, float* sink) {
#if TREEMLA_HAS_WGMMA
  using namespace treemla::cuda::sm90a;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = treemla::cuda::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < 5 * 8192 / 16; i += blockDim.x)
    *reinterpret_cast<uint4*>(smem_raw + (base - raw) + 16 * i) = make_uint4(0, 0, 0, 0);
  __syncthreads();
  fence_proxy_async();
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  const uint64_t da = make_desc(base, 16, 1024), db = make_desc(base + 8192, 8192, 1024);
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n256k16_ss_tnspb<__nv_bfloat16>(acc, da + 2 * kk, db + 128 * kk, 1);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  fence_regs(acc);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += acc[i];
  if (s == 1.2345f) sink[0] = s;
#else
  __trap();  // launched only where sm_90a code was compiled (the host checks)
#endif
}

// The decode access pattern without the attention: every prefix row of a workload read once
// through its page table, each request's rows cut into near-equal splits (one per CTA), 32-row
// blocks, 8 threads per row and nine 16-byte loads each, kUnroll blocks in flight per thread.
// Run with many CTAs per SM it measures what the pages allow (the decode ceiling); with the
// verify kernel's grid (one 8-warp CTA per SM) what that occupancy allows with plain loads.
template <int kUnroll>
__global__ void paged_read_kernel(const uint4* __restrict__ kv,
                                  const int32_t* __restrict__ page_table, int stride, int batch,
                                  int rows, int page_size, int splits, uint32_t* sink) {
  constexpr int kRowVecs = treemla::kHeadDimQK * 2 / 16;  // 72 x 16 B per row
  const int sub = threadIdx.x & 7, r = threadIdx.x >> 3;
  const int blocks = (rows + 31) / 32;
  uint32_t acc = 0;
  for (int item = blockIdx.x; item < batch * splits; item += gridDim.x) {
    const int b = item / splits, s = item % splits;
    const int b0 = static_cast<int>(static_cast<int64_t>(s) * blocks / splits);
    const int b1 = static_cast<int>(static_cast<int64_t>(s + 1) * blocks / splits);
#pragma unroll kUnroll
    for (int blk = b0; blk < b1; ++blk) {
      const int t = blk * 32 + r;
      if (t < rows) {
        const int page = __ldg(page_table + static_cast<int64_t>(b) * stride + t / page_size);
        const uint4* src =
            kv + (static_cast<int64_t>(page) * page_size + t % page_size) * kRowVecs + sub;
        uint4 v[9];
#pragma unroll
        for (int i = 0; i < 9; ++i) v[i] = __ldcs(src + 8 * i);
#pragma unroll
        for (int i = 0; i < 9; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
      }
    }
  }
  if (acc == 0x12345679u) sink[0] = acc;  // keeps the loads alive
}

__global__ void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h =
        static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale);
  }
}

}  // namespace

void launch_hbm_read(int blocks, int threads, const void* src, size_t n, uint32_t* sink,
                     cudaStream_t stream) {
  hbm_read_kernel<<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(src), n, sink);
}

void launch_mma_peak(int blocks, int threads, int iters, float* sink, cudaStream_t stream) {
  mma_peak_kernel<<<blocks, threads, 0, stream>>>(iters, sink);
}

void launch_wgmma_peak(int blocks, int iters, float* sink, cudaStream_t stream) {
  static_assert(kWgmmaPeakSmem <= 48 * 1024, "fits without the opt-in attribute");
  wgmma_peak_kernel<<<blocks, kWgmmaPeakThreads, kWgmmaPeakSmem, stream>>>(iters, sink);
}

int64_t wgmma_peak_flops(int blocks, int iters) {
  return int64_t(blocks) * (kWgmmaPeakThreads / 128) * iters * 4 * (2 * 64 * 256 * 16);
}

void launch_paged_read(int unroll, int blocks, int threads, const void* kv,
                       const int32_t* page_table, int stride, int batch, int rows, int page_size,
                       int splits, uint32_t* sink, cudaStream_t stream) {
  const auto kernel = unroll == 4 ? paged_read_kernel<4> : paged_read_kernel<1>;
  kernel<<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(kv), page_table, stride, batch,
                                         rows, page_size, splits, sink);
}

void launch_fill_random_bf16(int blocks, int threads, void* p, size_t n, uint32_t seed, float scale,
                             cudaStream_t stream) {
  fill_random_bf16<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale);
}

}  // namespace treemla::tool::kernels
