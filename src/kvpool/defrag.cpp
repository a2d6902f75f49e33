// treemla: KV page pool -- defrag planning.
//
// A plan is built in two steps: choose a destination page for every live page (a packing of the
// requests into disjoint ascending ranges), then order the relocations so that sequential
// execution never overwrites a page before it is read (order_moves). The relocation map is a
// partial permutation: every chain ends at a page that is free now and is executed from that end;
// what remains are cycles, broken through one page that is free once the chains are done.
#include <algorithm>
#include <iterator>
#include <numeric>
#include <unordered_map>

#include "treemla/error.h"
#include "treemla/kvpool.h"

namespace treemla::kvpool {
namespace {

struct Ordered {
  std::vector<PageMove> moves;
  std::vector<int32_t> wave_offsets{0};
  bool feasible = true;  // false: a cycle needs a scratch page and none is free
};

// relocations: (src, dst) pairs, src != dst, sources distinct, destinations distinct; every
// destination is either free now (used[dst] == 0) or the source of another relocation.
Ordered order_moves(int32_t num_pages, const std::vector<uint8_t>& used,
                    const std::vector<PageMove>& relocations) {
  const size_t np = static_cast<size_t>(num_pages);
  std::vector<int32_t> next(np, -1), prev(np, -1);
  for (const PageMove& m : relocations) {
    next[static_cast<size_t>(m.src)] = m.dst;
    prev[static_cast<size_t>(m.dst)] = m.src;
  }
  Ordered out;
  // Chains. Walking back from the free end, the i-th move of a walk belongs to wave i: its
  // destination was vacated by the move one wave earlier, and chains share no page.
  std::vector<std::vector<PageMove>> waves;
  std::vector<uint8_t> done(np, 0);
  for (const PageMove& m : relocations) {
    if (next[static_cast<size_t>(m.dst)] >= 0) continue;  // not a chain end
    TREEMLA_CHECK(!used[static_cast<size_t>(m.dst)],
                  "internal: move destination " << m.dst << " holds data that does not move");
    size_t w = 0;
    for (int32_t cur = m.src; cur >= 0; cur = prev[static_cast<size_t>(cur)], ++w) {
      if (waves.size() <= w) waves.emplace_back();
      waves[w].push_back({cur, next[static_cast<size_t>(cur)]});
      done[static_cast<size_t>(cur)] = 1;
    }
  }
  for (auto& wave : waves) {
    out.moves.insert(out.moves.end(), wave.begin(), wave.end());
    out.wave_offsets.push_back(static_cast<int32_t>(out.moves.size()));
  }
  // After the chains the used pages are exactly those of the final layout, so any page free in
  // the final layout serves as scratch; cycles use it one after the other.
  int32_t scratch = -1;
  for (int32_t p = 0; p < num_pages && scratch < 0; ++p) {
    const bool used_after = (used[static_cast<size_t>(p)] && next[static_cast<size_t>(p)] < 0) ||
                            prev[static_cast<size_t>(p)] >= 0;
    if (!used_after) scratch = p;
  }
  auto push = [&out](int32_t src, int32_t dst) {
    out.moves.push_back({src, dst});
    out.wave_offsets.push_back(static_cast<int32_t>(out.moves.size()));
  };
  for (const PageMove& m : relocations) {
    if (done[static_cast<size_t>(m.src)]) continue;
    if (scratch < 0) {
      out.feasible = false;
      return out;
    }
    // Cycle c0 -> c1 -> ... -> c_{m-1} -> c0: park c_{m-1} (bound for c0), shift the rest
    // backwards into the slot just vacated, then bring the parked page home.
    std::vector<int32_t> cycle{m.src};
    for (int32_t p = m.dst; p != m.src; p = next[static_cast<size_t>(p)]) cycle.push_back(p);
    for (int32_t p : cycle) done[static_cast<size_t>(p)] = 1;
    push(cycle.back(), scratch);
    for (size_t i = cycle.size() - 1; i-- > 0;) push(cycle[i], cycle[i + 1]);
    push(scratch, cycle.front());
  }
  return out;
}

struct Live {
  int64_t id;
  const std::vector<int32_t>* pages;
  int32_t size() const { return static_cast<int32_t>(pages->size()); }
};

// Relocations for a packing where request i starts at base[i].
std::vector<PageMove> relocations_for(const std::vector<Live>& live,
                                      const std::vector<int32_t>& base) {
  std::vector<PageMove> out;
  for (size_t i = 0; i < live.size(); ++i) {
    for (int32_t k = 0; k < live[i].size(); ++k) {
      const int32_t src = (*live[i].pages)[static_cast<size_t>(k)];
      if (src != base[i] + k) out.push_back({src, base[i] + k});
    }
  }
  std::sort(out.begin(), out.end(), [](PageMove a, PageMove b) { return a.src < b.src; });
  return out;
}

// Requests in order of their current first page, packed from page 0.
std::vector<int32_t> naive_packing(const std::vector<Live>& live) {
  std::vector<size_t> order(live.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return live[a].pages->front() < live[b].pages->front(); });
  std::vector<int32_t> base(live.size());
  int32_t next = 0;
  for (size_t i : order) {
    base[i] = next;
    next += live[i].size();
  }
  return base;
}

struct Candidate {
  int32_t overlap;  // pages of the request already at base + k
  int32_t req;
  int32_t base;
};

// Places the requests not in `kept` best-fit, largest first, into the gaps between the kept
// ranges. Returns false if one does not fit.
bool fill_gaps(int32_t num_pages, const std::vector<Live>& live, const std::vector<Candidate>& kept,
               std::vector<int32_t>* base) {
  std::vector<uint8_t> placed(live.size(), 0);
  std::vector<std::pair<int32_t, int32_t>> ranges;  // [start, end)
  for (const Candidate& c : kept) {
    placed[static_cast<size_t>(c.req)] = 1;
    (*base)[static_cast<size_t>(c.req)] = c.base;
    ranges.push_back({c.base, c.base + live[static_cast<size_t>(c.req)].size()});
  }
  std::sort(ranges.begin(), ranges.end());
  std::multimap<int32_t, int32_t> gaps;  // length -> start
  int32_t cursor = 0;
  for (auto [s, e] : ranges) {
    if (s > cursor) gaps.emplace(s - cursor, cursor);
    cursor = e;
  }
  if (num_pages > cursor) gaps.emplace(num_pages - cursor, cursor);
  std::vector<size_t> rest;
  for (size_t i = 0; i < live.size(); ++i) {
    if (!placed[i]) rest.push_back(i);
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [&](size_t a, size_t b) { return live[a].size() > live[b].size(); });
  for (size_t i : rest) {
    auto g = gaps.lower_bound(live[i].size());
    if (g == gaps.end()) return false;
    const auto [len, start] = *g;
    gaps.erase(g);
    (*base)[i] = start;
    if (len > live[i].size()) gaps.emplace(len - live[i].size(), start + live[i].size());
  }
  return true;
}

// Each request prefers the base keeping most of its pages in place; candidates are taken by
// decreasing overlap when they collide with nothing taken so far. If the others then do not fit
// in the gaps, the weakest kept placement is given up and the gaps refilled (with nothing kept,
// everything fits: the total size is at most num_pages).
std::vector<int32_t> overlap_packing(int32_t num_pages, const std::vector<Live>& live) {
  std::vector<Candidate> cands;
  for (size_t i = 0; i < live.size(); ++i) {
    std::unordered_map<int32_t, int32_t> count;
    const int32_t n = live[i].size();
    for (int32_t k = 0; k < n; ++k) {
      const int32_t b = (*live[i].pages)[static_cast<size_t>(k)] - k;
      if (b >= 0 && b <= num_pages - n) ++count[b];
    }
    for (auto [b, c] : count) cands.push_back({c, static_cast<int32_t>(i), b});
  }
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.overlap != b.overlap) return a.overlap > b.overlap;
    if (a.base != b.base) return a.base < b.base;
    return a.req < b.req;
  });
  std::vector<Candidate> kept;  // in decreasing overlap
  std::vector<uint8_t> placed(live.size(), 0);
  std::map<int32_t, int32_t> taken;  // start -> end
  for (const Candidate& c : cands) {
    if (placed[static_cast<size_t>(c.req)]) continue;
    const int32_t end = c.base + live[static_cast<size_t>(c.req)].size();
    auto after = taken.lower_bound(c.base);
    if (after != taken.end() && after->first < end) continue;
    if (after != taken.begin() && std::prev(after)->second > c.base) continue;
    taken.emplace(c.base, end);
    placed[static_cast<size_t>(c.req)] = 1;
    kept.push_back(c);
  }
  std::vector<int32_t> base(live.size(), 0);
  while (!fill_gaps(num_pages, live, kept, &base)) {
    TREEMLA_CHECK(!kept.empty(), "internal: requests do not fit in " << num_pages << " pages");
    kept.pop_back();
  }
  return base;
}

