// treemla: KV page pool -- host bookkeeping for a paged latent cache.
//
// The cache is [num_pages, page_size, row_width] elements of elem_size bytes (row_width 576 for
// MLA). A KvPool is the bookkeeping only: it owns the free list and, per request, the page list
// (the request's page table row) and its token count. The data lives elsewhere: a host buffer
// (apply_* below) or device memory (the CUDA module applies the same plans). Logical row t of a
// request lives at (pages[t / page_size], t % page_size), as in attention.h.
//
// Request ids are chosen by the caller (any int64, e.g. the engine's own id). They are unique
// among live requests; an id may be used again once its request is freed.
//
// Operations that move data (defrag, commit of accepted tree rows) update the bookkeeping at once
// and return a plan: plain data (vectors of PODs) to apply to the data buffer. A plan must reach
// the data before anything is written into pages the pool hands out afterwards (on a GPU it is
// enough to enqueue it on the stream before later writes): pages a commit releases may still be
// sources of that commit's row moves, and pages a defrag vacates are free at once.
//
// Errors: every operation checks all its arguments before it changes anything, so when it throws
// treemla::Error the pool is exactly as it was.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <span>
#include <type_traits>
#include <vector>

#include "treemla/paged_cache.h"

namespace treemla::kvpool {

// Which free pages an allocation takes. Initially every page is free, in ascending order.
//   kAsFreed: a FIFO, as today's servers keep it: allocation pops pages from the head, released
//             pages are appended at the tail in the order they are released (a request's pages in
//             page-table order).
//   kSorted:  allocation always takes the lowest-index free pages (the free set is kept ordered).
// Under both policies a request's new pages are appended to its page list in the order taken.
enum class FreePolicy : int { kAsFreed = 0, kSorted = 1 };
const char* free_policy_name(FreePolicy p);

// The cache's geometry (bounds in paged_cache.h) and the free-list policy.
struct PoolConfig {
  int32_t num_pages = 0;  // pages in the cache, >= 1
  int32_t page_size = 0;  // rows per page, a power of two in [1, 65536]
  int32_t row_width = 0;  // elements per row (576 for MLA), >= 1
  int32_t elem_size = 0;  // bytes per element (2 for bf16), >= 1
  FreePolicy policy = FreePolicy::kAsFreed;

  // The pool has no page table of its own (page_table_row takes the caller's stride).
  PagedCacheLayout layout() const { return {num_pages, page_size, row_width, elem_size, 0}; }
  int64_t row_bytes() const { return layout().row_bytes(); }
  int64_t page_bytes() const { return layout().page_bytes(); }
  bool operator==(const PoolConfig&) const = default;
};

// Throws treemla::Error naming the first field out of range: the geometry through
// treemla::validate(layout()), then the policy.
void validate(const PoolConfig& config);

// ---- plans (plain data, the same for host and device) ----------------------------------------

// Copy the whole page src to page dst.
struct PageMove {
  int32_t src;
  int32_t dst;
};
// One row of the cache: cache[page, slot, :].
struct RowSlot {
  int32_t page;
  int32_t slot;
};
// Copy one row.
struct RowMove {
  RowSlot src;
  RowSlot dst;
};

// Plans are copied to a device as raw arrays.
static_assert(sizeof(PageMove) == 8 && std::is_trivially_copyable_v<PageMove>);
static_assert(sizeof(RowMove) == 16 && std::is_trivially_copyable_v<RowMove>);

struct PageTableUpdate {
  int64_t request;
  std::vector<int32_t> pages;  // the request's new page list
};

// Moves of a defrag. Executing `moves` one after the other, in order, is always correct: a move's
// destination holds no live data when it runs and no page is written before it has been read.
// Moves are also grouped in waves, moves[wave_offsets[w], wave_offsets[w + 1]): within a wave no
// destination is the source of another move of that wave and destinations are distinct, so the
// moves of one wave may run concurrently (one launch per wave), waves in order. A chain of pages
// each moving into the one vacated before it takes one wave per page.
// Cycles are broken through one page that is free at that point (scratch): moving a cycle of m
// pages costs m + 1 moves, in m + 1 waves of one move. No memory outside the pool is used.
struct DefragPlan {
  std::vector<PageMove> moves;
  std::vector<int32_t> wave_offsets;    // [num_waves + 1], wave_offsets[0] = 0
  std::vector<PageTableUpdate> tables;  // every request whose page list changed, by id
  int64_t pages_relocated = 0;  // live pages whose location changed (moves minus scratch hops)
};

// Row copies of a commit of accepted tree nodes, in physical (page, slot) form. The same rules as
// DefragPlan: sequential execution in order is correct; moves within one wave are independent.
// A third correct way: gather all sources into a staging buffer, then scatter to the destinations.
struct CommitPlan {
  int64_t request = 0;
  int64_t num_tokens = 0;  // the request's token count after the commit
  std::vector<RowMove> moves;
  std::vector<int32_t> wave_offsets;    // [num_waves + 1]
  std::vector<int32_t> released_pages;  // pages returned to the free list, in that order
};

// ---- fragmentation metrics --------------------------------------------------------------------

// Number of maximal runs where pages[k + 1] == pages[k] + 1 (0 for no pages). One run means the
// pages are contiguous and ascending.
int32_t count_runs(std::span<const int32_t> pages);

struct PoolMetrics {
  int32_t num_requests = 0;
  int32_t pages_used = 0;
  int32_t pages_free = 0;
  int64_t total_runs = 0;            // summed over live requests
  double mean_run_length = 0.0;      // pages_used / total_runs; 0 when no request holds a page
  int32_t largest_free_run = 0;      // longest run of consecutive free page indices
  double fraction_contiguous = 1.0;  // requests with at most one run / num_requests; 1 if none
};

// ---- the pool ---------------------------------------------------------------------------------

// Defined only by tests, which use it to corrupt a copy of a pool on purpose and show that
// check_invariants notices; the library itself never defines it.
struct KvPoolTestAccess;

class KvPool {
 public:
  explicit KvPool(const PoolConfig& config);  // validates config; all pages free, ascending

