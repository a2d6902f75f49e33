// Host checks shared by the pool's GPU files (kvpool_moves.cu, kvpool_commit.cu).
#pragma once

#include <cstdint>

#include "treemla/cuda/kvpool.h"

namespace treemla::cuda::kvpool_detail {

// The cache's geometry through treemla::validate (fields named "cache.<field>"; page_table_stride
// is the caller's, 0 for calls without a page table), then what the GPU copies need: data
// non-null and 16-byte aligned, rows a multiple of 16 bytes, a page below 2 GiB. Defined in
// kvpool_moves.cu.
void check_device_cache(const DeviceCache& c, int32_t page_table_stride = 0);

}  // namespace treemla::cuda::kvpool_detail
