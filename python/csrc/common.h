// Shared helpers of the torch binding: argument checks that raise the right Python exception
// with the argument's name, conversion of treemla::Error into a torch error, and the
// VerifyParams view of a call's tensors.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <sstream>
#include <string>

#include "treemla/attention.h"
#include "treemla/error.h"

// Checks that throw torch's error types without capturing a C++ backtrace: TORCH_CHECK_* walk
// and record the stack on every failure, which adds nothing to an argument error reported to a
// Python caller. Same mapping to Python ValueError / TypeError / RuntimeError as
// TORCH_CHECK_VALUE / TORCH_CHECK_TYPE / TORCH_CHECK.
#define TREEMLA_THROW(kind, ...) throw ::c10::kind(::c10::str(__VA_ARGS__))
#define TREEMLA_CHECK_KIND(kind, cond, ...)                      \
  do {                                                           \
    if (C10_UNLIKELY(!(cond))) TREEMLA_THROW(kind, __VA_ARGS__); \
  } while (0)
#define TREEMLA_CHECK_VALUE(cond, ...) TREEMLA_CHECK_KIND(ValueError, cond, __VA_ARGS__)
#define TREEMLA_CHECK_TYPE(cond, ...) TREEMLA_CHECK_KIND(TypeError, cond, __VA_ARGS__)
#define TREEMLA_CHECK_RUNTIME(cond, ...) TREEMLA_CHECK_KIND(Error, cond, __VA_ARGS__)

namespace treemla::binding {

std::string shape_str(const at::Tensor& t);

void check_dtype(const at::Tensor& t, const char* name, std::initializer_list<at::ScalarType> ok);
void check_contiguous(const at::Tensor& t, const char* name);
void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& ref,
                       const char* ref_name);
void check_cpu(const at::Tensor& t, const char* name);
// v as int32, or ValueError "<name> = v does not fit in int32".
int32_t to_int32(int64_t v, const char* name);

// Runs f and turns a treemla::Error (or other std::exception that is not a torch error) into a
// c10::Error, so it reaches Python as RuntimeError with the library's message on every path
// (eager calls, torch.compile's wrappers, TorchScript).
[[noreturn]] void throw_library_error(const std::exception& e);

template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw_library_error(e);
  }
}

DType to_dtype(at::ScalarType t);

// Checks the tensors of a verify-attention call (shapes, dtypes, devices, strides) and fills the
// pointer and size fields of VerifyParams. Content (lengths, page indices) is checked by the
// library: on the CPU before computing, on the GPU by the schedule kernel (check_status).
VerifyParams verify_params(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& page_table, const at::Tensor& prefix_lens,
                           const at::Tensor& q_indptr, const at::Tensor& tree_mask, double sm_scale,
                           int64_t part, bool allow_fp32);

// Checks o / lse given for q ([total_q, H, 576]): o [total_q, H, 512] q.dtype, lse [total_q, H]
// fp32, both contiguous and on q's device.
void check_verify_outputs(const at::Tensor& q, const at::Tensor& o, const at::Tensor& lse);

// Checks a merge_state call: v_* [tokens, heads, dim], s_* [tokens, heads] fp32, one device.
void check_merge_args(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                      const at::Tensor& s_b);
void check_merge_outputs(const at::Tensor& v_a, const at::Tensor& v, const at::Tensor& s);

// merge_state / merge_state_out of one device around its kernel, which writes (v, s) from the
// checked inputs: the functional form allocates the outputs, the out form checks them.
using MergeInto = void (*)(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                           const at::Tensor& s_b, const at::Tensor& v, const at::Tensor& s);
template <MergeInto Into>
std::tuple<at::Tensor, at::Tensor> merge_state_with(const at::Tensor& v_a, const at::Tensor& s_a,
                                                    const at::Tensor& v_b, const at::Tensor& s_b) {
  check_merge_args(v_a, s_a, v_b, s_b);
  at::Tensor v = at::empty_like(v_a), s = at::empty_like(s_a);
  Into(v_a, s_a, v_b, s_b, v, s);
  return {v, s};
}
template <MergeInto Into>
void merge_state_out_with(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                          const at::Tensor& s_b, const at::Tensor& v, const at::Tensor& s) {
  check_merge_args(v_a, s_a, v_b, s_b);
  check_merge_outputs(v_a, v, s);
  Into(v_a, s_a, v_b, s_b, v, s);
}

}  // namespace treemla::binding
