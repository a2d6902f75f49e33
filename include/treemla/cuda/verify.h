// treemla: verify attention on the GPU (public API). Device pointers, a caller-owned
// workspace and a cudaStream_t; nothing here allocates or synchronizes with the host, so the
// whole call can be captured in a CUDA graph and replayed with new lengths.
//
// Use:
//   VerifyLimits lim{max_batch, max_total_q, num_heads};
//   VerifyPlan plan = make_verify_plan(lim);            // host only: family, tiles, grid, sizes
//   cudaMalloc(&ws, plan.workspace_bytes);               // once
//   init_workspace(plan, ws, stream);                    // once, before its first use
//   verify_schedule(params, plan, ws, stream);           // when lengths change (GPU kernel)
//   verify_run(params, plan, ws, o, lse, stream);        // every layer
//   // or verify_attention(...) = schedule + run.
// params (VerifyParams, attention.h) holds device pointers here. The schedule reads
// prefix_lens and q_indptr from device memory, so replays see new values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "treemla/attention.h"

namespace treemla::cuda {

// Kernel families (docs/verify-kernel.md). kCpAsync: mma.sync with cp.async, one CTA per SM;
// sm_80 and newer. kCluster: mma.sync with a cp.async producer, mbarriers and CTA pairs (clusters
// of 2) that split the KV columns; sm_90 and newer, sm_120 included. kSm90a: wgmma with a
// cp.async producer warpgroup; sm_90 only, and only where the build has sm_90a code
// (architecture 90a). kDecode: mma.sync and a producer warp (bulk copies on sm_90 and newer,
// cp.async before) for row tiles of at most 16 rows, two CTAs per SM where shared memory allows;
// sm_80 and newer; only for plans whose limits bound every request to max_q_len * num_heads <=
// 16 (e.g. q_len = 1 with H <= 16); smem99k only.
// kWarpSpec: mma.sync with score warps (Q K^T, softmax) and output warps (P V, bulk copies of
// the KV rows) that pass 16-key blocks to each other through mbarriers; sm_90 and newer, sm_120
// included; smem99k only. kAuto: kDecode for such plans (on every device, sm_90 included),
// else kSm90a on sm_90 when the build has it, else kWarpSpec (sm_90 and newer) for plans whose
// limits give a max_q_len with max_q_len * num_heads >= 64 (a tree verify), else kCpAsync.
enum class KernelFamily : int {
  kAuto = 0,
  kCpAsync = 1,
  kCluster = 2,
  kSm90a = 3,
  kDecode = 4,
  kWarpSpec = 5
};
// "auto", "cpasync", "cluster", "sm90a", "decode", "warpspec"
const char* kernel_family_name(KernelFamily f);

// Tile configurations of a family. kSmem99K fits 99 KB of shared memory per block (sm_86, sm_89,
// sm_120) and runs on every architecture of its family; kSmemLarge uses more stages where the
// device allows it (sm_80, sm_90, sm_100). kSm90a has only kSmemLarge, kDecode and kWarpSpec only
// kSmem99K.
enum class TileConfig : int { kAuto = 0, kSmem99K = 1, kSmemLarge = 2 };
const char* tile_config_name(TileConfig c);  // "auto", "smem99k", "smem-large"

struct VerifyLimits {
  int max_batch = 0;        // requests per call, >= batch of every call using the plan
  int64_t max_total_q = 0;  // tree nodes (query rows) per call, >= q_indptr[batch]
  int num_heads = 0;        // H, 1..128 (fixed for the plan)
  // Tree nodes of any one request, 1..1025; 0 (default): no bound below 1025. The schedule
  // rejects a request with more (check_status reports it). A bound with max_q_len * num_heads
  // <= 16 (q_len = 1 decode with H <= 16, or a short chain) lets the plan pick the decode family;
  // one with max_q_len * num_heads >= 64 (a tree verify) the warpspec family where sm90a does not
  // run (sm_100, sm_120).
  int max_q_len = 0;
};

struct VerifyPlan {
  VerifyLimits limits;
  int device = -1;
  int sm_count = 0;
  int compute_capability = 0;                 // major * 10 + minor
  KernelFamily family = KernelFamily::kAuto;  // resolved, never kAuto
  TileConfig tile = TileConfig::kAuto;        // resolved, never kAuto
  int threads = 0;                            // block size of the main kernel
  int cluster = 1;                            // CTAs per cluster of the main kernel
  int smem_bytes = 0;                         // dynamic shared memory per block of the main kernel
  int num_ctas = 0;       // persistent grid of the main kernel (a multiple of cluster)
  int target_items = 0;   // work items the schedule aims for (one per CTA or CTA pair)
  int partial_slots = 0;  // capacity for split partial states
  // Work items the schedule resolves into the workspace's item table, so that a main kernel reads
  // its item without a chain of lookups; a call with more items looks the rest up item by item
  // (correct, slower): partial_slots + 2 x target_items.
  int item_capacity = 0;
  // About 8 x num_ctas x 128 KB (the partial states of up to 8 waves of split work items, see
  // the schedule), e.g. 138 MB for 132 SMs; allocate once per plan and reuse it across layers.
  size_t workspace_bytes = 0;
  size_t workspace_init_bytes = 0;  // leading bytes that must be zero before the first use
};

// Host only (reads device properties). Throws treemla::Error on a bad limit, an unsupported
// device (compute capability < 8.0), a family or tile the device cannot run, or a device whose
// architecture was not compiled in.
VerifyPlan make_verify_plan(const VerifyLimits& limits, int device = -1,
                            TileConfig tile = TileConfig::kAuto,
                            KernelFamily family = KernelFamily::kAuto);

// The workspace of every call below: plan.workspace_bytes of device memory, 16-byte aligned
// (cudaMalloc's allocations are); a null or misaligned one throws treemla::Error.
// Enqueues the zeroing of the part of a new workspace that must be zero before its first use
// (the device-side status record: its first plan.workspace_init_bytes bytes). Call once after
// allocating it; later calls keep it valid.
void init_workspace(const VerifyPlan& plan, void* workspace, cudaStream_t stream);

// Checks the scalar fields of p against the plan (host, no device access); throws on error.
void check_params(const VerifyParams& p, const VerifyPlan& plan);

// Enqueue the schedule kernel: reads lengths from device memory, writes the work list.
void verify_schedule(const VerifyParams& p, const VerifyPlan& plan, void* workspace,
                     cudaStream_t stream);
// Enqueue the attention kernels: o [total_q, H, 512] (p.dtype), lse [total_q, H] (fp32, ln).
void verify_run(const VerifyParams& p, const VerifyPlan& plan, void* workspace, void* o, float* lse,
                cudaStream_t stream);
// schedule + run.
void verify_attention(const VerifyParams& p, const VerifyPlan& plan, void* workspace, void* o,
                      float* lse, cudaStream_t stream);

// Device-side checks (lengths over the plan's limits, page indices out of range) record the
// first violation in the workspace instead of reading out of bounds. This synchronizes the
// stream, reads that record and throws treemla::Error describing it; it also clears it.
void check_status(const VerifyPlan& plan, void* workspace, cudaStream_t stream);

// merge_state_v2 semantics on the GPU: v_* [tokens, heads, dim] (dtype), s_* [tokens, heads]
// fp32 natural-log LSE; +-inf or NaN LSE = empty part; two empties give v = 0, s = -inf.
// v / s may alias the inputs.
void merge_state(DType dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                 void* v, float* s, int64_t tokens, int heads, int dim, cudaStream_t stream);

// Compiled-in architectures, e.g. "80-real 86-real 89-real 90a-real 100a-real 120a-real".
std::string compiled_architectures();
// Whether the build has sm_90a code (architecture 90a), which the kSm90a family needs.
bool build_has_sm90a();
// Whether the kSm90a family runs on a device of compute capability major.minor with this build:
// compute capability 9.0 (H100, H200, H20) and sm_90a code compiled in.
bool sm90a_available(int major, int minor);

}  // namespace treemla::cuda
