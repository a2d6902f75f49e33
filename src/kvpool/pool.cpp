// treemla: KV page pool -- allocation, release, metrics and the commit of accepted tree rows.
// Every mutating function checks all its arguments first and only then changes state, so an
// error leaves the pool unchanged.
#include <algorithm>

#include "treemla/error.h"
#include "treemla/kvpool.h"

namespace treemla::kvpool {

const char* free_policy_name(FreePolicy p) {
  switch (p) {
    case FreePolicy::kAsFreed:
      return "as-freed";
    case FreePolicy::kSorted:
      return "sorted";
  }
  return "unknown";
}

void validate(const PoolConfig& c) {
  // The geometry only: row counts are int64 and slots int32, so the pool adds no bound of its own.
  treemla::validate(c.layout());
  TREEMLA_CHECK(c.policy == FreePolicy::kAsFreed || c.policy == FreePolicy::kSorted,
                "policy must be kAsFreed (0) or kSorted (1), got " << static_cast<int>(c.policy));
}

int32_t count_runs(std::span<const int32_t> pages) {
  int32_t runs = pages.empty() ? 0 : 1;
  for (size_t k = 1; k < pages.size(); ++k) runs += pages[k] != pages[k - 1] + 1;
  return runs;
}

KvPool::KvPool(const PoolConfig& config) : config_(config) {
  validate(config_);
  for (int32_t p = 0; p < config_.num_pages; ++p) {
    if (config_.policy == FreePolicy::kAsFreed) {
      free_fifo_.push_back(p);
    } else {
      free_sorted_.insert(free_sorted_.end(), p);
    }
  }
}

int64_t KvPool::pages_for(int64_t num_tokens) const {
  TREEMLA_CHECK(num_tokens >= 0, "num_tokens must be >= 0, got " << num_tokens);
  return num_tokens / config_.page_size + (num_tokens % config_.page_size != 0);
}

KvPool::Request& KvPool::find(int64_t request, const char* what) {
  auto it = requests_.find(request);
  TREEMLA_CHECK(it != requests_.end(),
                what << ": unknown request " << request << " (never allocated or already freed)");
  return it->second;
}

const KvPool::Request& KvPool::find(int64_t request, const char* what) const {
  return const_cast<KvPool*>(this)->find(request, what);
}

int32_t KvPool::num_free_pages() const {
  return static_cast<int32_t>(config_.policy == FreePolicy::kAsFreed ? free_fifo_.size()
                                                                     : free_sorted_.size());
}

std::vector<int32_t> KvPool::take_pages(int64_t count) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    if (config_.policy == FreePolicy::kAsFreed) {
      out.push_back(free_fifo_.front());
      free_fifo_.pop_front();
    } else {
      out.push_back(*free_sorted_.begin());
      free_sorted_.erase(free_sorted_.begin());
    }
  }
  return out;
}

void KvPool::release_pages(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    if (config_.policy == FreePolicy::kAsFreed) {
      free_fifo_.push_back(p);
    } else {
      free_sorted_.insert(p);
    }
  }
}

void KvPool::alloc(int64_t request, int64_t num_tokens) {
  TREEMLA_CHECK(!requests_.count(request), "request " << request << " already exists");
  TREEMLA_CHECK(num_tokens >= 0, "num_tokens must be >= 0, got " << num_tokens);
  // Compare in rows first so that a huge num_tokens cannot overflow the page arithmetic.
  const int64_t capacity = int64_t{config_.num_pages} * config_.page_size;
  TREEMLA_CHECK(num_tokens <= capacity,
                "alloc of request " << request << ": num_tokens " << num_tokens
                                    << " exceeds the cache capacity of " << capacity << " rows");
  const int64_t needed = pages_for(num_tokens);
  TREEMLA_CHECK(needed <= num_free_pages(),
                "alloc of request " << request << ": num_tokens " << num_tokens << " needs "
                                    << needed << " pages, only " << num_free_pages() << " free");
  Request r;
  r.num_tokens = num_tokens;
  r.pages = take_pages(pages_for(num_tokens));
  requests_.emplace(request, std::move(r));
}

void KvPool::extend(int64_t request, int64_t num_tokens) {
  Request& r = find(request, "extend");
  TREEMLA_CHECK(num_tokens >= 0, "num_tokens must be >= 0, got " << num_tokens);
  const int64_t capacity = int64_t{config_.num_pages} * config_.page_size;
  TREEMLA_CHECK(num_tokens <= capacity - r.num_tokens,
                "extend of request " << request << " by num_tokens " << num_tokens
                                     << " exceeds the cache capacity of " << capacity << " rows");
  const int64_t extra = pages_for(r.num_tokens + num_tokens) - static_cast<int64_t>(r.pages.size());
  TREEMLA_CHECK(extra <= num_free_pages(), "extend of request " << request << " by num_tokens "
                                                                << num_tokens << " needs " << extra
                                                                << " new pages, only "
                                                                << num_free_pages() << " free");
  std::vector<int32_t> fresh = take_pages(extra);
  r.pages.insert(r.pages.end(), fresh.begin(), fresh.end());
  r.num_tokens += num_tokens;
}

