// Host side of verify attention on the GPU: plan (family, tile configuration, grid, sizes),
// argument checks, launches, status readback, and merge_state. The plan picks the family from the
// device's compute capability and what was compiled in, the tile configuration from its
// shared-memory limit, unless the caller forces either; the dispatch table (dispatch.h) maps the
// choice to a kernel.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/env_switch.h"
#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/dispatch.h"
#include "cuda/smxx/kernels.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/verify.h"

#ifndef TREEMLA_CUDA_ARCHS
#define TREEMLA_CUDA_ARCHS "unknown"
#endif

namespace treemla::cuda {

namespace {

int ilog2(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

// The launch attribute that groups a grid's CTAs into clusters of n (the cluster family's pairs).
cudaLaunchAttribute cluster_dim_attr(int n) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = static_cast<unsigned>(n);
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// True when the kernel has an image this device can run (the build holds its architecture).
bool has_image(const KernelEntry& e) {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, e.fn);
  if (err != cudaSuccess) cudaGetLastError();
  return err == cudaSuccess;
}

VerifyKernelParams kernel_params(const VerifyParams& p, const VerifyPlan& plan, void* ws, void* o,
                                 float* lse) {
  VerifyKernelParams kp{};
  kp.p = p;
  kp.o = o;
  kp.lse = lse;
  kp.scale_log2 = p.sm_scale * 1.4426950408889634f;
  kp.page_shift = ilog2(p.page_size);
  kp.target_items = plan.target_items;
  kp.partial_slots = plan.partial_slots;
  kp.max_total_q = plan.limits.max_total_q;
  kp.pair_rows = kernel_entry(plan.family, p.dtype, plan.tile).pair_rows;
  kp.max_q_len = plan.limits.max_q_len > 0 ? plan.limits.max_q_len : kMaxTreeNodes;
  kp.max_waves = kp.pair_rows > 0 ? 1 : std::max(1, plan.partial_slots / plan.target_items);
  // The cluster family's timing ablations (a bit mask; cluster/kernel.cuh): a measurement switch.
  static const int wait_mode = static_cast<int>(detail::env_int("TREEMLA_WAIT_MODE", 0, 127, 0));
  kp.wait_mode = wait_mode;
  // The decode family's copies: bulk copies a row on sm_90 and newer, at every page size (with
  // its two producer warps, measured on an H200 in the forty-second session, bulk copies were
  // faster than cp.async at page sizes 1 to 64; on an H100 in the forty-third, cp.async
  // was 1.5-3.2% faster at page sizes 1 and 4 and level from 16; the targets' card decides;
  // docs/verify-kernel.md, "Two producer warps"); sm_80 .. sm_89 always take cp.async.
  // TREEMLA_DECODE_COPY=cpasync or =bulk (a measurement and test switch) forces one path.
  static const int decode_copy_env =
      detail::env_choice("TREEMLA_DECODE_COPY", {"bulk", "cpasync"}, 0);
  kp.decode_cpasync = decode_copy_env;
  // The refined last wave's threshold (schedule.cu): taken when its estimate is under 96% (sm90a)
  // or 97% (the other families) of the best plain one. Measured on the H200, seventeenth session
  // (docs/verify-kernel.md, "The refined last wave"); TREEMLA_REFINE_PCT overrides it.
  static const int refine_pct_env =
      static_cast<int>(detail::env_int("TREEMLA_REFINE_PCT", 0, 1000, -1));
  const bool sm90a = plan.family == KernelFamily::kSm90a;
  kp.refine_pct = refine_pct_env >= 0 ? refine_pct_env : refine_pct_for(sm90a);
  kp.split_align = split_align_for(sm90a);  // splits on 64-key boundaries for sm90a (even_part)
  // The tree tail's weight in prefix blocks (schedule_model.h, tail_weight), for requests of one
  // row and of several; TREEMLA_TAIL_WEIGHT="ONE,TREE" (a measurement switch) overrides the
  // family's.
  static const std::pair<int, int> tail_env = [] {
    const std::vector<long> w = detail::env_ints("TREEMLA_TAIL_WEIGHT", 2, 0, 1 << 20);
    return w.empty() ? std::pair<int, int>{-1, -1}
                     : std::pair<int, int>{static_cast<int>(w[0]), static_cast<int>(w[1])};
  }();
  const TailWeights tw = tail_weights_for(plan.family);
  kp.tail_w_one = tail_env.first >= 0 ? tail_env.first : tw.one;
  kp.tail_w_tree = tail_env.second >= 0 ? tail_env.second : tw.tree;
  const WorkspaceLayout l =
      workspace_layout(plan.limits.max_batch, plan.partial_slots, plan.item_capacity);
  char* base = static_cast<char*>(ws);
  kp.hdr = reinterpret_cast<WorkspaceHeader*>(base + l.header);
  kp.item_base = reinterpret_cast<int*>(base + l.item_base);
  kp.group_base = reinterpret_cast<int*>(base + l.group_base);
  kp.sched = reinterpret_cast<RequestSched*>(base + l.sched);
  kp.refine = reinterpret_cast<WorkRefine*>(base + l.refine);
  kp.groups = reinterpret_cast<CombineGroup*>(base + l.groups);
  kp.items = reinterpret_cast<WorkItem*>(base + l.items);
  kp.item_capacity = std::max(1, plan.item_capacity);
  kp.part_o = reinterpret_cast<float*>(base + l.part_o);
  kp.part_lse = reinterpret_cast<float*>(base + l.part_lse);
  return kp;
}

// Which kernel the sm90a family runs (TREEMLA_SM90A_KERNEL, a measurement and test switch):
// "cpasync" its producer-warpgroup kernel, "tma" its TMA kernel (kernel_tma.cuh) for every call
// (pages of fewer than 32 rows included, which it copies row by row), unset or "auto" the
// default below.
enum class Sm90aKernel { kAuto, kCpAsync, kTma };
Sm90aKernel sm90a_kernel_switch() {
  static const Sm90aKernel k = static_cast<Sm90aKernel>(
      detail::env_choice("TREEMLA_SM90A_KERNEL", {"auto", "cpasync", "tma"}, 0));
  return k;
}

// Whether this call runs the entry's second kernel (KernelEntry::alt).
bool use_alt_kernel(const KernelEntry& e, const VerifyParams& p) {
  if (e.alt.fn == nullptr) return false;
  switch (sm90a_kernel_switch()) {
    case Sm90aKernel::kCpAsync:
      return false;
    case Sm90aKernel::kTma:
      return true;
    default:
      // Pages of at least 32 rows (its boxes; smaller pages it copies row by row, 2.4x slower
      // at page size 1). Measured on the H200 before 0373a8c's P_A change: level with the
      // producer kernel or up to 10% faster, except 1-3% slower at the GLM-5 shape and
      // 1,16,16; that change made it 7-8% faster again (bench/results/2026-12-04_h200_s25-*).
      return p.page_size >= e.alt.min_page_size;
  }
}

// The TMA kernel's maps over the cache (VerifyKernelParams::kv_map): [num_pages][page_size][576],
// boxes of 64 columns x 32 and x 64 rows where the page has that many.
void encode_kv_maps(const VerifyParams& p, VerifyKernelParams& kp) {
  static_assert(sizeof(CUtensorMap) == sizeof(TmaMap), "TmaMap holds a CUtensorMap");
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    TREEMLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                        cudaEnableDefault, &q));
#else
    TREEMLA_CUDA_CHECK(
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q));
#endif
    TREEMLA_CHECK(q == cudaDriverEntryPointSuccess && f != nullptr,
                  "the CUDA driver has no cuTensorMapEncodeTiled (the sm90a TMA kernel needs it)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  // TREEMLA_TMA_L2 = none, 64, 128 or 256 (default), a measurement switch: the maps' L2 promotion.
  static const CUtensorMapL2promotion promo = [] {
    constexpr CUtensorMapL2promotion by_choice[] = {
        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
    return by_choice[detail::env_choice("TREEMLA_TMA_L2", {"none", "64", "128", "256"}, 3)];
  }();
  const DType kv = kv_dtype_of(p);
  const size_t row_bytes = static_cast<size_t>(kHeadDimQK) * dtype_size(kv);
  for (int m = 0; m < 2; ++m) {
    const int rows = m == 0 ? 32 : 64;
    if (p.page_size < rows) continue;
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kHeadDimQK),
                                static_cast<cuuint64_t>(p.page_size),
                                static_cast<cuuint64_t>(p.num_pages)};
    const cuuint64_t strides[2] = {row_bytes, row_bytes * static_cast<cuuint64_t>(p.page_size)};
    const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(rows), 1};
    const cuuint32_t es[3] = {1, 1, 1};
    const CUresult r = encode(
        reinterpret_cast<CUtensorMap*>(&kp.kv_map[m]),
        kv == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
        const_cast<void*>(p.kv_cache), dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    TREEMLA_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed ("
                                         << static_cast<int>(r) << ") for kv_cache with "
                                         << p.num_pages << " pages of " << p.page_size << " rows");
  }
}

}  // namespace

