// The dispatch table: kernel family x element type x tile configuration -> the main kernel,
// its block size, shared memory and cluster shape. Each family's instantiation files (one .cu
// per entry, compiled in parallel) define the entries; dispatch.cu is the only place that knows
// the full list. A new family or configuration is a new folder plus entries here.
#pragma once

#include "treemla/cuda/verify.h"
#include "treemla/dtype.h"

namespace treemla::cuda {

// The tree tail's weight of a family, in 32-key prefix blocks (schedule_model.h, tail_weight): how
// much lighter the split that carries a request's tree tail is cut, for requests of one row
// (q_len = 1) and of several. Only the families that read the item table (sm90a, warpspec,
// decode) can have one (schedule.cu). Measured on an H100, twenty-ninth session, four rounds
// alternated (docs/verify-kernel.md, "The tree tail's weight"): sm90a with 6 and warpspec with 2
// for tree requests were 2-6% faster at 1,16,16 and level elsewhere; for one-row requests no
// weight helped, so those stay 0. The whole GPU test suite ran with these defaults (thirtieth
// session, H200, bench/results/2026-12-05_h200_7fee0bd_gpu-tests.log). TREEMLA_TAIL_WEIGHT=ONE,TREE
// overrides them for a run (verify_api.cu).
struct TailWeights {
  int one, tree;
};
inline TailWeights tail_weights_for(KernelFamily f) {
  switch (f) {
    case KernelFamily::kSm90a:
      return {0, 6};
    case KernelFamily::kWarpSpec:
      return {0, 2};
    default:
      return {0, 0};
  }
}

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