  const PoolConfig& config() const { return config_; }
  // Pages needed to hold num_tokens rows: ceil(num_tokens / page_size).
  int64_t pages_for(int64_t num_tokens) const;

  // Creates `request` holding num_tokens >= 0 rows (pages taken per the policy).
  void alloc(int64_t request, int64_t num_tokens);
  // Adds num_tokens >= 0 rows: the partly filled last page first, then new pages.
  void extend(int64_t request, int64_t num_tokens);
  // Shrinks the request to num_tokens rows (0 <= num_tokens <= current), releasing whole pages
  // past the new end; the partly filled last page stays.
  void truncate(int64_t request, int64_t num_tokens);
  // Releases every page of the request (in page-table order) and forgets it. Freeing an id that
  // is not live (never allocated, or already freed) is an error.
  void free(int64_t request);

  bool contains(int64_t request) const;
  int64_t num_tokens(int64_t request) const;
  const std::vector<int32_t>& pages(int64_t request) const;
  std::vector<int64_t> request_ids() const;  // ascending
  int32_t num_free_pages() const;
  int32_t num_used_pages() const { return config_.num_pages - num_free_pages(); }
  // The free pages in the order allocation would take them.
  std::vector<int32_t> free_list() const;
  // Physical location of logical row `row` (0 <= row < num_tokens) of the request.
  RowSlot locate(int64_t request, int64_t row) const;
  // Writes the request's page list into row[0, stride), padding the rest with `pad`;
  // stride must be at least the number of pages.
  void page_table_row(int64_t request, int32_t* row, int64_t stride, int32_t pad) const;
  std::vector<int32_t> page_table_row(int64_t request, int64_t stride, int32_t pad) const;

  int32_t runs(int64_t request) const { return count_runs(pages(request)); }
  PoolMetrics metrics() const;

  // Full defrag: afterwards every live request's k-th page is base_r + k for disjoint ranges
  // [base_r, base_r + n_r). Objective: fewest page moves (pages already at their destination
  // stay). Two packings are planned and the cheaper one taken: (1) naive: requests in order of
  // their current first page, packed from page 0; (2) overlap: each request prefers the base that
  // keeps most of its pages in place (candidates taken by decreasing overlap, never overlapping),
  // the remaining requests go best-fit, largest first, into the gaps (dropping the weakest kept
  // placement while they do not fit). So a plan never moves more pages than the naive packing.
  // Needs one free page when a cycle must be broken, and throws (pool unchanged) if there is
  // none. In a full pool every relocation lies on a cycle, so a full pool can be defragmented only
  // when nothing has to move: keep one page spare if defrag must always succeed.
  // defrag() plans and updates the bookkeeping; plan_defrag() only plans. Afterwards the free
  // list is rebuilt in ascending page order (under both policies).
  DefragPlan plan_defrag() const;
  DefragPlan defrag();
  // Partial defrag with at most max_moves >= 0 moves: requests that are not contiguous, cheapest
  // first (fewest moves in the layout before the call, scratch hops of cycles included; equal
  // costs in id order), are each moved into the range of pages that are free or their own which
  // keeps most of their pages in place, when their moves still fit in the budget (a request that
  // does not fit is passed over and the following ones are still tried). Other requests are not
  // touched.
  DefragPlan plan_partial_defrag(int64_t max_moves) const;
  DefragPlan partial_defrag(int64_t max_moves);

