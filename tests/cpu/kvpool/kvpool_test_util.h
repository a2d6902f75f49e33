// treemla tests: helpers shared by the KV pool tests -- hand-made layouts, an ownership check that
// is independent of the pool's own, a tagged host cache, and plan structure checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "treemla/error.h"
#include "treemla/kvpool.h"

namespace treemla::kvpool::test {

inline PoolConfig make_config(int32_t num_pages, int32_t page_size,
                              FreePolicy policy = FreePolicy::kAsFreed, int32_t row_width = 4,
                              int32_t elem_size = 2) {
  PoolConfig c;
  c.num_pages = num_pages;
  c.page_size = page_size;
  c.row_width = row_width;
  c.elem_size = elem_size;
  c.policy = policy;
  return c;
}

// Builds an as-freed pool where request id holds exactly the given pages (each full), by first
// arranging the free list: one single-page request per page, freed in the wanted order.
inline KvPool make_layout(int32_t num_pages, int32_t page_size,
                          const std::vector<std::pair<int64_t, std::vector<int32_t>>>& layout) {
  KvPool pool(make_config(num_pages, page_size, FreePolicy::kAsFreed));
  constexpr int64_t kTemp = int64_t{1} << 40;  // ids no test layout uses
  for (int32_t p = 0; p < num_pages; ++p) pool.alloc(kTemp + p, page_size);
  std::vector<uint8_t> listed(static_cast<size_t>(num_pages), 0);
  for (const auto& [id, pages] : layout) {
    for (int32_t p : pages) {
      pool.free(kTemp + p);
      listed[static_cast<size_t>(p)] = 1;
    }
  }
  for (int32_t p = 0; p < num_pages; ++p) {
    if (!listed[static_cast<size_t>(p)]) pool.free(kTemp + p);
  }
  for (const auto& [id, pages] : layout) {
    pool.alloc(id, static_cast<int64_t>(pages.size()) * page_size);
    EXPECT_EQ(pool.pages(id), pages) << "layout helper for request " << id;
  }
  return pool;
}

// Every page is in exactly one place: one request's page list or the free list.
inline ::testing::AssertionResult ownership_ok(const KvPool& pool) {
  const int32_t np = pool.config().num_pages;
  std::vector<int> seen(static_cast<size_t>(np), 0);
  int64_t held = 0;
  for (int64_t id : pool.request_ids()) {
    const auto& pages = pool.pages(id);
    if (static_cast<int64_t>(pages.size()) != pool.pages_for(pool.num_tokens(id))) {
      return ::testing::AssertionFailure() << "request " << id << " holds " << pages.size()
                                           << " pages for " << pool.num_tokens(id) << " tokens";
    }
    for (int32_t p : pages) {
      if (p < 0 || p >= np) return ::testing::AssertionFailure() << "page " << p << " out of range";
      ++seen[static_cast<size_t>(p)];
    }
    held += static_cast<int64_t>(pages.size());
  }
  const std::vector<int32_t> free_pages = pool.free_list();
  for (int32_t p : free_pages) {
    if (p < 0 || p >= np) {
      return ::testing::AssertionFailure() << "free page " << p << " out of range";
    }
    ++seen[static_cast<size_t>(p)];
  }
  for (int32_t p = 0; p < np; ++p) {
    if (seen[static_cast<size_t>(p)] != 1) {
      return ::testing::AssertionFailure()
             << "page " << p << " appears " << seen[static_cast<size_t>(p)]
             << " times among requests and free list";
    }
  }
  if (held + static_cast<int64_t>(free_pages.size()) != np ||
      pool.num_free_pages() != static_cast<int32_t>(free_pages.size()) ||
      pool.num_used_pages() != held) {
    return ::testing::AssertionFailure()
           << "conservation: held " << held << " + free " << free_pages.size() << " != " << np;
  }
  return ::testing::AssertionSuccess();
}

// Runs f, expects a treemla::Error whose message contains `needle`, and the pool unchanged.
template <class F>
void expect_error_unchanged(KvPool& pool, F&& f, const std::string& needle) {
  const KvPool before = pool;
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << "message: " << e.message();
  }
  EXPECT_TRUE(pool == before) << "the pool changed although the operation failed";
}

