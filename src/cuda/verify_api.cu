// Host side of verify attention on the GPU: plan (sizes, grid, tile configuration), argument
// checks, launches, status readback, and merge_state. Dispatch picks the kernel instantiation
// from the dtype and the tile configuration; the configuration comes from the device's
// shared-memory limit unless the caller forces one.
#include <cuda_runtime.h>

#include <cmath>
#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/sm80/verify_launch.h"
#include "cuda/smxx/kernels.h"
#include "treemla/cuda/verify.h"

#ifndef TREEMLA_CUDA_ARCHS
#define TREEMLA_CUDA_ARCHS "unknown"
#endif

namespace treemla::cuda {

namespace {

template <class Tr>
const void* main_kernel(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return verify_main_kernel_ptr<__nv_bfloat16, Tr>();
    case DType::kFP16: return verify_main_kernel_ptr<__half, Tr>();
    default: TREEMLA_FAIL("dtype must be bf16 or fp16 on the GPU (got " << dtype_name(dtype) << ")");
  }
}

const void* main_kernel(DType dtype, TileConfig tile) {
  switch (tile) {
    case TileConfig::kSmem99K: return main_kernel<TraitsSmem99K>(dtype);
    case TileConfig::kSmemLarge: return main_kernel<TraitsSmemLarge>(dtype);
    default: TREEMLA_FAIL("tile configuration " << static_cast<int>(tile) << " is not resolved");
  }
}

int smem_bytes(TileConfig tile) {
  return tile == TileConfig::kSmemLarge ? TraitsSmemLarge::kSmemBytes : TraitsSmem99K::kSmemBytes;
}

int ilog2(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
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
  kp.max_batch = plan.limits.max_batch;
  const WorkspaceLayout l = workspace_layout(plan.limits.max_batch, plan.partial_slots);
  char* base = static_cast<char*>(ws);
  kp.hdr = reinterpret_cast<WorkspaceHeader*>(base + l.header);
  kp.item_base = reinterpret_cast<int*>(base + l.item_base);
  kp.group_base = reinterpret_cast<int*>(base + l.group_base);
  kp.sched = reinterpret_cast<RequestSched*>(base + l.sched);
  kp.part_o = reinterpret_cast<float*>(base + l.part_o);
  kp.part_lse = reinterpret_cast<float*>(base + l.part_lse);
  return kp;
}

}  // namespace

const char* tile_config_name(TileConfig c) {
  switch (c) {
    case TileConfig::kAuto: return "auto";
    case TileConfig::kSmem99K: return "smem99k";
    case TileConfig::kSmemLarge: return "smem-large";
  }
  return "unknown";
}

std::string compiled_architectures() { return TREEMLA_CUDA_ARCHS; }

VerifyPlan make_verify_plan(const VerifyLimits& limits, int device, TileConfig tile) {
  TREEMLA_CHECK(limits.max_batch >= 1 && limits.max_batch <= (1 << 20),
                "limits.max_batch = " << limits.max_batch << " must be in [1, 1048576]");
  TREEMLA_CHECK(limits.num_heads >= 1 && limits.num_heads <= kMaxHeads,
                "limits.num_heads = " << limits.num_heads << " must be in [1, " << kMaxHeads << "]");
  TREEMLA_CHECK(limits.max_total_q >= 1 && limits.max_total_q * limits.num_heads < (int64_t{1} << 31),
                "limits.max_total_q = " << limits.max_total_q << " must be >= 1 and max_total_q * num_heads < 2^31");
  if (device < 0) TREEMLA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TREEMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int cc = prop.major * 10 + prop.minor;
  TREEMLA_CHECK(cc >= 80, "device " << device << " (" << prop.name << ") has compute capability "
                                   << prop.major << "." << prop.minor
                                   << "; treemla's verify kernels need 8.0 or newer");
  int optin = 0;
  TREEMLA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (tile == TileConfig::kAuto) {
    tile = optin >= TraitsSmemLarge::kSmemBytes ? TileConfig::kSmemLarge : TileConfig::kSmem99K;
  }
  TREEMLA_CHECK(smem_bytes(tile) <= optin, "tile configuration " << tile_config_name(tile) << " needs "
                                           << smem_bytes(tile) << " B of shared memory per block; device "
                                           << device << " allows " << optin);
  VerifyPlan plan;
  plan.limits = limits;
  plan.device = device;
  plan.sm_count = prop.multiProcessorCount;
  plan.compute_capability = cc;
  plan.tile = tile;

  int prev = -1;
  TREEMLA_CUDA_CHECK(cudaGetDevice(&prev));
  TREEMLA_CUDA_CHECK(cudaSetDevice(device));
  int occupancy = 0;
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    const void* k = main_kernel(dt, tile);
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, k);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaSetDevice(prev);
      TREEMLA_FAIL("no verify kernel image for device " << device << " (" << prop.name << ", sm_"
                   << cc << "); this build has architectures " << compiled_architectures()
                   << " (" << cudaGetErrorString(e) << ")");
    }
    TREEMLA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(tile)));
    TREEMLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, k, 256, smem_bytes(tile)));
  }
  TREEMLA_CUDA_CHECK(cudaSetDevice(prev));
  TREEMLA_CHECK(occupancy >= 1, "verify kernel cannot be resident on device " << device);
  plan.num_ctas = plan.sm_count * occupancy;
  plan.target_items = plan.num_ctas;  // one wave of equal items (schedule.cu)
  plan.partial_slots = plan.target_items;
  plan.workspace_bytes = workspace_layout(limits.max_batch, plan.partial_slots).total;
  return plan;
}

