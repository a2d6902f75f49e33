// treemla: KV page pool -- applying plans to a host buffer, the reference for the device path.
#include <cstring>

#include "treemla/error.h"
#include "treemla/kvpool.h"

namespace treemla::kvpool {

void apply_page_moves(const PoolConfig& config, std::span<const PageMove> moves, void* cache) {
  validate(config);
  TREEMLA_CHECK(cache != nullptr || moves.empty(), "cache is null");
  const int32_t np = config.num_pages;
  for (size_t i = 0; i < moves.size(); ++i) {
    TREEMLA_CHECK(moves[i].src >= 0 && moves[i].src < np,
                  "moves[" << i << "].src must be in [0, " << np << "), got " << moves[i].src);
    TREEMLA_CHECK(moves[i].dst >= 0 && moves[i].dst < np,
                  "moves[" << i << "].dst must be in [0, " << np << "), got " << moves[i].dst);
  }
  const int64_t page_bytes = config.page_bytes();
  auto* base = static_cast<unsigned char*>(cache);
  for (const PageMove& m : moves) {
    if (m.src == m.dst) continue;  // distinct pages never overlap, so memcpy is enough
    std::memcpy(base + m.dst * page_bytes, base + m.src * page_bytes,
                static_cast<size_t>(page_bytes));
  }
}

void apply_row_moves(const PoolConfig& config, std::span<const RowMove> moves, void* cache) {
  validate(config);
  TREEMLA_CHECK(cache != nullptr || moves.empty(), "cache is null");
  const int32_t np = config.num_pages;
  const int32_t ps = config.page_size;
  auto check = [&](const RowSlot& r, size_t i, const char* which) {
    TREEMLA_CHECK(r.page >= 0 && r.page < np, "moves[" << i << "]." << which
                                                       << ".page must be in [0, " << np << "), got "
                                                       << r.page);
    TREEMLA_CHECK(r.slot >= 0 && r.slot < ps, "moves[" << i << "]." << which
                                                       << ".slot must be in [0, " << ps << "), got "
                                                       << r.slot);
  };
  for (size_t i = 0; i < moves.size(); ++i) {
    check(moves[i].src, i, "src");
    check(moves[i].dst, i, "dst");
  }
  const int64_t row_bytes = config.row_bytes();
  auto* base = static_cast<unsigned char*>(cache);
  auto offset = [&](const RowSlot& r) { return (int64_t{r.page} * ps + r.slot) * row_bytes; };
  for (const RowMove& m : moves) {
    const int64_t src = offset(m.src), dst = offset(m.dst);
    if (src != dst) std::memcpy(base + dst, base + src, static_cast<size_t>(row_bytes));
  }
}

}  // namespace treemla::kvpool
