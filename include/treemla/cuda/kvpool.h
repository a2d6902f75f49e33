// treemla: the KV page pool on the GPU (public API) -- applying defrag and commit plans to a
// device cache, page-table updates, and the device-driven acceptance and commit of verified
// trees. The bookkeeping stays on the host (treemla/kvpool.h, KvPool); this module moves data.
//
// Style as treemla/cuda/verify.h: device pointers, a cudaStream_t, no allocation and no host
// synchronization (except the check_* functions, which say so), bad scalar arguments throw
// treemla::Error naming the argument and its bound. Device-side problems (an index out of
// range in device memory) are never read or written out of bounds: they are skipped and
// recorded as a status (see each function).
//
// The cache: [num_pages, page_size, row_width] elements of elem_size bytes (row_width 576 and
// elem_size 2 for bf16/fp16 MLA). Logical row t of a request is
// cache[page_table[t / page_size], t % page_size, :] (treemla/attention.h).
//
// Two ways to commit accepted tree paths; use one per round, never both on the same round:
//  (1) Host plan. The host knows the accepted paths (tree::accept_path on downloaded target
//      tokens), calls KvPool::commit_accepted per request, merges the CommitPlans
//      (merge_commit_plans below), uploads the moves and calls apply_row_moves. Pages are
//      released by the bookkeeping at once; enqueueing the moves before any later write into
//      the cache keeps them valid (kvpool.h).
//  (2) Device driven, CUDA-graph safe: accept_paths then commit_accepted read everything from
//      device memory (lengths, trees, tokens, page tables), so a graph captured once replays
//      every round. The host learns the paths later (an asynchronous download of accepted and
//      accept_len) and then calls KvPool::commit_accepted for the bookkeeping only: the
//      CommitPlan it returns holds the very row moves the device already made. Do NOT apply
//      them again -- their source rows have since been overwritten -- only its released pages
//      and token count matter. The released pages are free on the host side only after the
//      device commit was enqueued, so the kvpool.h rule holds by construction.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "treemla/paged_cache.h"

// The plan element types are defined in treemla/kvpool.h (C++20); pointers to them are all this
// part of the header needs, so it also compiles as C++17 (CUDA translation units).
namespace treemla::kvpool {
struct PageMove;  // {int32 src, int32 dst}: 8 bytes
struct RowMove;   // {{int32 page, int32 slot} src, dst}: 16 bytes
}  // namespace treemla::kvpool

