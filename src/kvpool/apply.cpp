// treemla: KV page pool -- applying plans to a host buffer, the reference for the device path.
#include <cstring>
#include <string>
#include <unordered_map>

#include "treemla/error.h"
#include "treemla/kvpool.h"

namespace treemla::kvpool {

namespace {

// What a move reads and writes, as one comparable key, and how messages name it.
int64_t key_of(int32_t page) { return page; }
int64_t key_of(const RowSlot& r) { return (int64_t{r.page} << 32) | static_cast<uint32_t>(r.slot); }
std::string describe(int32_t page) { return "page " + std::to_string(page); }
std::string describe(const RowSlot& r) {
  return "row (page " + std::to_string(r.page) + ", slot " + std::to_string(r.slot) + ")";
}

template <class Move>
void check_waves(std::span<const Move> moves, std::span<const int32_t> offsets) {
  const int64_t m = static_cast<int64_t>(moves.size());
  TREEMLA_CHECK(!offsets.empty(), "wave_offsets must have num_waves + 1 >= 1 entries, got none");
  TREEMLA_CHECK(offsets[0] == 0, "wave_offsets[0] must be 0, got " << offsets[0]);
  for (size_t w = 1; w < offsets.size(); ++w) {
    TREEMLA_CHECK(offsets[w] >= offsets[w - 1],
                  "wave_offsets must be non-decreasing, got wave_offsets["
                      << w << "] = " << offsets[w] << " after " << offsets[w - 1]);
  }
  TREEMLA_CHECK(offsets.back() == m, "wave_offsets[" << offsets.size() - 1
                                                     << "] = " << offsets.back()
                                                     << " must equal the number of moves, " << m);
  std::unordered_map<int64_t, int64_t> writer;  // destination -> move, within one wave
  for (size_t w = 0; w + 1 < offsets.size(); ++w) {
    writer.clear();
    for (int64_t i = offsets[w]; i < offsets[w + 1]; ++i) {
      const Move& mv = moves[static_cast<size_t>(i)];
      const auto [it, fresh] = writer.emplace(key_of(mv.dst), i);
      TREEMLA_CHECK(fresh, "moves[" << i << "] and moves[" << it->second << "] of wave " << w
                                    << " both write " << describe(mv.dst)
                                    << " (a wave's moves run concurrently on the GPU)");
    }
    for (int64_t i = offsets[w]; i < offsets[w + 1]; ++i) {
      const Move& mv = moves[static_cast<size_t>(i)];
      const auto it = writer.find(key_of(mv.src));
      TREEMLA_CHECK(it == writer.end() || it->second == i,
                    "moves[" << i << "] reads " << describe(mv.src) << ", which moves["
                             << it->second << "] of the same wave " << w
                             << " writes (a wave's moves run concurrently on the GPU: put the "
                                "reader in an earlier wave)");
    }
  }
}

}  // namespace

void validate_waves(std::span<const PageMove> moves, std::span<const int32_t> wave_offsets) {
  check_waves(moves, wave_offsets);
}

void validate_waves(std::span<const RowMove> moves, std::span<const int32_t> wave_offsets) {
  check_waves(moves, wave_offsets);
}

void apply_page_moves(const PoolConfig& config, std::span<const PageMove> moves,
                      std::span<const int32_t> wave_offsets, void* cache) {
  validate_waves(moves, wave_offsets);
  apply_page_moves(config, moves, cache);
}

void apply_row_moves(const PoolConfig& config, std::span<const RowMove> moves,
                     std::span<const int32_t> wave_offsets, void* cache) {
  validate_waves(moves, wave_offsets);
  apply_row_moves(config, moves, cache);
}

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