void KvPool::truncate(int64_t request, int64_t num_tokens) {
  Request& r = find(request, "truncate");
  TREEMLA_CHECK(num_tokens >= 0 && num_tokens <= r.num_tokens,
                "truncate of request " << request << ": num_tokens must be in [0, " << r.num_tokens
                                       << "], got " << num_tokens);
  const size_t keep = static_cast<size_t>(pages_for(num_tokens));
  release_pages(std::span<const int32_t>(r.pages).subspan(keep));
  r.pages.resize(keep);
  r.num_tokens = num_tokens;
}

void KvPool::free(int64_t request) {
  Request& r = find(request, "free");
  release_pages(r.pages);
  requests_.erase(request);
}

bool KvPool::contains(int64_t request) const { return requests_.count(request) != 0; }

int64_t KvPool::num_tokens(int64_t request) const { return find(request, "num_tokens").num_tokens; }

const std::vector<int32_t>& KvPool::pages(int64_t request) const {
  return find(request, "pages").pages;
}

std::vector<int64_t> KvPool::request_ids() const {
  std::vector<int64_t> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, r] : requests_) ids.push_back(id);
  return ids;
}

std::vector<int32_t> KvPool::free_list() const {
  if (config_.policy == FreePolicy::kAsFreed) return {free_fifo_.begin(), free_fifo_.end()};
  return {free_sorted_.begin(), free_sorted_.end()};
}

RowSlot KvPool::locate(int64_t request, int64_t row) const {
  const Request& r = find(request, "locate");
  TREEMLA_CHECK(row >= 0 && row < r.num_tokens, "row must be in [0, " << r.num_tokens
                                                                      << ") for request " << request
                                                                      << ", got " << row);
  return {r.pages[static_cast<size_t>(row / config_.page_size)],
          static_cast<int32_t>(row % config_.page_size)};
}

void KvPool::page_table_row(int64_t request, int32_t* row, int64_t stride, int32_t pad) const {
  const Request& r = find(request, "page_table_row");
  TREEMLA_CHECK(row != nullptr, "page_table_row: row is null");
  TREEMLA_CHECK(stride >= static_cast<int64_t>(r.pages.size()),
                "stride must be >= the " << r.pages.size() << " pages of request " << request
                                         << ", got " << stride);
  std::copy(r.pages.begin(), r.pages.end(), row);
  std::fill(row + r.pages.size(), row + stride, pad);
}

std::vector<int32_t> KvPool::page_table_row(int64_t request, int64_t stride, int32_t pad) const {
  check_page_table_stride(stride, "stride");
  std::vector<int32_t> out(static_cast<size_t>(stride));
  page_table_row(request, out.data(), stride, pad);
  return out;
}

std::vector<uint8_t> KvPool::used_map() const {
  std::vector<uint8_t> used(static_cast<size_t>(config_.num_pages), 0);
  for (const auto& [id, r] : requests_) {
    for (int32_t p : r.pages) used[static_cast<size_t>(p)] = 1;
  }
  return used;
}

PoolMetrics KvPool::metrics() const {
  PoolMetrics m;
  m.num_requests = static_cast<int32_t>(requests_.size());
  m.pages_free = num_free_pages();
  m.pages_used = config_.num_pages - m.pages_free;
  int32_t contiguous = 0;
  for (const auto& [id, r] : requests_) {
    const int32_t runs = count_runs(r.pages);
    m.total_runs += runs;
    contiguous += runs <= 1;
  }
  if (m.total_runs > 0) m.mean_run_length = static_cast<double>(m.pages_used) / m.total_runs;
  if (m.num_requests > 0) m.fraction_contiguous = static_cast<double>(contiguous) / m.num_requests;
  const std::vector<uint8_t> used = used_map();
  int32_t run = 0;
  for (uint8_t u : used) {
    run = u ? 0 : run + 1;
    m.largest_free_run = std::max(m.largest_free_run, run);
  }
  return m;
}