namespace treemla::cuda {

// The paged latent cache in device memory: its data and its geometry (bounds in
// treemla/paged_cache.h, checked there; messages name the fields "cache.<field>").
struct DeviceCache {
  void* data = nullptr;   // [num_pages, page_size, row_width] elements, 16-byte aligned
  int32_t num_pages = 0;  // >= 1
  int32_t page_size = 0;  // rows per page, a power of two in [1, 65536]
  int32_t row_width = 0;  // elements per row (576 for MLA), >= 1
  int32_t elem_size = 0;  // bytes per element (2 for bf16/fp16), >= 1
  // Copies move 16-byte vectors, so row_width * elem_size must be a multiple of 16, and a page
  // (page_size rows) must be below 2 GiB.
  PagedCacheLayout layout(int32_t page_table_stride = 0) const {
    return {num_pages, page_size, row_width, elem_size, page_table_stride};
  }
  int64_t row_bytes() const { return layout().row_bytes(); }
  int64_t page_bytes() const { return layout().page_bytes(); }
};

// Per-request outcome of accept_paths / commit_accepted (optional status arrays). A result, not
// an error: one code per request, written for the caller to act on request by request, while the
// other requests of the launch are accepted and committed. (Violations of a launch's argument
// contract -- a move naming a page outside the cache -- are errors instead: the launch records
// the first one and check_move_status throws it.)
enum class KvStatus : int32_t {
  kOk = 0,
  kBadTreeSize = 1,   // q_len = q_indptr[b + 1] - q_indptr[b] outside 1..kMaxTreeNodes (1025)
  kBadParents = 2,    // parents[0] != -1, or parents[i] outside [0, i) for some i > 0
  kBadAcceptLen = 3,  // accept_len outside 1..max_accept
  kBadPath = 4,       // accepted[0] != 0 or the node indices do not strictly increase
  kBadPrefixLen = 5,  // prefix_len < 0
  kBadPage = 6,  // a row the commit touches has no page-table entry or a page outside the cache
};
const char* kv_status_name(KvStatus s);

// ---- applying plans: page moves (defrag) and row moves (host-planned commit) ------------------
//
// One launch per plan. The moves run in place, in the plan's wave order, with overlapping
// moves ordered: the plan guarantees that a move's destination is free when it runs (cycles are
// broken via a scratch page), so no staging buffer is needed. Moves within a wave are
// independent and run concurrently; a move of wave w starts only after every move of waves < w
// has finished. All waves run in the one launch: a persistent grid takes work in plan order from
// an atomic ticket counter, and a ticket waits on a completion counter for the earlier waves
// (the ordering argument is in src/cuda/smxx/kvpool_moves.cu). This costs no launch per wave,
// which matters because defrag plans after churn have tens to thousands of waves, most of them
// small (a chain takes one wave per page, a cycle one move per wave). Copies are page (or row)
// granular, 16-byte vectors, coalesced, through L2.
//
// Workspace: kMoveWorkspaceBytes of device memory, 8-byte aligned (cudaMalloc gives 256), zeroed
// once by the caller after allocation (cudaMemset). Each apply resets its own counters on the
// stream (cudaMemsetAsync, captured as a graph node), so launches on one stream may share it;
// concurrent streams need one each. A move with an index outside the cache is skipped and the
// first one is recorded in the workspace's sticky status record (check_move_status); the waves
// must be the plan's (non-empty, in order) or the order of the moves is undefined, though nothing
// is accessed out of bounds and the launch terminates.

constexpr size_t kMoveWorkspaceBytes = 64;

struct PageMoveParams {
  DeviceCache cache;
  const kvpool::PageMove* moves = nullptr;  // [num_moves] device: DefragPlan::moves
  const int32_t* wave_offsets = nullptr;    // [num_waves + 1] device: DefragPlan::wave_offsets
  int32_t num_moves = 0;                    // >= 0; == wave_offsets[num_waves]
  int32_t num_waves = 0;                    // >= 1 when num_moves > 0
};
// Copies page src to page dst for every move, in wave order. No-op when num_moves == 0.
void apply_page_moves(const PageMoveParams& p, void* workspace, cudaStream_t stream);

struct RowMoveParams {
  DeviceCache cache;
  const kvpool::RowMove* moves = nullptr;  // [num_moves] device: CommitPlan::moves (or merged)
  const int32_t* wave_offsets = nullptr;   // [num_waves + 1] device
  int32_t num_moves = 0;
  int32_t num_waves = 0;
};
// Copies row (src.page, src.slot) to (dst.page, dst.slot) for every move, in wave order.
void apply_row_moves(const RowMoveParams& p, void* workspace, cudaStream_t stream);

// ---- page tables after a defrag ---------------------------------------------------------------
//
// A defrag changes the page lists of some requests (DefragPlan::tables). Either upload the new
// rows yourself (KvPool::page_table_row + cudaMemcpyAsync per request), or flatten the updates
// (flatten_page_table_updates below), upload the three arrays and scatter them with this kernel
// in one launch. Update u writes page_table[rows[u] * stride + k] = pages[offsets[u] + k] for
// k < its page count; entries past the list are left as they are (a defrag never changes a
// request's page count). An update whose row is outside [0, num_rows), whose list is longer than
// stride, or that holds a page outside [0, num_pages) is skipped whole and recorded in the
// workspace's status (check_move_status). Order with the data moves does not matter as long as
// both are enqueued before the next kernel that reads the cache through the page table.
struct PageTableUpdateParams {
  int32_t* page_table = nullptr;     // [num_rows, stride] device
  int32_t num_rows = 0;              // >= 1
  int32_t stride = 0;                // >= 0, as page_table_stride (paged_cache.h)
  int32_t num_pages = 0;             // pages in the cache, >= 1 (bound of the written values)
  const int32_t* rows = nullptr;     // [num_updates] device: page-table row of each update
  const int32_t* offsets = nullptr;  // [num_updates + 1] device: prefix sums of the list lengths
  const int32_t* pages = nullptr;    // [offsets[num_updates]] device: the new page lists
  int32_t num_updates = 0;           // >= 0
};
void update_page_tables(const PageTableUpdateParams& p, void* workspace, cudaStream_t stream);

// Synchronizes the stream, reads the workspace's status record and throws treemla::Error naming
// the first skipped move or update (and clears the record); returns quietly if there was none.
void check_move_status(void* workspace, cudaStream_t stream);

// ---- acceptance on the GPU --------------------------------------------------------------------
//
// For every request b, the tree nodes are the global rows [q_indptr[b], q_indptr[b + 1]) (as in
// VerifyParams) and its arrays hold request-local node indices. The result equals
// tree::accept_path(parents, node_tokens, target_tokens) of that request -- same walk, same tie
// rule (the lowest-index child carrying the token) -- cut to its first max_accept nodes when the
// path is longer (the bonus token is then the target token at the last kept node; still
// lossless). One CTA per request: it loads the tree into shared memory and one warp walks it,
// 32 candidate children per step. Nothing is precomputed on the host; graph safe.
struct AcceptParams {
  int32_t batch = 0;                       // requests, >= 1
  int32_t max_accept = 0;                  // row stride of accepted, 1..kMaxTreeNodes (1025)
  const int32_t* q_indptr = nullptr;       // [batch + 1] device
  const int32_t* parents = nullptr;        // [total_q] device: local parent, -1 at each root
  const int32_t* node_tokens = nullptr;    // [total_q] device: the token each node carries
  const int32_t* target_tokens = nullptr;  // [total_q] device: the target's token at each node
  int32_t* accepted = nullptr;    // [batch, max_accept] out: accepted local node indices, root
                                  // first (accepted[k] has depth k); -1 past accept_len
  int32_t* accept_len = nullptr;  // [batch] out: 1..max_accept; 0 for a bad request
  int32_t* bonus_tokens =
      nullptr;                // [batch] out: target token at the last accepted node; -1 if bad
  int32_t* status = nullptr;  // [batch] out, optional (may be null): KvStatus
};
void accept_paths(const AcceptParams& p, cudaStream_t stream);

// ---- device-driven commit (CUDA graph safe) ---------------------------------------------------
//
// For every request b with n = accept_len[b] and prefix = prefix_lens[b]: copies logical row
// prefix + accepted[b][k] to row prefix + k for k = 1..n-1 (identity copies skipped), then
// writes new_seq_lens[b] = prefix + n. The same row moves as KvPool::commit_accepted and
// tree::plan_commit. All inputs are read from device memory, one launch covers the batch.
//
// Checked per request before anything moves: prefix >= 0, 1 <= n <= max_accept, accepted[0] == 0,
// strictly increasing node indices, and every touched row has a page-table entry (row / page_size
// < stride) holding a page in [0, num_pages). A request that fails moves nothing, gets
// new_seq_lens[b] = prefix_lens[b] and its KvStatus in status[b] (if given).
// Preconditions (not checked): a request's page-table entries are distinct pages, no page is in
// two requests' tables, and the tree's rows were written at prefix + j before the call.
// new_seq_lens may alias prefix_lens (every read of prefix_lens[b] precedes the write).
struct CommitParams {
  DeviceCache cache;
  int32_t batch = 0;                     // requests, >= 1
  int32_t max_accept = 0;                // row stride of accepted, 1..kMaxTreeNodes (1025)
  int32_t page_table_stride = 0;         // >= 0 (paged_cache.h); rows past it count as kBadPage
  const int32_t* page_table = nullptr;   // [batch, page_table_stride] device
  const int32_t* prefix_lens = nullptr;  // [batch] device: rows before the tree tail
  const int32_t* accepted = nullptr;     // [batch, max_accept] device (accept_paths' output)
  const int32_t* accept_len = nullptr;   // [batch] device
  int32_t* new_seq_lens = nullptr;       // [batch] out: prefix_lens[b] + accept_len[b]
  int32_t* status = nullptr;             // [batch] out, optional (may be null): KvStatus
};
void commit_accepted(const CommitParams& p, cudaStream_t stream);

}  // namespace treemla::cuda