std::vector<Live> live_requests(const std::map<int64_t, std::vector<int32_t>>& pages) {
  std::vector<Live> live;
  for (const auto& [id, p] : pages) {
    if (!p.empty()) live.push_back({id, &p});
  }
  return live;
}

}  // namespace

DefragPlan KvPool::plan_defrag() const {
  std::map<int64_t, std::vector<int32_t>> pages;
  for (const auto& [id, r] : requests_) pages.emplace(id, r.pages);
  const std::vector<Live> live = live_requests(pages);
  const std::vector<uint8_t> used = used_map();
  const int32_t np = config_.num_pages;

  Ordered best;
  std::vector<int32_t> best_base;
  bool have = false;
  for (const std::vector<int32_t>& base : {overlap_packing(np, live), naive_packing(live)}) {
    Ordered o = order_moves(np, used, relocations_for(live, base));
    // Strictly fewer: on a tie the overlap packing (planned first) stays.
    if (o.feasible && (!have || o.moves.size() < best.moves.size())) {
      best = std::move(o);
      best_base = base;
      have = true;
    }
  }
  TREEMLA_CHECK(have, "defrag needs a free page as scratch to break a cycle of page moves, but all "
                          << np << " pages are in use");
  DefragPlan plan;
  plan.moves = std::move(best.moves);
  plan.wave_offsets = std::move(best.wave_offsets);
  for (size_t i = 0; i < live.size(); ++i) {
    std::vector<int32_t> fresh(live[i].pages->size());
    std::iota(fresh.begin(), fresh.end(), best_base[i]);
    if (fresh == *live[i].pages) continue;
    for (int32_t k = 0; k < live[i].size(); ++k) {
      plan.pages_relocated +=
          fresh[static_cast<size_t>(k)] != (*live[i].pages)[static_cast<size_t>(k)];
    }
    plan.tables.push_back({live[i].id, std::move(fresh)});
  }
  return plan;
}

