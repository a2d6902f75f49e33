// The treemla operator library: schemas, the CPU kernels of verify attention and merge_state,
// and the Python module (treemla._C) that carries the non-operator helpers.
//
// Operators come in a functional form (returns new tensors; what torch.compile and autograd-free
// graphs want) and an _out form that writes into caller-owned tensors (what CUDA-graph capture
// with static buffers wants). Fake (meta) kernels are registered from Python
// (treemla/_fake.py), so symbolic shapes work under torch.compile.
#include <torch/extension.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "common.h"
#include "ops.h"
#include "treemla/attention.h"

namespace treemla::binding {

namespace {

// The CPU reference (treemla::cpu::verify_full, the specification) into o / lse. Rows at or past
// q_indptr[batch] are left as they are.
void verify_cpu_into(VerifyParams p, const at::Tensor& q, const at::Tensor& page_table,
                     const at::Tensor& o, const at::Tensor& lse) {
  // A column slice of a wider table has row stride > row length; the library's checks assume the
  // stride is the row length, so give it a dense copy (cheap next to the attention itself).
  at::Tensor table = page_table.contiguous();
  p.page_table = table.data_ptr<int32_t>();
  p.page_table_stride = static_cast<int>(table.size(1));
  const int64_t total = p.q_indptr[p.batch];
  TREEMLA_CHECK_VALUE(total >= 0 && total <= q.size(0), "q_indptr[batch] = q_indptr[", p.batch,
                      "] = ", total, " must be in [0, total_q = q.shape[0] = ", q.size(0), "]");
  guarded([&] { cpu::validate(p); });
  if (total == 0) return;
  const int64_t heads = p.num_heads;
  at::Tensor of = at::empty({total, heads, kHeadDimV}, q.options().dtype(at::kFloat));
  at::Tensor lf = at::empty({total, heads}, q.options().dtype(at::kFloat));
  guarded([&] { cpu::verify_full(p, of.data_ptr<float>(), lf.data_ptr<float>()); });
  o.narrow(0, 0, total).copy_(of);
  lse.narrow(0, 0, total).copy_(lf);
}

std::tuple<at::Tensor, at::Tensor> verify_attention_cpu(
    const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& page_table,
    const at::Tensor& prefix_lens, const at::Tensor& q_indptr, const at::Tensor& tree_mask,
    double sm_scale, int64_t part, int64_t max_batch, int64_t max_total_q, int64_t tile,
    const std::optional<at::Tensor>& workspace) {
  const VerifyParams p = verify_params(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask,
                                       sm_scale, part, /*allow_fp32=*/true);
  // Rows past q_indptr[batch] see nothing: o = 0, lse = -inf.
  at::Tensor o = at::zeros({q.size(0), q.size(1), kHeadDimV}, q.options());
  at::Tensor lse = at::full({q.size(0), q.size(1)}, -std::numeric_limits<float>::infinity(),
                            q.options().dtype(at::kFloat));
  verify_cpu_into(p, q, page_table, o, lse);
  return {o, lse};
}

void verify_attention_out_cpu(const at::Tensor& q, const at::Tensor& kv_cache,
                              const at::Tensor& page_table, const at::Tensor& prefix_lens,
                              const at::Tensor& q_indptr, const at::Tensor& tree_mask,
                              double sm_scale, int64_t part, int64_t max_batch, int64_t max_total_q,
                              int64_t tile, const at::Tensor& out, const at::Tensor& lse,
                              const std::optional<at::Tensor>& workspace) {
  const VerifyParams p = verify_params(q, kv_cache, page_table, prefix_lens, q_indptr, tree_mask,
                                       sm_scale, part, /*allow_fp32=*/true);
  check_verify_outputs(q, out, lse);
  verify_cpu_into(p, q, page_table, out, lse);
}

// cpu::merge_state works in fp32; other dtypes go through fp32 copies.
void merge_cpu_into(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                    const at::Tensor& s_b, const at::Tensor& v, const at::Tensor& s) {
  const bool fp32 = v_a.scalar_type() == at::kFloat;
  at::Tensor va = v_a.to(at::kFloat).contiguous(), vb = v_b.to(at::kFloat).contiguous();
  at::Tensor vf = fp32 ? v : at::empty(v.sizes(), v.options().dtype(at::kFloat));
  guarded([&] {
    cpu::merge_state(va.data_ptr<float>(), s_a.data_ptr<float>(), vb.data_ptr<float>(),
                     s_b.data_ptr<float>(), vf.data_ptr<float>(), s.data_ptr<float>(), v_a.size(0),
                     static_cast<int>(v_a.size(1)), static_cast<int>(v_a.size(2)));
  });
  if (!fp32) v.copy_(vf);
}

}  // namespace

}  // namespace treemla::binding

TORCH_LIBRARY(treemla, m) {
  // part: 0 = prefix + tail, 1 = prefix only, 2 = tail only. max_batch / max_total_q / tile
  // select the GPU plan (0 = from the shapes / automatic); the CPU ignores them and workspace.
  m.def(
      "verify_attention(Tensor q, Tensor kv_cache, Tensor page_table, Tensor prefix_lens, "
      "Tensor q_indptr, Tensor tree_mask, float sm_scale, int part=0, int max_batch=0, "
      "int max_total_q=0, int tile=0, Tensor(a!)? workspace=None) -> (Tensor, Tensor)");
  m.def(
      "verify_attention_out(Tensor q, Tensor kv_cache, Tensor page_table, Tensor prefix_lens, "
      "Tensor q_indptr, Tensor tree_mask, float sm_scale, int part, int max_batch, "
      "int max_total_q, int tile, Tensor(b!) out, Tensor(c!) lse, Tensor(a!)? workspace=None) "
      "-> ()");
  m.def("merge_state(Tensor v_a, Tensor s_a, Tensor v_b, Tensor s_b) -> (Tensor, Tensor)");
  m.def(
      "merge_state_out(Tensor v_a, Tensor s_a, Tensor v_b, Tensor s_b, Tensor(a!) v, "
      "Tensor(b!) s) -> ()");
  treemla::binding::define_tree_ops(m);
  treemla::binding::define_kvpool_ops(m);
}

TORCH_LIBRARY_IMPL(treemla, CPU, m) {
  m.impl("verify_attention", &treemla::binding::verify_attention_cpu);
  m.impl("verify_attention_out", &treemla::binding::verify_attention_out_cpu);
  m.impl("merge_state", &treemla::binding::merge_state_with<treemla::binding::merge_cpu_into>);
  m.impl("merge_state_out",
         &treemla::binding::merge_state_out_with<treemla::binding::merge_cpu_into>);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "treemla torch extension: operators live in torch.ops.treemla";
  // Errors from helpers called straight from Python keep their kind (ValueError, TypeError).
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    } catch (const treemla::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  treemla::binding::define_cuda_python(m);
  treemla::binding::define_kvpool_python(m);
  treemla::binding::define_budget_python(m);
}