const char* kernel_family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::kAuto:
      return "auto";
    case KernelFamily::kCpAsync:
      return "cpasync";
    case KernelFamily::kCluster:
      return "cluster";
    case KernelFamily::kSm90a:
      return "sm90a";
    case KernelFamily::kDecode:
      return "decode";
    case KernelFamily::kWarpSpec:
      return "warpspec";
  }
  return "unknown";
}

const char* tile_config_name(TileConfig c) {
  switch (c) {
    case TileConfig::kAuto:
      return "auto";
    case TileConfig::kSmem99K:
      return "smem99k";
    case TileConfig::kSmemLarge:
      return "smem-large";
  }
  return "unknown";
}

std::string compiled_architectures() { return TREEMLA_CUDA_ARCHS; }

bool build_has_sm90a() {
  const std::string archs = std::string(" ") + TREEMLA_CUDA_ARCHS + " ";
  return archs.find(" 90a") != std::string::npos;
}

bool sm90a_available(int major, int minor) {
  const int cc = 10 * major + minor;
  return cc >= kMinCcWgmma && cc <= kMaxCcWgmma && build_has_sm90a();
}

FamilyChoice choose_family(const VerifyLimits& limits, int cc, int optin, bool sm90a,
                           bool warpspec_image, TileConfig tile, KernelFamily family) {
  auto fits = [&](KernelFamily f, TileConfig t) {
    const KernelEntry e = kernel_entry(f, DType::kBF16, t);
    return cc >= e.min_cc && e.smem_bytes <= optin;
  };
  auto pick_tile = [&](KernelFamily f) {  // the largest configuration that fits, unless forced
    if (tile != TileConfig::kAuto) return tile;
    if (f == KernelFamily::kSm90a) return TileConfig::kSmemLarge;  // its only configuration
    if (f == KernelFamily::kDecode || f == KernelFamily::kWarpSpec)
      return TileConfig::kSmem99K;  // their only configuration
    return fits(f, TileConfig::kSmemLarge) ? TileConfig::kSmemLarge : TileConfig::kSmem99K;
  };
  // kAuto: the decode family when the limits bound every request to its 16-row tile (unless the
  // large configuration, which it does not have, is forced), on every device it runs on, sm_90
  // with sm_90a code included; else the sm90a family on sm_90 when this build has sm_90a code
  // (unless the 99 KB configuration, which it does not have, is forced); else the warpspec family
  // (sm_90 and newer, with an image for this device) when the limits bound max_q_len and a request
  // at that bound fills a 64-row tile (max_q_len * num_heads >= 64: a tree verify); else cpasync.
  // Measured side by side on the H200 (docs/benchmarks.md): decode is level with sm90a or faster
  // at every decode shape (eb03edd, bench/results/2026-12-01_h200_eb03edd_bench.txt: 296.9
  // against 308.4 us at 8 x 16 x 1 x 131072, 302.0 against 307.1 at 32 x 16 x 1 x 32768, 302.9
  // against 317.8 at page size 1; 7.4 against 9.8 us for a call with nothing to attend); warpspec
  // is 13-20% faster than cpasync 99 KB at every tree shape and at q_len = 1 with 128 heads (8 x
  // 128 x 32768: 285 against 349 us at a6f0e7d), and 30-38% slower on 16-row tiles (8 x 16 x 1 x
  // 131072: 515 against 380 us), which the decode family takes when the limits allow it; requests
  // far shorter than max_q_len run on its partly filled tiles. The cluster family is slower than
  // cpasync at every shape but the empty call (bench/results/2026-11-30_h200_e01b288_bench.txt); it
  // stays selectable.
  const int64_t bound_rows = int64_t{limits.max_q_len} * limits.num_heads;
  if (family == KernelFamily::kAuto) {
    const bool wgmma = sm90a && tile != TileConfig::kSmem99K;
    const bool decode_rows =
        limits.max_q_len >= 1 && tile != TileConfig::kSmemLarge &&
        bound_rows <=
            kernel_entry(KernelFamily::kDecode, DType::kBF16, TileConfig::kSmem99K).max_tile_rows;
    const bool warpspec_rows =
        limits.max_q_len >= 1 && tile != TileConfig::kSmemLarge && bound_rows >= kBlockM &&
        fits(KernelFamily::kWarpSpec, TileConfig::kSmem99K) && warpspec_image;
    family = decode_rows     ? KernelFamily::kDecode
             : wgmma         ? KernelFamily::kSm90a
             : warpspec_rows ? KernelFamily::kWarpSpec
                             : KernelFamily::kCpAsync;
  }
  return {family, pick_tile(family)};
}

