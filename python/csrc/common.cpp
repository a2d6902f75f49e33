// Argument checks of the torch binding. Messages name the argument, the expected layout and
// what was given, e.g. "q must have shape [total_q, H, 576], got [3, 8, 512]".
#include "common.h"

#include <cmath>
#include <limits>

namespace treemla::binding {

namespace {

// The name Python users know: torch.bfloat16 rather than BFloat16.
std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kHalf:
      return "torch.float16";
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kByte:
      return "torch.uint8";
    case at::kBool:
      return "torch.bool";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

std::string strides_str(const at::Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.stride(i);
  os << "]";
  return os.str();
}

}  // namespace

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

void check_dtype(const at::Tensor& t, const char* name, std::initializer_list<at::ScalarType> ok) {
  for (at::ScalarType s : ok) {
    if (t.scalar_type() == s) return;
  }
  std::ostringstream os;
  int i = 0;
  for (at::ScalarType s : ok) os << (i++ ? " or " : "") << dtype_str(s);
  TREEMLA_THROW(TypeError, name, " must be ", os.str(), ", got ", dtype_str(t.scalar_type()));
}

void check_contiguous(const at::Tensor& t, const char* name) {
  TREEMLA_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous (shape ", shape_str(t),
                      ", strides ", strides_str(t), "); call .contiguous() first");
}

void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& ref,
                       const char* ref_name) {
  TREEMLA_CHECK_VALUE(t.device() == ref.device(), name, " must be on ", ref_name, "'s device (",
                      ref.device().str(), "), got ", t.device().str());
}

void check_cpu(const at::Tensor& t, const char* name) {
  TREEMLA_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor, got one on ",
                      t.device().str());
}

int32_t to_int32(int64_t v, const char* name) {
  TREEMLA_CHECK_VALUE(
      v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(), name,
      " = ", v, " does not fit in int32");
  return static_cast<int32_t>(v);
}

void throw_library_error(const std::exception& e) {
  // treemla::Error's text already starts with "treemla: " and ends with where it was raised.
  const bool ours = dynamic_cast<const treemla::Error*>(&e) != nullptr;
  TREEMLA_THROW(Error, (ours ? std::string() : std::string("treemla: ")) + e.what());
}

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return DType::kBF16;
    case at::kHalf:
      return DType::kFP16;
    case at::kFloat:
      return DType::kFP32;
    default:
      TREEMLA_THROW(TypeError, "unsupported dtype ", dtype_str(t));
  }
}