void check_params(const VerifyParams& p, const VerifyPlan& plan) {
  TREEMLA_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kFP16,
                "dtype must be bf16 or fp16 on the GPU (got " << dtype_name(p.dtype) << ")");
  TREEMLA_CHECK(p.batch >= 1 && p.batch <= plan.limits.max_batch,
                "batch = " << p.batch << " must be in [1, plan.limits.max_batch = " << plan.limits.max_batch << "]");
  TREEMLA_CHECK(p.num_heads == plan.limits.num_heads,
                "num_heads = " << p.num_heads << " must equal the plan's num_heads = " << plan.limits.num_heads);
  TREEMLA_CHECK(p.page_size >= 1 && p.page_size <= (1 << 16) && (p.page_size & (p.page_size - 1)) == 0,
                "page_size = " << p.page_size << " must be a power of two in [1, 65536]");
  TREEMLA_CHECK(p.num_pages >= 1, "num_pages = " << p.num_pages << " must be >= 1");
  TREEMLA_CHECK(p.page_table_stride >= 1, "page_table_stride = " << p.page_table_stride << " must be >= 1");
  TREEMLA_CHECK(p.mask_words >= 1 && p.mask_words <= kMaxMaskWords,
                "mask_words = " << p.mask_words << " must be in [1, " << kMaxMaskWords << "]");
  TREEMLA_CHECK(std::isfinite(p.sm_scale) && p.sm_scale > 0.f, "sm_scale = " << p.sm_scale << " must be finite and > 0");
  TREEMLA_CHECK(p.part == VerifyPart::kAll || p.part == VerifyPart::kPrefix || p.part == VerifyPart::kTail,
                "part = " << static_cast<int>(p.part) << " is not a VerifyPart");
  TREEMLA_CHECK(p.q && p.kv_cache && p.page_table && p.prefix_lens && p.q_indptr && p.tree_mask,
                "q, kv_cache, page_table, prefix_lens, q_indptr and tree_mask must all be non-null");
  TREEMLA_CHECK((reinterpret_cast<uintptr_t>(p.q) & 15) == 0 && (reinterpret_cast<uintptr_t>(p.kv_cache) & 15) == 0,
                "q and kv_cache must be 16-byte aligned");
}

void verify_schedule(const VerifyParams& p, const VerifyPlan& plan, void* workspace, cudaStream_t stream) {
  check_params(p, plan);
  TREEMLA_CHECK(workspace != nullptr, "workspace must be non-null (plan.workspace_bytes = " << plan.workspace_bytes << ")");
  const VerifyKernelParams kp = kernel_params(p, plan, workspace, nullptr, nullptr);
  launch_verify_schedule(kp, stream);
  TREEMLA_CHECK_LAUNCH("verify_schedule_kernel");
}