VerifyPlan make_verify_plan(const VerifyLimits& limits, int device, TileConfig tile,
                            KernelFamily family) {
  TREEMLA_CHECK(limits.max_batch >= 1 && limits.max_batch <= (1 << 20),
                "limits.max_batch = " << limits.max_batch << " must be in [1, 1048576]");
  TREEMLA_CHECK(
      limits.num_heads >= 1 && limits.num_heads <= kMaxHeads,
      "limits.num_heads = " << limits.num_heads << " must be in [1, " << kMaxHeads << "]");
  TREEMLA_CHECK(
      limits.max_total_q >= 1 && limits.max_total_q * limits.num_heads < (int64_t{1} << 31),
      "limits.max_total_q = " << limits.max_total_q
                              << " must be >= 1 and max_total_q * num_heads < 2^31");
  TREEMLA_CHECK(limits.max_q_len >= 0 && limits.max_q_len <= kMaxTreeNodes,
                "limits.max_q_len = " << limits.max_q_len << " must be in [0, " << kMaxTreeNodes
                                      << "] (0: no bound below " << kMaxTreeNodes << ")");
  TREEMLA_CHECK(family == KernelFamily::kAuto || family == KernelFamily::kCpAsync ||
                    family == KernelFamily::kCluster || family == KernelFamily::kSm90a ||
                    family == KernelFamily::kDecode || family == KernelFamily::kWarpSpec,
                "family = " << static_cast<int>(family) << " is not a KernelFamily");
  TREEMLA_CHECK(
      tile == TileConfig::kAuto || tile == TileConfig::kSmem99K || tile == TileConfig::kSmemLarge,
      "tile = " << static_cast<int>(tile) << " is not a TileConfig");
  if (device < 0) TREEMLA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TREEMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int cc = prop.major * 10 + prop.minor;
  TREEMLA_CHECK(arch_has_mma_sync(cc), "device " << device << " (" << prop.name
                                                 << ") has compute capability " << prop.major << "."
                                                 << prop.minor
                                                 << "; treemla's verify kernels need 8.0 or newer");
  int optin = 0;
  TREEMLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int prev = -1;
  TREEMLA_CUDA_CHECK(cudaGetDevice(&prev));
  TREEMLA_CUDA_CHECK(cudaSetDevice(device));
  struct Restore {
    int dev;
    ~Restore() { cudaSetDevice(dev); }
  } restore{prev};

  const int64_t bound_rows = int64_t{limits.max_q_len} * limits.num_heads;
  {
    // The warpspec image matters only to kAuto: a forced family asks no CUDA call for it.
    const bool warpspec_image =
        family == KernelFamily::kAuto &&
        has_image(kernel_entry(KernelFamily::kWarpSpec, DType::kBF16, TileConfig::kSmem99K));
    const FamilyChoice choice = choose_family(limits, cc, optin, sm90a_available(cc / 10, cc % 10),
                                              warpspec_image, tile, family);
    family = choice.family;
    tile = choice.tile;
  }
  const KernelEntry entry = kernel_entry(family, DType::kBF16, tile);
  TREEMLA_CHECK(cc >= entry.min_cc && cc <= entry.max_cc,
                "kernel family " << kernel_family_name(family) << " needs compute capability "
                                 << entry.min_cc / 10 << "." << entry.min_cc % 10
                                 << (entry.max_cc == entry.min_cc ? " exactly" : " or newer")
                                 << "; device " << device << " (" << prop.name << ") has "
                                 << prop.major << "." << prop.minor);
  TREEMLA_CHECK(family != KernelFamily::kSm90a || build_has_sm90a(),
                "kernel family sm90a needs sm_90a code; this build has architectures "
                    << compiled_architectures() << " (add 90a-real to CMAKE_CUDA_ARCHITECTURES)");
  TREEMLA_CHECK(entry.max_tile_rows >= kBlockM ||
                    (limits.max_q_len >= 1 && bound_rows <= entry.max_tile_rows),
                "kernel family " << kernel_family_name(family) << " handles requests of at most "
                                 << entry.max_tile_rows
                                 << " rows: limits.max_q_len * num_heads must be <= "
                                 << entry.max_tile_rows << " (got max_q_len = " << limits.max_q_len
                                 << ", num_heads = " << limits.num_heads << ")");
  TREEMLA_CHECK(entry.smem_bytes <= optin,
                "tile configuration " << tile_config_name(tile) << " of family "
                                      << kernel_family_name(family) << " needs " << entry.smem_bytes
                                      << " B of shared memory per block; device " << device
                                      << " allows " << optin);

  VerifyPlan plan;
  plan.limits = limits;
  plan.device = device;
  plan.sm_count = prop.multiProcessorCount;
  plan.compute_capability = cc;
  plan.family = family;
  plan.tile = tile;
  plan.threads = entry.threads;
  plan.cluster = entry.cluster;
  plan.smem_bytes = entry.smem_bytes;
  int resident = 0;  // CTAs (cluster 1) or clusters that fit on the device at once
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    const KernelEntry e = kernel_entry(family, dt, tile);
    if (!has_image(e)) {
      TREEMLA_FAIL("no " << kernel_family_name(family) << " verify kernel image for device "
                         << device << " (" << prop.name << ", sm_" << cc
                         << "); this build has architectures " << compiled_architectures());
    }
    TREEMLA_CUDA_CHECK(
        cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem_bytes));
    if (e.alt.fn != nullptr) {
      TREEMLA_CUDA_CHECK(cudaFuncSetAttribute(e.alt.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              e.alt.smem_bytes));
    }
    int n = 0;
    if (e.cluster > 1) {
      TREEMLA_CUDA_CHECK(
          cudaFuncSetAttribute(e.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 0));
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr[1] = {cluster_dim_attr(e.cluster)};
      cfg.gridDim = dim3(e.cluster * prop.multiProcessorCount);
      cfg.blockDim = dim3(e.threads);
      cfg.dynamicSmemBytes = e.smem_bytes;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      TREEMLA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, e.fn, &cfg));
    } else {
      TREEMLA_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, e.fn, e.threads, e.smem_bytes));
      n *= prop.multiProcessorCount;
    }
    resident = dt == DType::kBF16 ? n : std::min(resident, n);
  }
  TREEMLA_CHECK(resident >= 1, "the " << kernel_family_name(family)
                                      << " verify kernel cannot be resident on device " << device
                                      << " (" << prop.name << ")");
  plan.num_ctas = resident * plan.cluster;
  plan.target_items = resident;  // one wave of equal items (schedule.cu), one per CTA or CTA pair
  // Up to kMaxWaves waves of items (schedule.cu), one partial slot each; pair-mode items (one
  // wave) write two. With several CTAs per SM (the decode family) fewer waves, so that the
  // partial slots stay at kMaxWaves per SM (128 KB each).
  const int max_waves = plan_max_waves(plan.sm_count, resident);
  plan.partial_slots = entry.pair_rows > 0 ? 2 * plan.target_items : max_waves * plan.target_items;
  plan.item_capacity = work_item_capacity(plan.partial_slots, plan.target_items);
  const WorkspaceLayout layout =
      workspace_layout(limits.max_batch, plan.partial_slots, plan.item_capacity);
  plan.workspace_bytes = layout.total;
  plan.workspace_init_bytes = layout.header + sizeof(WorkspaceHeader);
  return plan;
}

