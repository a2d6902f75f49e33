// The dispatch table: kernel family x element type x tile configuration -> the main kernel,
// its block size, shared memory and cluster shape. Each family's instantiation files (one .cu
// per entry, compiled in parallel) define the entries; dispatch.cu is the only place that knows
// the full list. A new family or configuration is a new folder plus entries here.
#pragma once

#include "treemla/cuda/verify.h"
#include "treemla/dtype.h"

namespace treemla::cuda {

// A second main kernel of a family (the sm90a family's TMA kernel, chosen by the launch code:
// verify_api.cu); fn null: none. Same grid, schedule, combine and workspace as the entry's kernel.
// min_page_size: the smallest page size its fast path serves (smaller pages it copies row by row).
struct AltKernel {
  const void* fn = nullptr;
  int threads = 0;
  int smem_bytes = 0;
  int min_page_size = 0;
};

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
  AltKernel alt;
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
AltKernel sm90a_tma_kernel();
template <class Tr>
KernelEntry decode_entry();
template <class Tr>
KernelEntry warpspec_entry();

// The entry for a resolved family and tile; throws treemla::Error naming the combination when
// the table has none (never for the combinations the public enums allow).
KernelEntry kernel_entry(KernelFamily family, DType dtype, TileConfig tile);

// The family and tile configuration a plan gets (make_verify_plan; docs/verify-kernel.md,
// "Kernel families"): `family` and `tile` as asked (kAuto or forced), on a device of compute
// capability `cc` (major * 10 + minor) whose blocks may opt in to `optin` bytes of shared
// memory. `sm90a`: the device runs the build's sm_90a code; `warpspec_image`: the build holds
// the warpspec kernel for the device. Pure (no CUDA call), so that the choice on devices this
// machine does not have is tested on the CPU; refusing a forced choice the device cannot run is
// make_verify_plan's.
struct FamilyChoice {
  KernelFamily family;
  TileConfig tile;
};
FamilyChoice choose_family(const VerifyLimits& limits, int cc, int optin, bool sm90a,
                           bool warpspec_image, TileConfig tile, KernelFamily family);

}  // namespace treemla::cuda