void verify_run(const VerifyParams& p, const VerifyPlan& plan, void* workspace, void* o, float* lse,
                cudaStream_t stream) {
  check_params(p, plan);
  TREEMLA_CHECK(workspace != nullptr, "workspace must be non-null");
  TREEMLA_CHECK(o != nullptr && lse != nullptr, "o and lse must be non-null");
  TREEMLA_CHECK((reinterpret_cast<uintptr_t>(o) & 15) == 0, "o must be 16-byte aligned");
  const VerifyKernelParams kp = kernel_params(p, plan, workspace, o, lse);
  const void* k = main_kernel(p.dtype, plan.tile);
  void* args[] = {const_cast<VerifyKernelParams*>(&kp)};
  TREEMLA_CUDA_CHECK(cudaLaunchKernel(k, dim3(plan.num_ctas), dim3(256), args,
                                      static_cast<size_t>(smem_bytes(plan.tile)), stream));
  TREEMLA_CHECK_LAUNCH("verify_main_kernel");
  launch_verify_combine(kp, plan.num_ctas, stream);
  TREEMLA_CHECK_LAUNCH("verify_combine_kernel");
}

void verify_attention(const VerifyParams& p, const VerifyPlan& plan, void* workspace, void* o, float* lse,
                      cudaStream_t stream) {
  verify_schedule(p, plan, workspace, stream);
  verify_run(p, plan, workspace, o, lse, stream);
}

void check_status(const VerifyPlan& plan, void* workspace, cudaStream_t stream) {
  const WorkspaceLayout l = workspace_layout(plan.limits.max_batch, plan.partial_slots);
  WorkspaceHeader h{};
  auto* dev = reinterpret_cast<WorkspaceHeader*>(static_cast<char*>(workspace) + l.header);
  TREEMLA_CUDA_CHECK(cudaMemcpyAsync(&h, dev, sizeof(h), cudaMemcpyDeviceToHost, stream));
  TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (h.status_code == kStatusOk) return;
  const int zero[4] = {0, 0, 0, 0};
  TREEMLA_CUDA_CHECK(cudaMemcpy(&dev->status_code, zero, sizeof(int) * 2, cudaMemcpyHostToDevice));
  std::ostringstream os;
  switch (h.status_code) {
    case kStatusBadIndptr:
      os << "q_indptr must start at 0 and not decrease: request " << h.status_request << " has q_indptr = "
         << h.status_value << " .. " << h.status_extra;
      break;
    case kStatusQLen:
      os << "request " << h.status_request << " has q_len = " << h.status_value << " > " << h.status_extra;
      break;
    case kStatusTotalQ:
      os << "q_indptr[" << h.status_request + 1 << "] = " << h.status_value
         << " exceeds the plan's max_total_q = " << h.status_extra;
      break;
    case kStatusPrefix:
      os << "prefix_lens[" << h.status_request << "] = " << h.status_value << " is out of range [0, "
         << h.status_extra << "]";
      break;
    case kStatusPage:
      os << "page_table row " << h.status_request << " maps logical row " << h.status_extra << " to page "
         << h.status_value << ", outside [0, num_pages)";
      break;
    case kStatusStride:
      os << "request " << h.status_request << " reads logical row " << h.status_value
         << ", past its page_table row of page_table_stride = " << h.status_extra << " pages";
      break;
    default:
      os << "internal schedule error " << h.status_code << " (" << h.status_value << " > " << h.status_extra << ")";
  }
  TREEMLA_FAIL("verify attention: " << os.str() << "; affected rows were not computed from that data");
}

void merge_state(DType dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b, void* v,
                 float* s, int64_t tokens, int heads, int dim, cudaStream_t stream) {
  TREEMLA_CHECK(tokens >= 0, "tokens = " << tokens << " must be >= 0");
  TREEMLA_CHECK(heads >= 1, "heads = " << heads << " must be >= 1");
  TREEMLA_CHECK(dim >= 1, "dim = " << dim << " must be >= 1");
  if (tokens == 0) return;
  TREEMLA_CHECK(v_a && s_a && v_b && s_b && v && s, "merge_state: all pointers must be non-null");
  launch_merge_state(dtype, v_a, s_a, v_b, s_b, v, s, tokens, heads, dim, stream);
  TREEMLA_CHECK_LAUNCH("merge_state_kernel");
}

}  // namespace treemla::cuda