// The workspace every entry point takes: non-null, and 16-byte aligned (the kernels read its
// header and partial states with 16-byte loads; cudaMalloc's and torch's allocations are 256).
static void check_workspace(const VerifyPlan& plan, const void* workspace) {
  TREEMLA_CHECK(workspace != nullptr, "workspace must be non-null (plan.workspace_bytes = "
                                          << plan.workspace_bytes << ")");
  TREEMLA_CHECK((reinterpret_cast<uintptr_t>(workspace) & 15) == 0,
                "workspace must be 16-byte aligned (got address " << workspace << ")");
}

void init_workspace(const VerifyPlan& plan, void* workspace, cudaStream_t stream) {
  check_workspace(plan, workspace);
  TREEMLA_CUDA_CHECK(cudaMemsetAsync(workspace, 0, plan.workspace_init_bytes, stream));
}

void check_params(const VerifyParams& p, const VerifyPlan& plan) {
  TREEMLA_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kFP16,
                "dtype must be bf16 or fp16 on the GPU (got " << dtype_name(p.dtype) << ")");
  TREEMLA_CHECK(p.kv_dtype == -1 || p.kv_dtype == static_cast<int>(p.dtype),
                "kv_dtype = " << p.kv_dtype
                              << " must be -1 (same as dtype) or equal dtype; a KV cache of "
                                 "another type is not supported on the GPU yet");
  TREEMLA_CHECK(p.batch >= 1 && p.batch <= plan.limits.max_batch,
                "batch = " << p.batch << " must be in [1, plan.limits.max_batch = "
                           << plan.limits.max_batch << "]");
  TREEMLA_CHECK(p.num_heads == plan.limits.num_heads,
                "num_heads = " << p.num_heads
                               << " must equal the plan's num_heads = " << plan.limits.num_heads);
  treemla::validate(cache_layout_of(p));  // page_size, num_pages, page_table_stride (paged_cache.h)
  TREEMLA_CHECK(p.mask_words >= 1 && p.mask_words <= kMaxMaskWords,
                "mask_words = " << p.mask_words << " must be in [1, " << kMaxMaskWords << "]");
  TREEMLA_CHECK(std::isfinite(p.sm_scale) && p.sm_scale > 0.f,
                "sm_scale = " << p.sm_scale << " must be finite and > 0");
  TREEMLA_CHECK(
      p.part == VerifyPart::kAll || p.part == VerifyPart::kPrefix || p.part == VerifyPart::kTail,
      "part = " << static_cast<int>(p.part) << " is not a VerifyPart");
  TREEMLA_CHECK(
      p.q && p.kv_cache && p.page_table && p.prefix_lens && p.q_indptr && p.tree_mask,
      "q, kv_cache, page_table, prefix_lens, q_indptr and tree_mask must all be non-null");
  TREEMLA_CHECK((reinterpret_cast<uintptr_t>(p.q) & 15) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.kv_cache) & 15) == 0,
                "q and kv_cache must be 16-byte aligned");
}