  // Commit of accepted tree nodes. The request holds prefix_len + q_len rows, its tree tail node j
  // at logical row prefix_len + j. accepted[0..n) are the accepted tail nodes, root first:
  // accepted[0] == 0, accepted[k] >= k, distinct, < q_len, 1 <= n <= q_len. Row prefix_len +
  // accepted[k] moves to row prefix_len + k (identities skipped); the request then holds
  // prefix_len + n rows and pages wholly past them are released (the partly filled last page
  // stays). Moves in increasing k are safe in place: the destination row prefix_len + k is
  // below every later source row prefix_len + accepted[j] >= prefix_len + j > prefix_len + k.
  // The plan lists them by wave, then k: move k goes one wave after the move that reads row
  // prefix_len + k (the j < k with accepted[j] == k), so plan order is safe as well. That is the
  // fewest waves possible: move j must run before move accepted[j] (it reads the row that one
  // overwrites), so a chain of moves j, accepted[j], accepted[accepted[j]], ... needs one wave
  // per move, and num_waves is exactly the length of the longest such chain (one wave when no
  // move reads a row another move writes). A path that skips one node and then follows a chain
  // gives one wave per move; a single CTA looping over the waves, or gather-to-staging then
  // scatter, handles that in one launch.
  CommitPlan commit_accepted(int64_t request, int64_t prefix_len,
                             std::span<const int32_t> accepted);

  // Throws if the bookkeeping is inconsistent: a request whose page count does not match its
  // token count, or holding a page outside [0, num_pages); a page held twice; a free page outside
  // [0, num_pages), free twice, or both free and held; a page neither free nor held (lost).
  // For tests.
  void check_invariants() const;

  bool operator==(const KvPool&) const = default;

 private:
  friend struct KvPoolTestAccess;

  struct Request {
    int64_t num_tokens = 0;
    std::vector<int32_t> pages;
    bool operator==(const Request&) const = default;
  };

  Request& find(int64_t request, const char* what);
  const Request& find(int64_t request, const char* what) const;
  std::vector<int32_t> take_pages(int64_t count);  // caller checked there are enough
  void release_pages(std::span<const int32_t> pages);
  void install(const DefragPlan& plan);
  std::vector<uint8_t> used_map() const;

  PoolConfig config_;
  std::map<int64_t, Request> requests_;
  std::deque<int32_t> free_fifo_;  // kAsFreed
  std::set<int32_t> free_sorted_;  // kSorted
};

// ---- applying plans to a host buffer ------------------------------------------------------------
// cache: [num_pages, page_size, row_width] elements of elem_size bytes. Every index is checked
// before anything is copied, so an invalid plan leaves the buffer unchanged. The moves run one
// after the other in order; with wave_offsets, the waves are checked first (validate_waves), so
// a plan that the GPU, which runs each wave's moves concurrently, would apply differently is
// refused here too.
void apply_page_moves(const PoolConfig& config, std::span<const PageMove> moves, void* cache);
void apply_row_moves(const PoolConfig& config, std::span<const RowMove> moves, void* cache);
void apply_page_moves(const PoolConfig& config, std::span<const PageMove> moves,
                      std::span<const int32_t> wave_offsets, void* cache);
void apply_row_moves(const PoolConfig& config, std::span<const RowMove> moves,
                     std::span<const int32_t> wave_offsets, void* cache);

// Throws treemla::Error unless wave_offsets cuts `moves` into waves as DefragPlan and CommitPlan
// do: wave_offsets[0] == 0, non-decreasing, wave_offsets.back() == moves.size(); within a wave
// the destinations are distinct and no destination is the source of another move of that wave.
void validate_waves(std::span<const PageMove> moves, std::span<const int32_t> wave_offsets);
void validate_waves(std::span<const RowMove> moves, std::span<const int32_t> wave_offsets);

inline void apply_plan(const PoolConfig& config, const DefragPlan& plan, void* cache) {
  apply_page_moves(config, plan.moves, cache);
}
inline void apply_plan(const PoolConfig& config, const CommitPlan& plan, void* cache) {
  apply_row_moves(config, plan.moves, cache);
}

}  // namespace treemla::kvpool