DefragPlan KvPool::plan_partial_defrag(int64_t max_moves) const {
  TREEMLA_CHECK(max_moves >= 0, "max_moves must be >= 0, got " << max_moves);
  const int32_t np = config_.num_pages;
  std::map<int64_t, std::vector<int32_t>> pages;  // working copy, updated as requests move
  for (const auto& [id, r] : requests_) pages.emplace(id, r.pages);
  const std::vector<Live> live = live_requests(pages);
  std::vector<int32_t> owner(static_cast<size_t>(np), -1);  // index into live
  for (size_t i = 0; i < live.size(); ++i) {
    for (int32_t p : *live[i].pages) owner[static_cast<size_t>(p)] = static_cast<int32_t>(i);
  }

  // Best base for request i: a range of pages that are free or its own, keeping most pages in
  // place (then the lowest). Returns -1 if no such range exists.
  auto best_base = [&](size_t i, int32_t* overlap) {
    const std::vector<int32_t>& pg = *live[i].pages;
    const int32_t n = live[i].size();
    std::vector<int32_t> ok_prefix(static_cast<size_t>(np) + 1, 0);
    for (int32_t p = 0; p < np; ++p) {
      const int32_t o = owner[static_cast<size_t>(p)];
      ok_prefix[static_cast<size_t>(p) + 1] =
          ok_prefix[static_cast<size_t>(p)] + (o < 0 || o == static_cast<int32_t>(i));
    }
    auto fits = [&](int32_t b) {
      return b >= 0 && b <= np - n &&
             ok_prefix[static_cast<size_t>(b + n)] - ok_prefix[static_cast<size_t>(b)] == n;
    };
    std::map<int32_t, int32_t> count;
    for (int32_t k = 0; k < n; ++k) ++count[pg[static_cast<size_t>(k)] - k];
    int32_t best = -1;
    *overlap = -1;
    for (auto [b, c] : count) {
      if (c > *overlap && fits(b)) {
        best = b;
        *overlap = c;
      }
    }
    if (best < 0) {
      for (int32_t b = 0; b <= np - n; ++b) {
        if (fits(b)) {
          best = b;
          *overlap = 0;
          break;
        }
      }
    }
    return best;
  };

  // Relocations of request i into base b, and their ordered moves given the used pages (the
  // moves include a scratch hop per cycle).
  auto moves_into = [&](size_t i, int32_t b, const std::vector<uint8_t>& used_now,
                        std::vector<PageMove>* reloc) {
    reloc->clear();
    for (int32_t k = 0; k < live[i].size(); ++k) {
      const int32_t src = (*live[i].pages)[static_cast<size_t>(k)];
      if (src != b + k) reloc->push_back({src, b + k});
    }
    std::sort(reloc->begin(), reloc->end(), [](PageMove x, PageMove y) { return x.src < y.src; });
    return order_moves(np, used_now, *reloc);
  };

  // Cost = the moves the request takes in the current layout, scratch hops included.
  std::vector<uint8_t> used = used_map();
  std::vector<PageMove> reloc;
  std::vector<std::pair<size_t, size_t>> order;  // (moves, request)
  for (size_t i = 0; i < live.size(); ++i) {
    if (count_runs(*live[i].pages) <= 1) continue;
    int32_t overlap = 0;
    const int32_t b = best_base(i, &overlap);
    if (b < 0) continue;
    const Ordered o = moves_into(i, b, used, &reloc);
    if (o.feasible) order.push_back({o.moves.size(), i});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  DefragPlan plan;
  plan.wave_offsets.push_back(0);
  std::vector<uint8_t> moved(live.size(), 0);
  for (const auto& [estimate, i] : order) {
    int32_t overlap = 0;
    const int32_t b = best_base(i, &overlap);  // the layout changed since the estimate
    if (b < 0) continue;
    Ordered o = moves_into(i, b, used, &reloc);
    if (!o.feasible || static_cast<int64_t>(plan.moves.size() + o.moves.size()) > max_moves) {
      continue;
    }
    const int32_t offset = static_cast<int32_t>(plan.moves.size());
    plan.moves.insert(plan.moves.end(), o.moves.begin(), o.moves.end());
    for (size_t w = 1; w < o.wave_offsets.size(); ++w) {
      plan.wave_offsets.push_back(offset + o.wave_offsets[w]);
    }
    plan.pages_relocated += static_cast<int64_t>(reloc.size());
    std::vector<int32_t>& pg = pages[live[i].id];
    for (int32_t p : pg) {
      owner[static_cast<size_t>(p)] = -1;
      used[static_cast<size_t>(p)] = 0;
    }
    std::iota(pg.begin(), pg.end(), b);  // pg is what live[i].pages points to
    for (int32_t p : pg) {
      owner[static_cast<size_t>(p)] = static_cast<int32_t>(i);
      used[static_cast<size_t>(p)] = 1;
    }
    moved[i] = 1;
  }
  for (size_t i = 0; i < live.size(); ++i) {
    if (moved[i]) plan.tables.push_back({live[i].id, *live[i].pages});
  }
  return plan;
}

void KvPool::install(const DefragPlan& plan) {
  for (const PageTableUpdate& u : plan.tables) requests_.at(u.request).pages = u.pages;
  // A defrag rebuilds the free list in ascending page order under both policies.
  const std::vector<uint8_t> used = used_map();
  free_fifo_.clear();
  free_sorted_.clear();
  for (int32_t p = 0; p < config_.num_pages; ++p) {
    if (used[static_cast<size_t>(p)]) continue;
    if (config_.policy == FreePolicy::kAsFreed) {
      free_fifo_.push_back(p);
    } else {
      free_sorted_.insert(free_sorted_.end(), p);
    }
  }
}

DefragPlan KvPool::defrag() {
  DefragPlan plan = plan_defrag();
  install(plan);
  return plan;
}

DefragPlan KvPool::partial_defrag(int64_t max_moves) {
  DefragPlan plan = plan_partial_defrag(max_moves);
  install(plan);
  return plan;
}

}  // namespace treemla::kvpool