// Whether the main and combine kernels are launched with programmatic dependent launch: each may
// start launching (and set up its shared memory) while the kernel before it finishes, and waits
// for it in pdl_wait (verify_device.cuh) before touching global memory. sm_90 and newer, and a
// runtime that captures such launches into graphs (CUDA 12.3).
static bool use_pdl(const VerifyPlan& plan) {
#if CUDART_VERSION >= 12030
  return plan.compute_capability >= 90;
#else
  (void)plan;
  return false;
#endif
}

void verify_schedule(const VerifyParams& p, const VerifyPlan& plan, void* workspace,
                     cudaStream_t stream) {
  check_params(p, plan);
  check_workspace(plan, workspace);
  const VerifyKernelParams kp = kernel_params(p, plan, workspace, nullptr, nullptr);
  launch_verify_schedule(kp, stream);
  TREEMLA_CHECK_LAUNCH("verify_schedule_kernel");
}

void verify_run(const VerifyParams& p, const VerifyPlan& plan, void* workspace, void* o, float* lse,
                cudaStream_t stream) {
  check_params(p, plan);
  check_workspace(plan, workspace);
  TREEMLA_CHECK(o != nullptr && lse != nullptr, "o and lse must be non-null");
  TREEMLA_CHECK((reinterpret_cast<uintptr_t>(o) & 15) == 0, "o must be 16-byte aligned");
  VerifyKernelParams kp = kernel_params(p, plan, workspace, o, lse);
  const KernelEntry e = kernel_entry(plan.family, p.dtype, plan.tile);
  const bool alt = use_alt_kernel(e, p);
  if (alt) encode_kv_maps(p, kp);
  void* args[] = {&kp};
  const bool pdl = use_pdl(plan);
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  int n_attr = 0;
  if (e.cluster > 1) attr[n_attr++] = cluster_dim_attr(e.cluster);
  if (pdl) attr[n_attr++] = pdl_launch_attr();
  cfg.gridDim = dim3(plan.num_ctas);
  cfg.blockDim = dim3(alt ? e.alt.threads : e.threads);
  cfg.dynamicSmemBytes = static_cast<size_t>(alt ? e.alt.smem_bytes : e.smem_bytes);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(n_attr);
  TREEMLA_CUDA_CHECK(cudaLaunchKernelExC(&cfg, alt ? e.alt.fn : e.fn, args));
  TREEMLA_CHECK_LAUNCH("verify main kernel");
  TREEMLA_CUDA_CHECK(launch_verify_combine(kp, plan.num_ctas, pdl, stream));
  TREEMLA_CHECK_LAUNCH("verify_combine_kernel");
}

