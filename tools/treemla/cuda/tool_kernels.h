// The tool's own CUDA kernels (tools/treemla/cuda/*.cu), besides the library's: helpers of the
// simulation's CUDA backend (sim_kernels.cu) and of `treemla bench` (bench_kernels.cu). Host
// launchers on a stream, plain C++17. Compiled for every architecture in CMAKE_CUDA_ARCHITECTURES.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace treemla::tool::kernels {

// ---- the simulation's CUDA backend (sim_kernels.cu) ----------------------------------------
// Device pointers; slots are [n, 2] int32 (page, slot) pairs (kvpool::RowSlot); rows are
// row_bytes (a multiple of 16) apart. Each launch is checked; none synchronizes.

void scatter_rows(void* cache, int32_t page_size, int64_t row_bytes, const int32_t* slots,
                  const void* rows, int64_t n, cudaStream_t stream);
// out[i] = hash_row (sim/backend.h) of the row at slots[i]; the elements are 16-bit.
void hash_rows(const void* cache, int32_t page_size, int64_t row_bytes, const int32_t* slots,
               int64_t n, uint64_t* out, cudaStream_t stream);
// out page i = cache page pages[i].
void gather_pages(const void* cache, int64_t page_bytes, const int32_t* pages, int64_t n, void* out,
                  cudaStream_t stream);
// Logical rows [0, rows[b]) of each request b < batch, from src through src_table ([batch,
// src_stride]) to dst through dst_table ([batch, dst_stride]); max_rows >= every rows[b].
void relayout_rows(const void* src, int32_t src_page_size, const int32_t* src_table,
                   int32_t src_stride, void* dst, int32_t dst_page_size, const int32_t* dst_table,
                   int32_t dst_stride, const int32_t* rows, int32_t batch, int64_t max_rows,
                   int64_t row_bytes, cudaStream_t stream);

// ---- treemla bench (bench_kernels.cu) --------------------------------------------------------
// Launches only, with the grid the caller gives, and no check: the caller times a series of
// launches and then checks them (TREEMLA_CHECK_LAUNCH), so nothing else sits between them.

// Streams n 16-byte vectors of src once (the HBM read ceiling); sink is written only to keep
// the loads alive.
void launch_hbm_read(int blocks, int threads, const void* src, size_t n, uint32_t* sink,
                     cudaStream_t stream);
// `iters` x 8 bf16 mma.sync m16n8k16 per warp from registers (the tensor-core ceiling).
void launch_mma_peak(int blocks, int threads, int iters, float* sink, cudaStream_t stream);
// `iters` x 4 wgmma m64n256k16 (bf16, shared-memory operands) per warpgroup, three warpgroups
// per block (the wgmma ceiling). Only on sm_90 with sm_90a code in the build (elsewhere the kernel
// traps); wgmma_peak_flops gives the floating-point operations of one launch.
void launch_wgmma_peak(int blocks, int iters, float* sink, cudaStream_t stream);
int64_t wgmma_peak_flops(int blocks, int iters);
// Every prefix row of `batch` requests read once through the page table ([batch, stride]), each
// request's rows cut into `splits` near-equal splits, 32-row blocks, 8 threads per row; unroll
// (1 or 4) blocks in flight per thread.
void launch_paged_read(int unroll, int blocks, int threads, const void* kv,
                       const int32_t* page_table, int stride, int batch, int rows, int page_size,
                       int splits, uint32_t* sink, cudaStream_t stream);
// n bf16 values, uniform in [-scale, scale), from a hash of (index, seed).
void launch_fill_random_bf16(int blocks, int threads, void* p, size_t n, uint32_t seed, float scale,
                             cudaStream_t stream);

}  // namespace treemla::tool::kernels