// A host cache whose rows hold 64-bit tags (row_bytes must be 8).
struct TaggedCache {
  PoolConfig config;
  std::vector<unsigned char> bytes;
  explicit TaggedCache(const PoolConfig& c)
      : config(c), bytes(static_cast<size_t>(c.page_bytes() * c.num_pages), 0xAB) {}
  unsigned char* at(RowSlot r) {
    return bytes.data() + (int64_t{r.page} * config.page_size + r.slot) * config.row_bytes();
  }
  void write(RowSlot r, uint64_t tag) { std::memcpy(at(r), &tag, sizeof tag); }
  uint64_t read(RowSlot r) {
    uint64_t t;
    std::memcpy(&t, at(r), sizeof t);
    return t;
  }
  // Fills every row of the request with fresh tags, recorded in rows.
  void fill(const KvPool& pool, int64_t id, uint64_t* next_tag, std::vector<uint64_t>* rows) {
    rows->clear();
    for (int64_t t = 0; t < pool.num_tokens(id); ++t) {
      rows->push_back((*next_tag)++);
      write(pool.locate(id, t), rows->back());
    }
  }
  ::testing::AssertionResult matches(const KvPool& pool,
                                     const std::map<int64_t, std::vector<uint64_t>>& model) {
    if (pool.request_ids().size() != model.size()) {
      return ::testing::AssertionFailure()
             << "pool has " << pool.request_ids().size() << " requests, model " << model.size();
    }
    for (const auto& [id, rows] : model) {
      if (!pool.contains(id) || pool.num_tokens(id) != static_cast<int64_t>(rows.size())) {
        return ::testing::AssertionFailure() << "request " << id << " missing or wrong length";
      }
      for (size_t t = 0; t < rows.size(); ++t) {
        const uint64_t got = read(pool.locate(id, static_cast<int64_t>(t)));
        if (got != rows[t]) {
          return ::testing::AssertionFailure() << "request " << id << " row " << t << ": read "
                                               << got << ", expected " << rows[t];
        }
      }
    }
    return ::testing::AssertionSuccess();
  }
};

// Within each wave: destinations distinct and none is a source of the same wave.
template <class Move, class Key>
::testing::AssertionResult waves_independent(const std::vector<Move>& moves,
                                             const std::vector<int32_t>& offsets, Key key) {
  if (offsets.empty() || offsets.front() != 0 ||
      offsets.back() != static_cast<int32_t>(moves.size())) {
    return ::testing::AssertionFailure() << "wave_offsets do not cover the moves";
  }
  for (size_t w = 0; w + 1 < offsets.size(); ++w) {
    if (offsets[w + 1] <= offsets[w]) return ::testing::AssertionFailure() << "empty wave " << w;
    std::set<int64_t> src, dst;
    for (int32_t i = offsets[w]; i < offsets[w + 1]; ++i) {
      src.insert(key(moves[static_cast<size_t>(i)].src));
      if (!dst.insert(key(moves[static_cast<size_t>(i)].dst)).second) {
        return ::testing::AssertionFailure() << "wave " << w << " writes one place twice";
      }
    }
    for (int64_t d : dst) {
      if (src.count(d)) {
        return ::testing::AssertionFailure() << "wave " << w << " reads what it writes";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult waves_independent(const DefragPlan& p) {
  return waves_independent(p.moves, p.wave_offsets, [](int32_t page) { return int64_t{page}; });
}
inline ::testing::AssertionResult waves_independent(const CommitPlan& p) {
  return waves_independent(p.moves, p.wave_offsets,
                           [](RowSlot r) { return (int64_t{r.page} << 32) | r.slot; });
}

// Applies the plan wave by wave, each wave in reverse order: the same result as the sequential
// order exactly when the waves are independent.
template <class Plan>
std::vector<typename decltype(Plan::moves)::value_type> reversed_within_waves(const Plan& p) {
  auto moves = p.moves;
  for (size_t w = 0; w + 1 < p.wave_offsets.size(); ++w) {
    std::reverse(moves.begin() + p.wave_offsets[w], moves.begin() + p.wave_offsets[w + 1]);
  }
  return moves;
}

// Naive packing (requests by first page, packed from 0) and its move count: every page off its
// destination moves once, plus one scratch hop per cycle. Returns -1 when the naive packing
// has a cycle and no page is free.
inline int64_t naive_moves(const KvPool& pool) {
  std::vector<std::vector<int32_t>> reqs;
  for (int64_t id : pool.request_ids()) {
    if (!pool.pages(id).empty()) reqs.push_back(pool.pages(id));
  }
  std::sort(reqs.begin(), reqs.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
  std::map<int32_t, int32_t> dest;  // moved pages only
  int32_t next = 0;
  for (const auto& r : reqs) {
    for (int32_t p : r) {
      if (p != next) dest[p] = next;
      ++next;
    }
  }
  int64_t cycles = 0;
  std::set<int32_t> visited;
  for (const auto& [start, d] : dest) {
    if (visited.count(start)) continue;
    int32_t p = start;
    while (dest.count(p) && !visited.count(p)) {
      visited.insert(p);
      p = dest[p];
    }
    cycles += p == start;
  }
  if (cycles > 0 && pool.num_free_pages() == 0) return -1;
  return static_cast<int64_t>(dest.size()) + cycles;
}

}  // namespace treemla::kvpool::test
