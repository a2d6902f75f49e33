// treemla tests: what a verify kernel that drops keys would compute, built from a VerifyCase for
// the comparator-must-fail tests. The same cache is seen through page_size 1 (page = slot), so
// that single logical rows can be left out of a request's sequence; the tree masks are copied,
// optionally without the root bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/verify_case.h"

namespace treemla::test {

struct MutatedCall {
  const VerifyCase* c = nullptr;
  VerifyPart part = VerifyPart::kAll;
  int stride = 0;
  std::vector<int32_t> page_table, prefix_lens;
  std::vector<uint64_t> mask;

  // Pointers into this object and the case: build them where the call is made.
  VerifyParams params() const {
    VerifyParams p = c->params(part);
    p.page_size = 1;
    p.num_pages = c->num_pages * c->page_size;
    p.page_table_stride = stride;
    p.page_table = page_table.data();
    p.prefix_lens = prefix_lens.data();
    p.tree_mask = mask.data();
    return p;
  }
};

// drop[b]: prefix rows of request b to leave out (fewer lists than requests: the rest keep all);
// clear_root: every node's mask row loses bit 0, so no node sees the root's row.
inline MutatedCall mutated_call(const VerifyCase& c, const std::vector<std::vector<int64_t>>& drop,
                                bool clear_root, VerifyPart part = VerifyPart::kAll) {
  MutatedCall m;
  m.c = &c;
  m.part = part;
  std::vector<std::vector<int32_t>> rows(c.batch);  // slots of the kept logical rows, in order
  for (int b = 0; b < c.batch; ++b) {
    std::vector<int64_t> gone =
        b < static_cast<int>(drop.size()) ? drop[b] : std::vector<int64_t>{};
    std::sort(gone.begin(), gone.end());
    for (int64_t t : gone)
      TREEMLA_CHECK(t >= 0 && t < c.prefix_lens[b], "mutated_call: row "
                                                        << t << " of request " << b
                                                        << " is not a prefix row (prefix_len "
                                                        << c.prefix_lens[b] << ")");
    const int64_t n_kv = static_cast<int64_t>(c.prefix_lens[b]) + c.q_len(b);
    for (int64_t t = 0; t < n_kv; ++t)
      if (!std::binary_search(gone.begin(), gone.end(), t))
        rows[b].push_back(static_cast<int32_t>(c.kv_index(b, t) / kHeadDimQK));
    m.prefix_lens.push_back(static_cast<int32_t>(rows[b].size()) - c.q_len(b));
    m.stride = std::max(m.stride, static_cast<int>(rows[b].size()));
  }
  m.stride = std::max(m.stride, 1);
  m.page_table.assign(static_cast<size_t>(c.batch) * m.stride, kPoisonPageIndex);
  for (int b = 0; b < c.batch; ++b)
    std::copy(rows[b].begin(), rows[b].end(),
              m.page_table.begin() + static_cast<int64_t>(b) * m.stride);
  m.mask = c.tree_mask;
  if (clear_root)
    for (int i = 0; i < c.total_q; ++i)
      m.mask[static_cast<size_t>(i) * c.mask_words] &= ~uint64_t{1};
  return m;
}

}  // namespace treemla::test