VerifyParams verify_params(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& page_table, const at::Tensor& prefix_lens,
                           const at::Tensor& q_indptr, const at::Tensor& tree_mask, double sm_scale,
                           int64_t part, bool allow_fp32) {
  // q: [total_q, H, 576]
  TREEMLA_CHECK_VALUE(q.dim() == 3 && q.size(2) == kHeadDimQK, "q must have shape [total_q, H, ",
                      kHeadDimQK, "], got ", shape_str(q));
  TREEMLA_CHECK_VALUE(q.size(1) >= 1 && q.size(1) <= kMaxHeads, "q must have 1..", kMaxHeads,
                      " heads (q.shape[1]), got ", q.size(1));
  if (allow_fp32) {
    check_dtype(q, "q", {at::kBFloat16, at::kHalf, at::kFloat});
  } else {
    check_dtype(q, "q", {at::kBFloat16, at::kHalf});
  }
  check_contiguous(q, "q");

  // kv_cache: [num_pages, page_size, 576] or [num_pages, page_size, 1, 576]
  const bool kv3 = kv_cache.dim() == 3 && kv_cache.size(2) == kHeadDimQK;
  const bool kv4 = kv_cache.dim() == 4 && kv_cache.size(2) == 1 && kv_cache.size(3) == kHeadDimQK;
  TREEMLA_CHECK_VALUE(kv3 || kv4, "kv_cache must have shape [num_pages, page_size, ", kHeadDimQK,
                      "] or [num_pages, page_size, 1, ", kHeadDimQK, "], got ",
                      shape_str(kv_cache));
  TREEMLA_CHECK_TYPE(kv_cache.scalar_type() == q.scalar_type(), "kv_cache must have q's dtype (",
                     dtype_str(q.scalar_type()), "), got ", dtype_str(kv_cache.scalar_type()));
  check_contiguous(kv_cache, "kv_cache");
  check_same_device(kv_cache, "kv_cache", q, "q");
  const int64_t num_pages = kv_cache.size(0), page_size = kv_cache.size(1);
  TREEMLA_CHECK_VALUE(num_pages >= 1 && num_pages < (int64_t{1} << 31),
                      "kv_cache must have 1..2^31-1 pages (kv_cache.shape[0]), got ", num_pages);
  TREEMLA_CHECK_VALUE(
      page_size >= 1 && page_size <= 65536 && (page_size & (page_size - 1)) == 0,
      "kv_cache's page_size (kv_cache.shape[1]) must be a power of two in [1, 65536], got ",
      page_size);

  // prefix_lens: [batch]; q_indptr: [batch + 1]; page_table: [batch, max_pages] (rows may be
  // strided, e.g. a column slice of a wider table).
  TREEMLA_CHECK_VALUE(prefix_lens.dim() == 1 && prefix_lens.size(0) >= 1,
                      "prefix_lens must have shape [batch] with batch >= 1, got ",
                      shape_str(prefix_lens));
  const int64_t batch = prefix_lens.size(0);
  check_dtype(prefix_lens, "prefix_lens", {at::kInt});
  check_contiguous(prefix_lens, "prefix_lens");
  check_same_device(prefix_lens, "prefix_lens", q, "q");
  TREEMLA_CHECK_VALUE(q_indptr.dim() == 1 && q_indptr.size(0) == batch + 1,
                      "q_indptr must have shape [batch + 1] = [", batch + 1,
                      "] (batch from prefix_lens), got ", shape_str(q_indptr));
  check_dtype(q_indptr, "q_indptr", {at::kInt});
  check_contiguous(q_indptr, "q_indptr");
  check_same_device(q_indptr, "q_indptr", q, "q");
  TREEMLA_CHECK_VALUE(
      page_table.dim() == 2 && page_table.size(0) == batch && page_table.size(1) >= 1,
      "page_table must have shape [batch, max_pages] = [", batch,
      ", >= 1] (batch from prefix_lens), got ", shape_str(page_table));
  check_dtype(page_table, "page_table", {at::kInt});
  TREEMLA_CHECK_VALUE(
      page_table.stride(1) == 1 && page_table.stride(0) >= page_table.size(1) &&
          page_table.stride(0) < (int64_t{1} << 31),
      "page_table rows must be contiguous (stride(1) == 1, stride(0) >= shape[1]), got "
      "shape ",
      shape_str(page_table), " strides ", strides_str(page_table));
  check_same_device(page_table, "page_table", q, "q");

  // tree_mask: [total_q, mask_words] uint64 bit rows, held as int64 (same bits).
  TREEMLA_CHECK_VALUE(tree_mask.dim() == 2 && tree_mask.size(0) == q.size(0) &&
                          tree_mask.size(1) >= 1 && tree_mask.size(1) <= kMaxMaskWords,
                      "tree_mask must have shape [total_q, mask_words] = [", q.size(0), ", 1..",
                      kMaxMaskWords, "] (total_q from q), got ", shape_str(tree_mask));
  check_dtype(tree_mask, "tree_mask", {at::kLong, at::kUInt64});
  check_contiguous(tree_mask, "tree_mask");
  check_same_device(tree_mask, "tree_mask", q, "q");

  TREEMLA_CHECK_VALUE(std::isfinite(sm_scale) && sm_scale > 0,
                      "sm_scale must be finite and > 0, got ", sm_scale);
  TREEMLA_CHECK_VALUE(part >= 0 && part <= 2, "part must be 0 (all), 1 (prefix) or 2 (tail), got ",
                      part);
  TREEMLA_CHECK_VALUE(q.size(0) < (int64_t{1} << 31) / q.size(1),
                      "q has too many rows: total_q * H must be < 2^31, got ", shape_str(q));

  VerifyParams p;
  p.dtype = to_dtype(q.scalar_type());
  p.batch = static_cast<int>(batch);
  p.num_heads = static_cast<int>(q.size(1));
  p.page_size = static_cast<int>(page_size);
  p.num_pages = static_cast<int>(num_pages);
  p.page_table_stride = static_cast<int>(page_table.stride(0));
  p.mask_words = static_cast<int>(tree_mask.size(1));
  p.sm_scale = static_cast<float>(sm_scale);
  p.part = static_cast<VerifyPart>(part);
  p.q = q.data_ptr();
  p.kv_cache = kv_cache.data_ptr();
  p.page_table = page_table.data_ptr<int32_t>();
  p.prefix_lens = prefix_lens.data_ptr<int32_t>();
  p.q_indptr = q_indptr.data_ptr<int32_t>();
  p.tree_mask = static_cast<const uint64_t*>(tree_mask.data_ptr());
  return p;
}

