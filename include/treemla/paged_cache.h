// treemla: the geometry of a paged latent cache, described once and checked once.
//
// The cache is [num_pages, page_size, row_width] elements of elem_size bytes (row_width 576 for
// MLA). A page table holds one row of page_table_stride int32 page indices per request; logical
// row t of a request lives at (row[t / page_size], t % page_size).
//
// Three parts of the API carry this geometry in their own fields, which stay as they are so that
// callers keep setting them directly: VerifyParams (attention.h: page_size, num_pages,
// page_table_stride; the rows are kHeadDimQK elements of the cache's dtype), kvpool::PoolConfig
// (kvpool.h: no page table) and cuda::DeviceCache (cuda/kvpool.h: no page table; the GPU commit
// adds its page_table_stride). Each turns its fields into a PagedCacheLayout and calls validate()
// below, so every bound has one rule and one message:
//
//   num_pages          >= 1
//   page_size          a power of two in [1, kMaxPageSize]
//   row_width          >= 1
//   elem_size          >= 1; the whole cache, num_pages * page_size * row_width * elem_size
//                      bytes, must be addressable with int64
//   page_table_stride  >= 0. Zero is valid: a page table may have no columns, because a request
//                      needs pages only for the rows it holds, and a request with no rows (or a
//                      call that reads none of them) needs none. Whether a request's row is long
//                      enough depends on its lengths, so it is checked where they are known: the
//                      CPU verify check (cpu::validate) names the request and the pages it needs,
//                      the GPU verify records the row it could not map (cuda::check_status), the
//                      GPU commit reports KvStatus::kBadPage for that request, the page-table
//                      scatter skips the update (cuda::check_move_status), and
//                      KvPool::page_table_row requires a stride of at least the request's pages.
//
// Plain C++17: CUDA translation units include it too.
#pragma once

#include <cstdint>
#include <string>

namespace treemla {

constexpr int32_t kMaxPageSize = 1 << 16;  // the verify kernels' bound; the pool uses the same

struct PagedCacheLayout {
  int32_t num_pages = 0;          // pages in the cache, >= 1
  int32_t page_size = 0;          // rows per page, a power of two in [1, kMaxPageSize]
  int32_t row_width = 0;          // elements per row (576 for MLA), >= 1
  int32_t elem_size = 0;          // bytes per element (2 for bf16/fp16), >= 1
  int32_t page_table_stride = 0;  // int32 entries per page-table row, >= 0 (0 where there is none)

  int64_t row_bytes() const { return int64_t{row_width} * elem_size; }
  int64_t page_bytes() const { return row_bytes() * page_size; }
};

// Throws treemla::Error naming the first field out of range and its bound, e.g.
// "page_size = 24 must be a power of two in [1, 65536]". `prefix` is how the caller's struct
// reaches the cache's four fields ("" for VerifyParams and PoolConfig, "cache." for the GPU pool
// calls); page_table_stride is always named page_table_stride, the field of VerifyParams and
// cuda::CommitParams.
void validate(const PagedCacheLayout& layout, const std::string& prefix = "");

// The single bounds validate() applies, for structs that carry only some of the fields (such as
// cuda::PageTableUpdateParams); `name` is the field as the caller's struct names it.
void check_num_pages(int64_t num_pages, const std::string& name);
void check_page_size(int64_t page_size, const std::string& name);
void check_page_table_stride(int64_t page_table_stride, const std::string& name);

}  // namespace treemla
