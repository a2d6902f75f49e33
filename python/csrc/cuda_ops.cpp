// CUDA kernels of the treemla operators and the GPU helpers exposed to Python (plans, status).
//
// Every launch goes to torch's current stream of the tensors' device, and nothing here
// synchronizes or copies to the host, so the operators can be captured in a CUDA graph. Plans are
// built once per (device, limits, tile) and cached: make_verify_plan reads device properties and
// sets kernel attributes, which belongs outside a capture (plan_verify does it ahead of time).
//
// Without TREEMLA_WITH_CUDA (a CPU-only torch, or no nvcc at build time) the CUDA kernels are
// registered as stubs that raise a RuntimeError saying so.
#include <torch/extension.h>
#include <torch/library.h>

#include "common.h"
#include "ops.h"

#ifdef TREEMLA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <map>
#include <mutex>
#include <tuple>

#include "treemla/cuda/verify.h"
#endif

namespace treemla::binding {

#ifdef TREEMLA_WITH_CUDA
namespace {

// The operators carry one integer for the requested configuration: tile + 16 * family + 256 *
// max_q_len, so that their schemas stay as they were when only the tile could be chosen.
cuda::TileConfig to_tile(int64_t config) {
  const int64_t tile = config & 15;
  TREEMLA_CHECK_VALUE(config >= 0 && tile <= 2,
                      "tile must be 0 (auto), 1 (smem99k) or 2 (smem-large), got ", tile);
  return static_cast<cuda::TileConfig>(tile);
}
cuda::KernelFamily to_family(int64_t config) {
  const int64_t family = (config >> 4) & 15;
  TREEMLA_CHECK_VALUE(family <= 5,
                      "family must be 0 (auto), 1 (cpasync), 2 (cluster), 3 (sm90a), 4 (decode) or "
                      "5 (warpspec), got ",
                      family);
  return static_cast<cuda::KernelFamily>(family);
}
int to_max_q_len(int64_t config) {
  const int64_t max_q_len = config >> 8;
  TREEMLA_CHECK_VALUE(max_q_len >= 0 && max_q_len <= kMaxTreeNodes, "max_q_len must be in [0, ",
                      kMaxTreeNodes, "], got ", max_q_len);
  return static_cast<int>(max_q_len);
}

// One plan per (device, limits, requested tile): cheap lookups on every call, and the device
// queries of make_verify_plan run once, normally from plan_verify before any capture.
cuda::VerifyPlan cached_plan(int device, int64_t max_batch, int64_t max_total_q, int64_t num_heads,
                             int64_t tile) {
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, cuda::VerifyPlan> plans;
  const Key key{device, max_batch, max_total_q, num_heads, tile};
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  TREEMLA_CHECK_VALUE(max_batch >= 1 && max_batch <= (1 << 20),
                      "max_batch must be in [1, 2^20], got ", max_batch);
  TREEMLA_CHECK_VALUE(max_total_q >= 1 && max_total_q < (int64_t{1} << 31),
                      "max_total_q must be in [1, 2^31), got ", max_total_q);
  TREEMLA_CHECK_VALUE(num_heads >= 1 && num_heads <= kMaxHeads, "num_heads must be in [1, ",
                      kMaxHeads, "], got ", num_heads);
  cuda::VerifyLimits lim;
  lim.max_batch = static_cast<int>(max_batch);
  lim.max_total_q = max_total_q;
  lim.num_heads = static_cast<int>(num_heads);
  lim.max_q_len = to_max_q_len(tile);
  const cuda::VerifyPlan plan =
      guarded([&] { return cuda::make_verify_plan(lim, device, to_tile(tile), to_family(tile)); });
  plans.emplace(key, plan);
  return plan;
}

void check_workspace(const at::Tensor& ws, const at::Tensor& q, const cuda::VerifyPlan& plan) {
  check_dtype(ws, "workspace", {at::kByte});
  check_same_device(ws, "workspace", q, "q");
  check_contiguous(ws, "workspace");
  TREEMLA_CHECK_VALUE(ws.numel() >= static_cast<int64_t>(plan.workspace_bytes),
                      "workspace must hold at least ", plan.workspace_bytes,
                      " bytes (plan.workspace_bytes for max_batch = ", plan.limits.max_batch,
                      ", num_heads = ", plan.limits.num_heads, "), got ", ws.numel());
}

void verify_cuda_into(VerifyParams p, const at::Tensor& q, const at::Tensor& o,
                      const at::Tensor& lse, int64_t max_batch, int64_t max_total_q, int64_t tile,
                      const std::optional<at::Tensor>& workspace) {
  if (q.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const int device = q.get_device();
  cuda::VerifyPlan plan = cached_plan(device, max_batch > 0 ? max_batch : p.batch,
                                      max_total_q > 0 ? max_total_q : q.size(0), p.num_heads, tile);
  TREEMLA_CHECK_VALUE(
      p.batch <= plan.limits.max_batch, "batch = ", p.batch,
      " (prefix_lens.shape[0]) exceeds the plan's max_batch = ", plan.limits.max_batch);
  // The device-side check bounds q_indptr[batch] by the plan's max_total_q; never let that bound
  // exceed the rows this call's tensors have, so bad lengths cannot reach past q, out or lse.
  plan.limits.max_total_q = std::min<int64_t>(plan.limits.max_total_q, q.size(0));
  at::Tensor ws;
  if (workspace.has_value()) {
    ws = *workspace;
    check_workspace(ws, q, plan);
  } else {
    ws = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, q.options().dtype(at::kByte));
    ws.narrow(0, 0, static_cast<int64_t>(plan.workspace_init_bytes)).zero_();
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device).stream();
  guarded([&] {
    cuda::verify_attention(p, plan, ws.data_ptr(), o.data_ptr(), lse.data_ptr<float>(), stream);
  });
}

std::tuple<at::Tensor, at::Tensor> verify_attention_cuda(
    const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& page_table,
    const at::Tensor& prefix_lens, const at::Tensor& q_indptr, const at::Tensor& tree_mask,
    double sm_scale, int64_t part, int64_t max_batch, int64_t max_total_q, int64_t tile,
    const std::optional<at::Tensor>& workspace) {
  const VerifyParams p = verify_params(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask,
                                       sm_scale, part, /*allow_fp32=*/false);
  at::Tensor o = at::empty({q.size(0), q.size(1), kHeadDimV}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  verify_cuda_into(p, q, o, lse, max_batch, max_total_q, tile, workspace);
  return {o, lse};
}

void verify_attention_out_cuda(const at::Tensor& q, const at::Tensor& kv_cache,
                               const at::Tensor& page_table, const at::Tensor& prefix_lens,
                               const at::Tensor& q_indptr, const at::Tensor& tree_mask,
                               double sm_scale, int64_t part, int64_t max_batch,
                               int64_t max_total_q, int64_t tile, const at::Tensor& out,
                               const at::Tensor& lse, const std::optional<at::Tensor>& workspace) {
  const VerifyParams p = verify_params(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask,
                                       sm_scale, part, /*allow_fp32=*/false);
  check_verify_outputs(q, out, lse);
  verify_cuda_into(p, q, out, lse, max_batch, max_total_q, tile, workspace);
}

void merge_cuda_into(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                     const at::Tensor& s_b, const at::Tensor& v, const at::Tensor& s) {
  if (v_a.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(v_a.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(v_a.get_device()).stream();
  guarded([&] {
    cuda::merge_state(to_dtype(v_a.scalar_type()), v_a.data_ptr(), s_a.data_ptr<float>(),
                      v_b.data_ptr(), s_b.data_ptr<float>(), v.data_ptr(), s.data_ptr<float>(),
                      v_a.size(0), static_cast<int>(v_a.size(1)), static_cast<int>(v_a.size(2)),
                      stream);
  });
}

pybind11::dict plan_dict(const cuda::VerifyPlan& plan) {
  pybind11::dict d;
  d["max_batch"] = plan.limits.max_batch;
  d["max_total_q"] = plan.limits.max_total_q;
  d["num_heads"] = plan.limits.num_heads;
  d["max_q_len"] = plan.limits.max_q_len;
  d["device"] = plan.device;
  d["sm_count"] = plan.sm_count;
  d["compute_capability"] = plan.compute_capability;
  d["tile"] = cuda::tile_config_name(plan.tile);
  d["family"] = cuda::kernel_family_name(plan.family);
  d["num_ctas"] = plan.num_ctas;
  d["workspace_bytes"] = static_cast<int64_t>(plan.workspace_bytes);
  d["header_bytes"] = static_cast<int64_t>(plan.workspace_init_bytes);
  return d;
}

}  // namespace

void define_cuda_python(pybind11::module& m) {
  m.def("with_cuda", [] { return true; });
  m.def("compiled_architectures", [] { return cuda::compiled_architectures(); });
  m.def("plan_verify", [](int64_t max_batch, int64_t max_total_q, int64_t num_heads, int64_t device,
                          int64_t tile) {
    const cuda::VerifyPlan plan =
        cached_plan(static_cast<int>(device), max_batch, max_total_q, num_heads, tile);
    return plan_dict(plan);
  });
  m.def("check_status", [](const at::Tensor& workspace, int64_t max_batch, int64_t max_total_q,
                           int64_t num_heads, int64_t tile) {
    TREEMLA_CHECK_VALUE(workspace.is_cuda(), "workspace must be a CUDA tensor, got one on ",
                        workspace.device().str());
    const c10::cuda::CUDAGuard guard(workspace.device());
    const int device = workspace.get_device();
    const cuda::VerifyPlan plan = cached_plan(device, max_batch, max_total_q, num_heads, tile);
    check_workspace(workspace, workspace, plan);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device).stream();
    guarded([&] { cuda::check_status(plan, workspace.data_ptr(), stream); });
  });
}

#else  // no CUDA in this build

namespace {

[[noreturn]] void no_cuda() {
  TREEMLA_THROW(
      Error,
      "treemla was built without CUDA (torch had no CUDA or nvcc was not found when it "
      "was built); rebuild with a CUDA torch and nvcc: pip install --no-build-isolation ./python");
}

std::tuple<at::Tensor, at::Tensor> verify_attention_cuda(const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&, const at::Tensor&,
                                                         double, int64_t, int64_t, int64_t, int64_t,
                                                         const std::optional<at::Tensor>&) {
  no_cuda();
}
void verify_attention_out_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                               int64_t, int64_t, int64_t, int64_t, const at::Tensor&,
                               const at::Tensor&, const std::optional<at::Tensor>&) {
  no_cuda();
}
void merge_cuda_into(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                     const at::Tensor&, const at::Tensor&) {
  no_cuda();
}

}  // namespace

void define_cuda_python(pybind11::module& m) {
  m.def("with_cuda", [] { return false; });
  m.def("compiled_architectures", [] { return std::string(); });
  m.def("plan_verify",
        [](int64_t, int64_t, int64_t, int64_t, int64_t) -> pybind11::dict { no_cuda(); });
  m.def("check_status", [](const at::Tensor&, int64_t, int64_t, int64_t, int64_t) { no_cuda(); });
}

#endif

}  // namespace treemla::binding

TORCH_LIBRARY_IMPL(treemla, CUDA, m) {
  m.impl("verify_attention", &treemla::binding::verify_attention_cuda);
  m.impl("verify_attention_out", &treemla::binding::verify_attention_out_cuda);
  m.impl("merge_state", &treemla::binding::merge_state_with<treemla::binding::merge_cuda_into>);
  m.impl("merge_state_out",
         &treemla::binding::merge_state_out_with<treemla::binding::merge_cuda_into>);
}