// ---- host helpers for the plans (C++20: they use treemla/kvpool.h) ------------------------------
#if __cplusplus >= 202002L
#include <algorithm>
#include <span>
#include <vector>

#include "treemla/kvpool.h"

namespace treemla::cuda {

inline DeviceCache device_cache(const kvpool::PoolConfig& config, void* data) {
  return DeviceCache{data, config.num_pages, config.page_size, config.row_width, config.elem_size};
}

// Row moves of several commits as one plan: wave w of the result is wave w of every plan.
// Valid for commits made one after another with no alloc or extend in between (and applied
// before anything is written into pages handed out afterwards): each plan then touches only its
// own request's pages -- a commit releases pages but hands none out -- so plans are independent.
struct RowMoveBatch {
  std::vector<kvpool::RowMove> moves;
  std::vector<int32_t> wave_offsets{0};  // [num_waves + 1]
  int32_t num_waves() const { return static_cast<int32_t>(wave_offsets.size()) - 1; }
};
inline RowMoveBatch merge_commit_plans(std::span<const kvpool::CommitPlan> plans) {
  RowMoveBatch out;
  size_t waves = 0;
  for (const kvpool::CommitPlan& p : plans) {
    if (!p.wave_offsets.empty()) waves = std::max(waves, p.wave_offsets.size() - 1);
  }
  for (size_t w = 0; w < waves; ++w) {
    for (const kvpool::CommitPlan& p : plans) {
      if (w + 1 >= p.wave_offsets.size()) continue;  // this plan has fewer waves
      out.moves.insert(out.moves.end(), p.moves.begin() + p.wave_offsets[w],
                       p.moves.begin() + p.wave_offsets[w + 1]);
    }
    out.wave_offsets.push_back(static_cast<int32_t>(out.moves.size()));
  }
  return out;
}

// The flat arrays of PageTableUpdateParams. row_of(request id) gives the page-table row.
struct PageTableUpdateImage {
  std::vector<int32_t> rows;
  std::vector<int32_t> offsets{0};
  std::vector<int32_t> pages;
  int32_t num_updates() const { return static_cast<int32_t>(rows.size()); }
};
template <class RowOf>
PageTableUpdateImage flatten_page_table_updates(std::span<const kvpool::PageTableUpdate> tables,
                                                RowOf&& row_of) {
  PageTableUpdateImage img;
  for (const kvpool::PageTableUpdate& u : tables) {
    img.rows.push_back(static_cast<int32_t>(row_of(u.request)));
    img.pages.insert(img.pages.end(), u.pages.begin(), u.pages.end());
    img.offsets.push_back(static_cast<int32_t>(img.pages.size()));
  }
  return img;
}

}  // namespace treemla::cuda
#endif