CommitPlan KvPool::commit_accepted(int64_t request, int64_t prefix_len,
                                   std::span<const int32_t> accepted) {
  Request& r = find(request, "commit_accepted");
  TREEMLA_CHECK(prefix_len >= 0 && prefix_len < r.num_tokens,
                "prefix_len must be in [0, " << r.num_tokens << ") (the " << r.num_tokens
                                             << " rows of request " << request
                                             << " include the root), got " << prefix_len);
  const int64_t q_len = r.num_tokens - prefix_len;
  const int64_t n = static_cast<int64_t>(accepted.size());
  TREEMLA_CHECK(n >= 1 && n <= q_len,
                "accepted.size() must be in [1, q_len = " << q_len << "], got " << n);
  TREEMLA_CHECK(accepted[0] == 0, "accepted[0] must be 0 (the root), got " << accepted[0]);
  std::vector<int32_t> index_of(static_cast<size_t>(q_len), -1);  // tail node -> k
  for (int64_t k = 0; k < n; ++k) {
    const int32_t a = accepted[static_cast<size_t>(k)];
    TREEMLA_CHECK(a >= k && a < q_len, "accepted[" << k << "] must be in [" << k
                                                   << ", q_len = " << q_len << "), got " << a);
    TREEMLA_CHECK(index_of[static_cast<size_t>(a)] < 0,
                  "accepted[" << k << "] = " << a << " repeats accepted["
                              << index_of[static_cast<size_t>(a)] << "]");
    index_of[static_cast<size_t>(a)] = static_cast<int32_t>(k);
  }

  // Wave of move k: the move that reads row prefix_len + k (the j < k with accepted[j] == k) must
  // run first, so k goes one wave after it. Every other hazard is the same relation seen from
  // the other side, so waves are independent sets.
  std::vector<int32_t> wave(static_cast<size_t>(n), -1);
  int32_t num_waves = 0;
  for (int64_t k = 1; k < n; ++k) {
    if (accepted[static_cast<size_t>(k)] == k) continue;
    const int32_t j = index_of[static_cast<size_t>(k)];  // k < n <= q_len
    wave[static_cast<size_t>(k)] = j >= 0 ? wave[static_cast<size_t>(j)] + 1 : 0;
    num_waves = std::max(num_waves, wave[static_cast<size_t>(k)] + 1);
  }
  CommitPlan plan;
  plan.request = request;
  plan.num_tokens = prefix_len + n;
  plan.wave_offsets.assign(static_cast<size_t>(num_waves) + 1, 0);
  for (int64_t k = 1; k < n; ++k) {
    if (wave[static_cast<size_t>(k)] >= 0) ++plan.wave_offsets[wave[static_cast<size_t>(k)] + 1];
  }
  for (int32_t w = 0; w < num_waves; ++w) plan.wave_offsets[w + 1] += plan.wave_offsets[w];
  plan.moves.resize(static_cast<size_t>(plan.wave_offsets.back()));
  std::vector<int32_t> fill(plan.wave_offsets.begin(), plan.wave_offsets.end() - 1);
  const int32_t ps = config_.page_size;
  auto slot_of = [&](int64_t row) {
    return RowSlot{r.pages[static_cast<size_t>(row / ps)], static_cast<int32_t>(row % ps)};
  };
  // Increasing k within a wave keeps the sequential order correct as well (see the header).
  for (int64_t k = 1; k < n; ++k) {
    const int32_t w = wave[static_cast<size_t>(k)];
    if (w < 0) continue;
    plan.moves[static_cast<size_t>(fill[w]++)] = {
        slot_of(prefix_len + accepted[static_cast<size_t>(k)]), slot_of(prefix_len + k)};
  }

  const size_t keep = static_cast<size_t>(pages_for(plan.num_tokens));
  plan.released_pages.assign(r.pages.begin() + static_cast<std::ptrdiff_t>(keep), r.pages.end());
  release_pages(plan.released_pages);
  r.pages.resize(keep);
  r.num_tokens = plan.num_tokens;
  return plan;
}

void KvPool::check_invariants() const {
  const int32_t np = config_.num_pages;
  // Request ids are arbitrary int64, so ownership is tracked by a flag beside the owner id.
  std::vector<int64_t> owner(static_cast<size_t>(np), 0);
  std::vector<uint8_t> owned(static_cast<size_t>(np), 0);
  std::vector<uint8_t> is_free(static_cast<size_t>(np), 0);
  for (const auto& [id, r] : requests_) {
    TREEMLA_CHECK(static_cast<int64_t>(r.pages.size()) == pages_for(r.num_tokens),
                  "request " << id << " holds " << r.pages.size() << " pages for " << r.num_tokens
                             << " tokens");
    for (int32_t p : r.pages) {
      TREEMLA_CHECK(p >= 0 && p < np,
                    "request " << id << " holds page " << p << " outside [0, " << np << ")");
      TREEMLA_CHECK(!owned[static_cast<size_t>(p)], "page " << p << " is held by request " << id
                                                            << " and by request "
                                                            << owner[static_cast<size_t>(p)]);
      owned[static_cast<size_t>(p)] = 1;
      owner[static_cast<size_t>(p)] = id;
    }
  }
  for (int32_t p : free_list()) {
    TREEMLA_CHECK(p >= 0 && p < np, "free page " << p << " outside [0, " << np << ")");
    TREEMLA_CHECK(!is_free[static_cast<size_t>(p)], "page " << p << " is free twice");
    TREEMLA_CHECK(!owned[static_cast<size_t>(p)],
                  "page " << p << " is free and held by request " << owner[static_cast<size_t>(p)]);
    is_free[static_cast<size_t>(p)] = 1;
  }
  for (int32_t p = 0; p < np; ++p) {
    TREEMLA_CHECK(is_free[static_cast<size_t>(p)] || owned[static_cast<size_t>(p)],
                  "page " << p << " is neither free nor held (lost)");
  }
}

}  // namespace treemla::kvpool
