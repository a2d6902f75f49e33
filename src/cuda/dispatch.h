// The dispatch table: kernel family x element type x tile configuration -> the main kernel,
// its block size, shared memory and cluster shape. Each family's instantiation files (one .cu
// per entry, compiled in parallel) define the entries; dispatch.cu is the only place that knows
// the full list. A new family or configuration is a new folder plus entries here.
#pragma once

#include "treemla/cuda/verify.h"
#include "treemla/dtype.h"

namespace treemla::cuda {

struct KernelEntry {
  const void* fn = nullptr;  // the __global__ function
  int threads = 0;           // block size
  int smem_bytes = 0;        // dynamic shared memory per block
  int cluster = 1;           // CTAs per cluster (1: plain launch)
  int pair_rows = 0;         // the schedule runs row tiles of at most this many rows as split pairs
  int min_cc = 80;           // oldest compute capability the family is written for
  int max_cc = 1 << 20;      // newest (kSm90a: 90, wgmma exists on sm_90a alone)
  int max_tile_rows = 64;    // rows of a request the kernel handles (kDecode: 16, the plan's
                             // limits must bound max_q_len * num_heads to it)
};

// Defined by the families' instantiation files, one per traits type (which carries the element
// types: Tr::Element for q and o, Tr::KvElement for the cache).
template <class Tr>
KernelEntry cpasync_entry();
template <class Tr>
KernelEntry cluster_entry();
template <class Tr>
KernelEntry sm90a_entry();
template <class Tr>
KernelEntry decode_entry();
template <class Tr>
KernelEntry warpspec_entry();

// The entry for a resolved family and tile; throws treemla::Error naming the combination when
// the table has none (never for the combinations the public enums allow).
KernelEntry kernel_entry(KernelFamily family, DType dtype, TileConfig tile);

}  // namespace treemla::cuda