void verify_attention(const VerifyParams& p, const VerifyPlan& plan, void* workspace, void* o,
                      float* lse, cudaStream_t stream) {
  verify_schedule(p, plan, workspace, stream);
  verify_run(p, plan, workspace, o, lse, stream);
}

void check_status(const VerifyPlan& plan, void* workspace, cudaStream_t stream) {
  check_workspace(plan, workspace);
  const WorkspaceLayout l =
      workspace_layout(plan.limits.max_batch, plan.partial_slots, plan.item_capacity);
  auto* hdr = reinterpret_cast<WorkspaceHeader*>(static_cast<char*>(workspace) + l.header);
  const DeviceStatus h = take_device_status(&hdr->status, stream);
  if (h.code == kStatusOk) return;
  std::ostringstream os;
  switch (h.code) {
    case kStatusBadIndptr:
      os << "q_indptr must start at 0 and not decrease: request " << h.index
         << " has q_indptr = " << h.value << " .. " << h.extra;
      break;
    case kStatusQLen:
      os << "request " << h.index << " has q_len = " << h.value << ", over the plan's bound of "
         << h.extra << " (limits.max_q_len, or " << kMaxTreeNodes << " when it is 0)";
      break;
    case kStatusTotalQ:
      os << "q_indptr[" << h.index + 1 << "] = " << h.value
         << " exceeds the plan's max_total_q = " << h.extra;
      break;
    case kStatusPrefix:
      os << "prefix_lens[" << h.index << "] = " << h.value << " is out of range [0, " << h.extra
         << "]";
      break;
    case kStatusPage:
      os << "page_table row " << h.index << " maps logical row " << h.extra << " to page "
         << h.value << ", outside [0, num_pages)";
      break;
    case kStatusStride:
      os << "request " << h.index << " reads logical row " << h.value
         << ", past its page_table row of page_table_stride = " << h.extra << " pages";
      break;
    default:
      os << "internal schedule error " << h.code << " (" << h.value << " > " << h.extra << ")";
  }
  TREEMLA_FAIL("verify attention: " << os.str()
                                    << "; affected rows were not computed from that data");
}

void merge_state(DType dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                 void* v, float* s, int64_t tokens, int heads, int dim, cudaStream_t stream) {
  TREEMLA_CHECK(tokens >= 0, "tokens = " << tokens << " must be >= 0");
  TREEMLA_CHECK(heads >= 1, "heads = " << heads << " must be >= 1");
  TREEMLA_CHECK(dim >= 1, "dim = " << dim << " must be >= 1");
  if (tokens == 0) return;
  TREEMLA_CHECK(v_a && s_a && v_b && s_b && v && s, "merge_state: all pointers must be non-null");
  launch_merge_state(dtype, v_a, s_a, v_b, s_b, v, s, tokens, heads, dim, stream);
  TREEMLA_CHECK_LAUNCH("merge_state_kernel");
}

}  // namespace treemla::cuda
