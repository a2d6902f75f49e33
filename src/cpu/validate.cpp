// treemla: argument checks for a verify-attention call (host pointers).
#include <cmath>
#include <cstdint>

#include "treemla/attention.h"
#include "treemla/error.h"

namespace treemla::cpu {

namespace {

const char* part_name(VerifyPart part) {
  switch (part) {
    case VerifyPart::kAll:
      return "kAll";
    case VerifyPart::kPrefix:
      return "kPrefix";
    case VerifyPart::kTail:
      return "kTail";
  }
  return "?";
}

// Logical rows [lo, hi) of a request that the call reads. A request without query rows reads
// nothing, so its page entries are not checked.
void rows_read(VerifyPart part, int64_t prefix_len, int64_t q_len, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = 0;
  if (q_len == 0) return;
  *lo = part == VerifyPart::kTail ? prefix_len : 0;
  *hi = part == VerifyPart::kPrefix ? prefix_len : prefix_len + q_len;
}

}  // namespace

void validate(const VerifyParams& p) {
  TREEMLA_CHECK(p.batch >= 1, "batch = " << p.batch << " must be >= 1");
  TREEMLA_CHECK(p.num_heads >= 1 && p.num_heads <= kMaxHeads,
                "num_heads = " << p.num_heads << " is out of range [1, " << kMaxHeads << "]");
  treemla::validate(cache_layout_of(p));  // page_size, num_pages, page_table_stride (paged_cache.h)
  TREEMLA_CHECK(p.mask_words >= 1 && p.mask_words <= kMaxMaskWords,
                "mask_words = " << p.mask_words << " is out of range [1, " << kMaxMaskWords << "]");
  const int dt = static_cast<int>(p.dtype);
  TREEMLA_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kFP16 || p.dtype == DType::kFP32,
                "dtype = " << dt << " is not one of bf16, fp16, fp32");
  TREEMLA_CHECK(p.kv_dtype == -1 || p.kv_dtype == dt,
                "kv_dtype = " << p.kv_dtype << " must be -1 (same as dtype) or equal dtype = " << dt
                              << "; a KV cache of another type is not supported yet");
  const int part = static_cast<int>(p.part);
  TREEMLA_CHECK(
      p.part == VerifyPart::kAll || p.part == VerifyPart::kPrefix || p.part == VerifyPart::kTail,
      "part = " << part << " is not one of kAll, kPrefix, kTail");
  TREEMLA_CHECK(std::isfinite(p.sm_scale) && p.sm_scale > 0.f,
                "sm_scale = " << p.sm_scale << " must be finite and > 0");
  TREEMLA_CHECK(p.kv_cache != nullptr, "kv_cache is null");
  TREEMLA_CHECK(p.page_table != nullptr, "page_table is null");
  TREEMLA_CHECK(p.prefix_lens != nullptr, "prefix_lens is null");
  TREEMLA_CHECK(p.q_indptr != nullptr, "q_indptr is null");
  TREEMLA_CHECK(p.q_indptr[0] == 0, "q_indptr[0] = " << p.q_indptr[0] << " must be 0");
  // q and tree_mask have total_q rows; with no rows at all an empty buffer may be null.
  const bool has_rows = p.q_indptr[p.batch] != 0;
  TREEMLA_CHECK(p.q != nullptr || !has_rows, "q is null");
  TREEMLA_CHECK(p.tree_mask != nullptr || !has_rows, "tree_mask is null");

  int max_q = 0, max_q_request = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int32_t lo = p.q_indptr[b], hi = p.q_indptr[b + 1];
    TREEMLA_CHECK(hi >= lo, "q_indptr[" << b + 1 << "] = " << hi << " is less than q_indptr[" << b
                                        << "] = " << lo << " (q_indptr must be non-decreasing)");
    const int64_t q_len = static_cast<int64_t>(hi) - lo;
    TREEMLA_CHECK(q_len <= kMaxTreeNodes, "q_len of request "
                                              << b << " = q_indptr[" << b + 1 << "] - q_indptr["
                                              << b << "] = " << q_len
                                              << " exceeds kMaxTreeNodes = " << kMaxTreeNodes);
    const int32_t prefix = p.prefix_lens[b];
    TREEMLA_CHECK(prefix >= 0 && prefix <= kMaxPrefixLen, "prefix_lens[" << b << "] = " << prefix
                                                                         << " is out of range [0, "
                                                                         << kMaxPrefixLen << "]");
    if (q_len > max_q) {
      max_q = static_cast<int>(q_len);
      max_q_request = b;
    }
  }
  TREEMLA_CHECK(static_cast<int64_t>(p.mask_words) * 64 >= max_q,
                "mask_words = " << p.mask_words
                                << " is less than ceil(max q_len / 64) = " << (max_q + 63) / 64
                                << " (request " << max_q_request << " has q_len " << max_q << ")");

  for (int b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.q_indptr[b], q_len = p.q_indptr[b + 1] - q0, prefix = p.prefix_lens[b];
    int64_t lo, hi;
    rows_read(p.part, prefix, q_len, &lo, &hi);
    if (hi > lo) {
      const int64_t first_page = lo / p.page_size, pages = (hi + p.page_size - 1) / p.page_size;
      TREEMLA_CHECK(pages <= p.page_table_stride,
                    "page_table_stride = " << p.page_table_stride << " is less than the " << pages
                                           << " pages request " << b << " needs (logical rows "
                                           << lo << ".." << hi - 1 << " with page_size "
                                           << p.page_size << ", part " << part_name(p.part) << ")");
      const int32_t* row = p.page_table + static_cast<int64_t>(b) * p.page_table_stride;
      for (int64_t j = first_page; j < pages; ++j) {
        TREEMLA_CHECK(row[j] >= 0 && row[j] < p.num_pages,
                      "page_table[" << b << "][" << j << "] = " << row[j] << " is out of range [0, "
                                    << p.num_pages << ") (request " << b << " reads logical rows "
                                    << lo << ".." << hi - 1 << ")");
      }
    }
    // Bits at or past q_len would name a node of another request (or none); reject them even
    // when part = kPrefix ignores the mask, so one mask is valid for every part.
    for (int64_t i = 0; i < q_len; ++i) {
      const uint64_t* m = p.tree_mask + (q0 + i) * p.mask_words;
      for (int w = 0; w < p.mask_words; ++w) {
        const int64_t first_bad =
            q_len - static_cast<int64_t>(w) * 64;  // first invalid bit in word w
        if (first_bad >= 64) continue;
        const uint64_t bad = first_bad <= 0 ? m[w] : m[w] & (~uint64_t{0} << first_bad);
        if (bad == 0) continue;
        int bit = 0;
        while (((bad >> bit) & 1u) == 0) ++bit;
        TREEMLA_FAIL("tree_mask row " << q0 + i << " (request " << b << ", node " << i
                                      << ") has bit " << w * 64 + bit
                                      << " set; bits must be < the request's q_len = " << q_len);
      }
    }
  }
}

}  // namespace treemla::cpu
