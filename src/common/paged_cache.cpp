// treemla: the one check of a paged cache's geometry (include/treemla/paged_cache.h).
#include "treemla/paged_cache.h"

#include <limits>

#include "treemla/error.h"

namespace treemla {

void check_num_pages(int64_t num_pages, const std::string& name) {
  TREEMLA_CHECK(num_pages >= 1, name << " = " << num_pages << " must be >= 1");
}

void check_page_size(int64_t page_size, const std::string& name) {
  TREEMLA_CHECK(
      page_size >= 1 && page_size <= kMaxPageSize && (page_size & (page_size - 1)) == 0,
      name << " = " << page_size << " must be a power of two in [1, " << kMaxPageSize << "]");
}

void check_page_table_stride(int64_t page_table_stride, const std::string& name) {
  TREEMLA_CHECK(page_table_stride >= 0, name << " = " << page_table_stride << " must be >= 0");
}

void validate(const PagedCacheLayout& l, const std::string& prefix) {
  check_num_pages(l.num_pages, prefix + "num_pages");
  check_page_size(l.page_size, prefix + "page_size");
  TREEMLA_CHECK(l.row_width >= 1, prefix << "row_width = " << l.row_width << " must be >= 1");
  TREEMLA_CHECK(l.elem_size >= 1, prefix << "elem_size = " << l.elem_size << " must be >= 1");
  // row_bytes() <= 2^62 cannot overflow; page_bytes() and the whole cache might.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  TREEMLA_CHECK(
      l.row_bytes() <= kMax / l.page_size && l.page_bytes() <= kMax / l.num_pages,
      prefix << "num_pages * page_size * row_width * elem_size overflows int64 (num_pages = "
             << l.num_pages << ", page_size = " << l.page_size << ", row_width = " << l.row_width
             << ", elem_size = " << l.elem_size << ")");
  check_page_table_stride(l.page_table_stride, "page_table_stride");
}

}  // namespace treemla
