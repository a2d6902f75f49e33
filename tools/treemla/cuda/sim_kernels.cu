// treemla simulate --device cuda: the few kernels the CUDA backend (sim/cuda_backend.cpp) needs
// besides the library's (verify attention, plan application, acceptance, commit). They move
// whole latent rows or hash them; nothing here is on the timed path of a round. The backend is
// host C++20, like the loop; this file is C++17 for nvcc and shares only the launcher
// declarations of tool_kernels.h with it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/tool_kernels.h"
#include "treemla/cuda/check.h"

namespace treemla::tool::kernels {

namespace {

constexpr int kThreads = 256;

// Grid-stride launches: enough blocks to fill the GPU, never more than the work needs.
int blocks_for(int64_t work) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, 8192)));
}

// Row i of `rows` (contiguous, `chunks` 16-byte vectors each) goes to cache slot slots[i].
__global__ void scatter_rows_kernel(uint4* cache, int32_t page_size, int32_t chunks,
                                    const int32_t* slots, const uint4* rows, int64_t n) {
  const int64_t total = n * chunks;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / chunks, c = i % chunks;
    const int64_t row = int64_t{slots[2 * r]} * page_size + slots[2 * r + 1];
    cache[row * chunks + c] = rows[i];
  }
}

// hash_row (sim/backend.h) of each slot's row, one thread per row: FNV-1a is a serial
// chain over the elements, so a row cannot be split across threads. Elements are read eight at
// a time as one 16-byte vector; element 2k is the low half of 32-bit word k (little endian).
__global__ void hash_rows_kernel(const uint4* cache, int32_t page_size, int32_t chunks,
                                 const int32_t* slots, int64_t n, uint64_t* out) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < n;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = int64_t{slots[2 * r]} * page_size + slots[2 * r + 1];
    const uint4* p = cache + row * chunks;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t c = 0; c < chunks; ++c) {
      const uint4 v = p[c];
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        h ^= words[k] & 0xffffu;
        h *= 0x100000001b3ull;
        h ^= words[k] >> 16;
        h *= 0x100000001b3ull;
      }
    }
    out[r] = h ^ (h >> 29);
  }
}

// Page pages[i] of the cache goes to page i of out.
__global__ void gather_pages_kernel(const uint4* cache, int64_t page_chunks, const int32_t* pages,
                                    int64_t n, uint4* out) {
  const int64_t total = n * page_chunks;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = i / page_chunks, c = i % page_chunks;
    out[i] = cache[int64_t{pages[k]} * page_chunks + c];
  }
}

// Logical rows [0, rows[b]) of request b (blockIdx.y), read through the source page table and
// written through the destination one.
__global__ void relayout_rows_kernel(const uint4* src, int32_t src_page_size,
                                     const int32_t* src_table, int32_t src_stride, uint4* dst,
                                     int32_t dst_page_size, const int32_t* dst_table,
                                     int32_t dst_stride, const int32_t* rows, int32_t chunks) {
  const int b = blockIdx.y;
  const int64_t total = int64_t{rows[b]} * chunks;
  const int32_t* st = src_table + int64_t{b} * src_stride;
  const int32_t* dt = dst_table + int64_t{b} * dst_stride;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / chunks, c = i % chunks;
    const int64_t s = int64_t{st[t / src_page_size]} * src_page_size + t % src_page_size;
    const int64_t d = int64_t{dt[t / dst_page_size]} * dst_page_size + t % dst_page_size;
    dst[d * chunks + c] = src[s * chunks + c];
  }
}

int32_t chunks_of(int64_t row_bytes, const char* what) {
  TREEMLA_CHECK(
      row_bytes > 0 && row_bytes % 16 == 0 && row_bytes < (int64_t{1} << 30),
      what << ": row_bytes = " << row_bytes << " must be a positive multiple of 16 below 1 GiB");
  return static_cast<int32_t>(row_bytes / 16);
}

}  // namespace

void scatter_rows(void* cache, int32_t page_size, int64_t row_bytes, const int32_t* slots,
                  const void* rows, int64_t n, cudaStream_t stream) {
  const int32_t chunks = chunks_of(row_bytes, "scatter_rows");
  if (n == 0) return;
  TREEMLA_CHECK(cache && slots && rows && page_size >= 1,
                "scatter_rows: null pointer or page_size < 1");
  scatter_rows_kernel<<<blocks_for(n * chunks), kThreads, 0, stream>>>(
      static_cast<uint4*>(cache), page_size, chunks, slots, static_cast<const uint4*>(rows), n);
  TREEMLA_CHECK_LAUNCH("scatter_rows_kernel");
}

void hash_rows(const void* cache, int32_t page_size, int64_t row_bytes, const int32_t* slots,
               int64_t n, uint64_t* out, cudaStream_t stream) {
  const int32_t chunks = chunks_of(row_bytes, "hash_rows");
  if (n == 0) return;
  TREEMLA_CHECK(cache && slots && out && page_size >= 1,
                "hash_rows: null pointer or page_size < 1");
  hash_rows_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const uint4*>(cache),
                                                           page_size, chunks, slots, n, out);
  TREEMLA_CHECK_LAUNCH("hash_rows_kernel");
}

void gather_pages(const void* cache, int64_t page_bytes, const int32_t* pages, int64_t n, void* out,
                  cudaStream_t stream) {
  TREEMLA_CHECK(
      page_bytes > 0 && page_bytes % 16 == 0,
      "gather_pages: page_bytes = " << page_bytes << " must be a positive multiple of 16");
  if (n == 0) return;
  TREEMLA_CHECK(cache && pages && out, "gather_pages: null pointer");
  const int64_t page_chunks = page_bytes / 16;
  gather_pages_kernel<<<blocks_for(n * page_chunks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(cache), page_chunks, pages, n, static_cast<uint4*>(out));
  TREEMLA_CHECK_LAUNCH("gather_pages_kernel");
}

void relayout_rows(const void* src, int32_t src_page_size, const int32_t* src_table,
                   int32_t src_stride, void* dst, int32_t dst_page_size, const int32_t* dst_table,
                   int32_t dst_stride, const int32_t* rows, int32_t batch, int64_t max_rows,
                   int64_t row_bytes, cudaStream_t stream) {
  const int32_t chunks = chunks_of(row_bytes, "relayout_rows");
  TREEMLA_CHECK(batch >= 1 && batch <= 65535,
                "relayout_rows: batch = " << batch << " must be in [1, 65535]");
  TREEMLA_CHECK(src && dst && src_table && dst_table && rows && src_page_size >= 1 &&
                    dst_page_size >= 1 && src_stride >= 1 && dst_stride >= 1,
                "relayout_rows: null pointer or a size < 1");
  if (max_rows <= 0) return;
  const dim3 grid(static_cast<unsigned>(blocks_for(max_rows * chunks)),
                  static_cast<unsigned>(batch));
  relayout_rows_kernel<<<grid, kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), src_page_size, src_table, src_stride,
      static_cast<uint4*>(dst), dst_page_size, dst_table, dst_stride, rows, chunks);
  TREEMLA_CHECK_LAUNCH("relayout_rows_kernel");
}

}  // namespace treemla::tool::kernels