void check_verify_outputs(const at::Tensor& q, const at::Tensor& o, const at::Tensor& lse) {
  TREEMLA_CHECK_VALUE(
      o.dim() == 3 && o.size(0) == q.size(0) && o.size(1) == q.size(1) && o.size(2) == kHeadDimV,
      "out must have shape [total_q, H, ", kHeadDimV, "] = [", q.size(0), ", ", q.size(1), ", ",
      kHeadDimV, "], got ", shape_str(o));
  TREEMLA_CHECK_TYPE(o.scalar_type() == q.scalar_type(), "out must have q's dtype (",
                     dtype_str(q.scalar_type()), "), got ", dtype_str(o.scalar_type()));
  check_contiguous(o, "out");
  check_same_device(o, "out", q, "q");
  TREEMLA_CHECK_VALUE(lse.dim() == 2 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1),
                      "lse must have shape [total_q, H] = [", q.size(0), ", ", q.size(1), "], got ",
                      shape_str(lse));
  check_dtype(lse, "lse", {at::kFloat});
  check_contiguous(lse, "lse");
  check_same_device(lse, "lse", q, "q");
}

void check_merge_args(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                      const at::Tensor& s_b) {
  TREEMLA_CHECK_VALUE(v_a.dim() == 3 && v_a.size(1) >= 1 && v_a.size(2) >= 1,
                      "v_a must have shape [tokens, heads, dim], got ", shape_str(v_a));
  check_dtype(v_a, "v_a", {at::kBFloat16, at::kHalf, at::kFloat});
  check_contiguous(v_a, "v_a");
  TREEMLA_CHECK_VALUE(v_b.sizes() == v_a.sizes(), "v_b must have v_a's shape ", shape_str(v_a),
                      ", got ", shape_str(v_b));
  TREEMLA_CHECK_TYPE(v_b.scalar_type() == v_a.scalar_type(), "v_b must have v_a's dtype (",
                     dtype_str(v_a.scalar_type()), "), got ", dtype_str(v_b.scalar_type()));
  check_contiguous(v_b, "v_b");
  check_same_device(v_b, "v_b", v_a, "v_a");
  const char* names[2] = {"s_a", "s_b"};
  const at::Tensor* ss[2] = {&s_a, &s_b};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& s = *ss[i];
    TREEMLA_CHECK_VALUE(s.dim() == 2 && s.size(0) == v_a.size(0) && s.size(1) == v_a.size(1),
                        names[i], " must have shape [tokens, heads] = [", v_a.size(0), ", ",
                        v_a.size(1), "], got ", shape_str(s));
    check_dtype(s, names[i], {at::kFloat});
    check_contiguous(s, names[i]);
    check_same_device(s, names[i], v_a, "v_a");
  }
  TREEMLA_CHECK_VALUE(v_a.size(1) < (int64_t{1} << 31) && v_a.size(2) < (int64_t{1} << 31),
                      "v_a's heads and dim must be < 2^31, got ", shape_str(v_a));
}

void check_merge_outputs(const at::Tensor& v_a, const at::Tensor& v, const at::Tensor& s) {
  TREEMLA_CHECK_VALUE(v.sizes() == v_a.sizes(), "v must have v_a's shape ", shape_str(v_a),
                      ", got ", shape_str(v));
  TREEMLA_CHECK_TYPE(v.scalar_type() == v_a.scalar_type(), "v must have v_a's dtype (",
                     dtype_str(v_a.scalar_type()), "), got ", dtype_str(v.scalar_type()));
  check_contiguous(v, "v");
  check_same_device(v, "v", v_a, "v_a");
  TREEMLA_CHECK_VALUE(s.dim() == 2 && s.size(0) == v_a.size(0) && s.size(1) == v_a.size(1),
                      "s must have shape [tokens, heads] = [", v_a.size(0), ", ", v_a.size(1),
                      "], got ", shape_str(s));
  check_dtype(s, "s", {at::kFloat});
  check_contiguous(s, "s");
  check_same_device(s, "s", v_a, "v_a");
}

}  // namespace treemla::binding
