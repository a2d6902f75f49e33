// KV pool plans on the GPU (architecture-generic): page moves of a defrag and row moves of a
// host-planned commit, in one launch per plan, waves in order; and the page-table scatter.
//
// ---- ordered_moves_kernel: grid mapping and ordering --------------------------------------------
// Work is the plan's move list in order, cut into tickets of G consecutive moves (G moves of
// about kTicketBytes, 1..kMaxTicketMoves). A persistent grid (as many CTAs as fit at once, never
// more than there are tickets) loops: thread 0 takes the next ticket from an atomic counter
// (ws[kTicket]), so tickets are handed out in plan order and only to running CTAs. A CTA owns
// its ticket's moves: it stages their byte offsets in shared memory, then copies them, every
// thread moving 16-byte vectors (consecutive threads, consecutive vectors of one page or row:
// coalesced), loaded and stored with .cg (L2, the point of coherence: an L1 could hold a stale
// copy of a page another SM rewrote in an earlier wave).
//
// A ticket may span several waves; it is copied one wave segment at a time. The completion
// counter ws[kPublished] counts moves whose copies are finished and visible. Invariant (P): the
// published set is closed downwards over waves -- if a move is published, every move of every
// earlier wave is. Hence "published >= wave_offsets[w]" implies all moves of waves < w are done
// (if one were missing, every published move would lie in a wave <= its wave, fewer than
// wave_offsets[w] moves). Before each segment the CTA ensures all earlier waves are done:
//   segment 0 (wave w0, from the ticket start): wait until published >= wave_offsets[w0];
//   segment 1 (wave w0 + 1): first publish segment 0 (its moves are not yet counted; waiting
//     without publishing would wait on ourselves), then wait until published >=
//     wave_offsets[w0 + 1];
//   segment s >= 2: waves w0 + 1 .. w0 + s - 1 lie wholly inside this ticket and were copied by
//     this CTA, and everything below wave_offsets[w0 + 1] was awaited at segment 1, so a
//     __syncthreads (this CTA's earlier writes visible to its threads) is enough.
// The rest of the ticket is published at its end. Each publication keeps (P): segment 0 is
// published after observing its earlier waves done; the final batch after observing
// everything below wave w0 + 1 done, and its inner waves are complete within the batch.
// Publication: __syncthreads (all of the CTA's stores issued), then thread 0 __threadfence and
// atomicAdd. Waiting: thread 0 polls with ld.acquire.gpu (with __nanosleep backoff), then
// __threadfence and __syncthreads before any thread reads.
// Progress: a CTA waits only on moves of earlier tickets, which are held by CTAs that are
// running (a ticket is taken only by a running CTA) and whose own waits, by induction on the
// ticket order, end. So the launch cannot deadlock, whatever the grid size.
// Robustness: the wait target is clamped to the segment start and the wave index to the plan,
// so malformed wave_offsets can reorder moves but cannot hang the kernel or index out of range.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "cuda/common/device_status.h"
#include "cuda/smxx/kvpool_common.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/kvpool.h"

namespace treemla::cuda {

void kvpool_detail::check_device_cache(const DeviceCache& c, int32_t page_table_stride) {
  TREEMLA_CHECK(c.data != nullptr, "cache.data is null");
  TREEMLA_CHECK(reinterpret_cast<uintptr_t>(c.data) % 16 == 0,
                "cache.data must be 16-byte aligned, got " << c.data);
  treemla::validate(c.layout(page_table_stride), "cache.");
  TREEMLA_CHECK(c.row_bytes() % 16 == 0,
                "cache.row_width * elem_size = "
                    << c.row_bytes()
                    << " bytes must be a multiple of 16 (rows are copied as 16-byte vectors)");
  TREEMLA_CHECK(c.page_bytes() < (int64_t{1} << 31),
                "cache: a page of " << c.page_bytes() << " bytes must be below 2 GiB");
}

namespace {

using kvpool_detail::check_device_cache;

constexpr int kMoveThreads = 256;
// Measured on H200 (treemla bench-pool): 64 KiB tickets copied in rounds of 4 vectors per
// thread beat one-round tickets of 16 or 32 KiB (per-ticket overhead) and rounds of 8 or 16
// vectors (fewer CTAs per SM).
constexpr int kUnroll = 4;
constexpr int64_t kTicketBytes = 64 << 10;
constexpr int kMaxTicketMoves = 64;

// The workspace (kMoveWorkspaceBytes). The two counters are reset by every launch; the status
// record (device_status.h) is sticky until check_move_status.
struct MoveWorkspace {
  uint32_t ticket;      // first move of the next ticket
  uint32_t published;   // moves whose copies are finished and visible
  DeviceStatus status;  // first skipped move or update
};
static_assert(offsetof(MoveWorkspace, status) == 2 * sizeof(uint32_t) &&
                  sizeof(MoveWorkspace) <= kMoveWorkspaceBytes,
              "the counters, then the status record, within kMoveWorkspaceBytes");

// `where` starts the messages ("apply_page_moves: " or nothing).
void check_workspace(const void* workspace, const std::string& where = "") {
  TREEMLA_CHECK(workspace != nullptr, where << "workspace is null");
  TREEMLA_CHECK(reinterpret_cast<uintptr_t>(workspace) % alignof(MoveWorkspace) == 0,
                where << "workspace must be " << alignof(MoveWorkspace) << "-byte aligned, got "
                      << workspace);
}

struct MoveArgs {
  uint8_t* data;
  const int32_t* moves;         // page moves: (src, dst) pairs; row moves: (sp, ss, dp, ds) quads
  const int32_t* wave_offsets;  // [num_waves + 1]
  int32_t num_moves;
  int32_t num_waves;
  int32_t num_pages;
  int32_t page_size;
  int32_t unit_bytes;    // bytes one move copies: a page or a row
  int32_t chunks;        // unit_bytes / 16
  int32_t ticket_moves;  // G
  MoveWorkspace* ws;
};

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Byte offsets of move m's source and destination, or -1 / -1 (skipped) if an index is outside
// the cache.
template <bool kRows>
__device__ __forceinline__ void decode_move(const MoveArgs& a, int32_t m, int64_t* src,
                                            int64_t* dst) {
  bool ok;
  int64_t s, d;
  if (kRows) {
    const int4 mv = __ldg(reinterpret_cast<const int4*>(a.moves) + m);  // 16-byte RowMove
    ok = mv.x >= 0 && mv.x < a.num_pages && mv.y >= 0 && mv.y < a.page_size && mv.z >= 0 &&
         mv.z < a.num_pages && mv.w >= 0 && mv.w < a.page_size;
    s = int64_t{mv.x} * a.page_size + mv.y;
    d = int64_t{mv.z} * a.page_size + mv.w;
  } else {
    const int2 mv = __ldg(reinterpret_cast<const int2*>(a.moves) + m);  // 8-byte PageMove
    ok = mv.x >= 0 && mv.x < a.num_pages && mv.y >= 0 && mv.y < a.num_pages;
    s = mv.x;
    d = mv.y;
  }
  if (!ok) {
    record_status(&a.ws->status, kRows ? kStatusBadRowMove : kStatusBadPageMove, m, 0, 0);
    *src = *dst = -1;
    return;
  }
  *src = s * a.unit_bytes;
  *dst = d * a.unit_bytes;
}

// The wave w with wave_offsets[w] <= m < wave_offsets[w + 1] (the last such w if waves are
// empty), in [0, num_waves). A CTA's tickets increase, so its next wave is at or after `hint`
// (its last one): the warp first probes the 32 waves from there in one load. Otherwise a 32-ary
// search: each step probes 32 points of the current interval [lo, hi), so 1e6 waves take 4
// dependent loads.
__device__ int32_t find_wave(const int32_t* offsets, int32_t num_waves, int32_t m, int32_t hint,
                             int lane) {
  int32_t lo = 0, hi = num_waves;  // answer in [lo, hi)
  if (hint >= 0 && hint < num_waves) {
    const int32_t p = hint + lane;
    const unsigned ballot = __ballot_sync(0xffffffffu, p < num_waves && __ldg(offsets + p) <= m);
    const int c = __popc(ballot);              // a prefix of the lanes when the offsets increase
    if (c > 0 && c < 32) return hint + c - 1;  // < num_waves: only lanes with p < num_waves count
    if (c == 32) lo = hint + 31;               // offsets[hint + 31] <= m
  }
  while (hi - lo > 1) {
    const int64_t span = hi - lo;  // probes lo + 1 .. hi, increasing; the last one is hi
    const int32_t probe = lo + 1 + static_cast<int32_t>((span - 1) * lane / 31);
    const bool le = probe < hi && __ldg(offsets + probe) <= m;
    const unsigned ballot = __ballot_sync(0xffffffffu, le);
    const int c = __popc(ballot);  // probes are increasing, so the true ones are a prefix
    const int32_t new_lo = c == 0 ? lo : __shfl_sync(0xffffffffu, probe, c - 1);
    const int32_t new_hi = __shfl_sync(0xffffffffu, probe, c < 32 ? c : 31);
    lo = new_lo;
    hi = c < 32 ? new_hi : hi;
  }
  return lo;
}

// Copies moves [i0, i1) of the ticket (indices into the staged offsets). A ticket of
// kTicketBytes is one round of kUnroll vectors per thread: all loads in flight, then the stores,
// so a small wave costs one memory round trip, not several.
__device__ __forceinline__ void copy_segment(uint8_t* data, const int64_t* s_src,
                                             const int64_t* s_dst, int32_t i0, int32_t i1,
                                             int32_t chunks) {
  const int32_t total = (i1 - i0) * chunks;  // < 2^31: at most max(kTicketBytes, one unit) / 16
  for (int32_t base = threadIdx.x; base < total; base += kMoveThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t idx = base + u * kMoveThreads;
      if (idx < total) {
        const int32_t m = idx / chunks, c = idx - m * chunks;
        const int64_t src = s_src[i0 + m];
        if (src >= 0) v[u] = __ldcg(reinterpret_cast<const uint4*>(data + src) + c);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t idx = base + u * kMoveThreads;
      if (idx < total) {
        const int32_t m = idx / chunks, c = idx - m * chunks;
        const int64_t dst = s_dst[i0 + m];  // -1 exactly when the source is -1 (a skipped move)
        if (dst >= 0) __stcg(reinterpret_cast<uint4*>(data + dst) + c, v[u]);
      }
    }
  }
}

template <bool kRows>
__global__ void __launch_bounds__(kMoveThreads) ordered_moves_kernel(const MoveArgs a) {
  __shared__ int64_t s_src[kMaxTicketMoves], s_dst[kMaxTicketMoves];
  __shared__ int32_t s_start, s_wave;
  uint32_t* const ticket = &a.ws->ticket;
  uint32_t* const published = &a.ws->published;
  const int tid = threadIdx.x;
  if (tid == 0) s_wave = 0;  // the wave hint; published by the barrier at the loop top
  for (;;) {
    if (tid == 0)
      s_start = static_cast<int32_t>(min(atomicAdd(ticket, static_cast<uint32_t>(a.ticket_moves)),
                                         static_cast<uint32_t>(a.num_moves)));
    __syncthreads();
    const int32_t start = s_start;  // uniform
    if (start >= a.num_moves) break;
    const int32_t end =
        static_cast<int32_t>(min(int64_t{start} + a.ticket_moves, int64_t{a.num_moves}));
    for (int32_t i = tid; i < end - start; i += kMoveThreads)
      decode_move<kRows>(a, start + i, &s_src[i], &s_dst[i]);
    if (tid < 32) {
      const int32_t w = find_wave(a.wave_offsets, a.num_waves, start, s_wave, tid);
      __syncwarp();  // every lane has read the hint before lane 0 replaces it
      if (tid == 0) s_wave = w;
    }
    __syncthreads();  // staged offsets and s_wave visible; every thread has read s_start
    int32_t w = s_wave;
    int32_t seg = start;
    int32_t published_here = 0;  // thread 0: moves of this ticket already published
    for (int s = 0; seg < end; ++s, ++w) {
      int32_t wave_end = end;
      if (w + 1 <= a.num_waves) wave_end = min(max(__ldg(a.wave_offsets + w + 1), seg), end);
      if (w + 1 >= a.num_waves) wave_end = end;  // the last wave (or malformed offsets): the rest
      if (s > 0) __syncthreads();                // segment s - 1 is written by every thread
      if (s <= 1) {
        if (tid == 0) {
          if (s == 1) {
            __threadfence();
            atomicAdd(published, static_cast<uint32_t>(seg - start));
            published_here = seg - start;
          }
          const int32_t need = min(__ldg(a.wave_offsets + w), seg);
          unsigned ns = 32;
          while (static_cast<int32_t>(ld_acquire(published)) < need) {
            __nanosleep(ns);
            ns = ns < 256 ? 2 * ns : 256;
          }
          __threadfence();
        }
        __syncthreads();
      }
      copy_segment(a.data, s_src, s_dst, seg - start, wave_end - start, a.chunks);
      seg = wave_end;
    }
    __syncthreads();  // every store of the ticket issued
    if (tid == 0) {
      __threadfence();
      atomicAdd(published, static_cast<uint32_t>(end - start - published_here));
    }
  }
}

template <bool kRows>
void launch_ordered_moves(const DeviceCache& cache, const void* moves, const int32_t* wave_offsets,
                          int32_t num_moves, int32_t num_waves, void* workspace,
                          cudaStream_t stream, const char* what) {
  check_device_cache(cache);
  TREEMLA_CHECK(num_moves >= 0, what << ": num_moves must be >= 0, got " << num_moves);
  TREEMLA_CHECK(
      num_waves >= 0 && num_waves <= num_moves,
      what << ": num_waves must be in [0, num_moves = " << num_moves << "], got " << num_waves);
  TREEMLA_CHECK(
      num_moves == 0 || num_waves >= 1,
      what << ": num_waves must be >= 1 when there are moves (num_moves = " << num_moves << ")");
  if (num_moves == 0) return;
  TREEMLA_CHECK(moves != nullptr, what << ": moves is null");
  TREEMLA_CHECK(wave_offsets != nullptr, what << ": wave_offsets is null");
  check_workspace(workspace, std::string(what) + ": ");
  MoveArgs a;
  a.data = static_cast<uint8_t*>(cache.data);
  a.moves = static_cast<const int32_t*>(moves);
  a.wave_offsets = wave_offsets;
  a.num_moves = num_moves;
  a.num_waves = num_waves;
  a.num_pages = cache.num_pages;
  a.page_size = cache.page_size;
  a.unit_bytes = static_cast<int32_t>(kRows ? cache.row_bytes() : cache.page_bytes());
  a.chunks = a.unit_bytes / 16;
  a.ticket_moves =
      static_cast<int32_t>(std::clamp<int64_t>(kTicketBytes / a.unit_bytes, 1, kMaxTicketMoves));
  a.ws = static_cast<MoveWorkspace*>(workspace);
  int device = 0, sms = 0, per_sm = 0;
  TREEMLA_CUDA_CHECK(cudaGetDevice(&device));
  TREEMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TREEMLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, ordered_moves_kernel<kRows>, kMoveThreads, 0));
  const int64_t tickets = (int64_t{num_moves} + a.ticket_moves - 1) / a.ticket_moves;
  const int grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(tickets, int64_t{sms} * std::max(per_sm, 1))));
  TREEMLA_CUDA_CHECK(
      cudaMemsetAsync(a.ws, 0, offsetof(MoveWorkspace, status), stream));  // the counters
  ordered_moves_kernel<kRows><<<grid, kMoveThreads, 0, stream>>>(a);
  TREEMLA_CHECK_LAUNCH(what);
}

// ---- page-table scatter ------------------------------------------------------------------------
// Grid: one CTA per update; the CTA validates the whole update (__syncthreads_or) before it
// writes, so an invalid update changes nothing. Updates write disjoint rows when row ids are
// distinct (a request appears once in a plan), so CTAs need no ordering.
constexpr int kTableThreads = 128;

struct TableArgs {
  int32_t* page_table;
  int32_t num_rows, stride, num_pages;
  const int32_t* rows;
  const int32_t* offsets;
  const int32_t* pages;
  DeviceStatus* status;
};

__global__ void __launch_bounds__(kTableThreads) page_table_update_kernel(const TableArgs a) {
  const int32_t u = blockIdx.x;
  const int32_t row = __ldg(a.rows + u);
  const int32_t o0 = __ldg(a.offsets + u), o1 = __ldg(a.offsets + u + 1);
  const int32_t n = o1 - o0;
  bool bad = row < 0 || row >= a.num_rows || o0 < 0 || n < 0 || n > a.stride;
  for (int32_t k = threadIdx.x; !bad && k < n; k += kTableThreads) {
    const int32_t pg = __ldg(a.pages + o0 + k);
    bad = pg < 0 || pg >= a.num_pages;
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) record_status(a.status, kStatusBadTableUpdate, u, 0, 0);
    return;
  }
  int32_t* dst = a.page_table + int64_t{row} * a.stride;
  for (int32_t k = threadIdx.x; k < n; k += kTableThreads) dst[k] = __ldg(a.pages + o0 + k);
}

}  // namespace

void apply_page_moves(const PageMoveParams& p, void* workspace, cudaStream_t stream) {
  launch_ordered_moves<false>(p.cache, p.moves, p.wave_offsets, p.num_moves, p.num_waves, workspace,
                              stream, "apply_page_moves");
}

void apply_row_moves(const RowMoveParams& p, void* workspace, cudaStream_t stream) {
  launch_ordered_moves<true>(p.cache, p.moves, p.wave_offsets, p.num_moves, p.num_waves, workspace,
                             stream, "apply_row_moves");
}

void update_page_tables(const PageTableUpdateParams& p, void* workspace, cudaStream_t stream) {
  TREEMLA_CHECK(p.num_updates >= 0, "num_updates must be >= 0, got " << p.num_updates);
  if (p.num_updates == 0) return;
  TREEMLA_CHECK(p.page_table != nullptr, "page_table is null");
  TREEMLA_CHECK(p.num_rows >= 1, "num_rows must be >= 1, got " << p.num_rows);
  check_page_table_stride(p.stride, "stride");  // the bounds of paged_cache.h
  check_num_pages(p.num_pages, "num_pages");
  TREEMLA_CHECK(p.rows != nullptr && p.offsets != nullptr && p.pages != nullptr,
                "rows, offsets and pages must not be null");
  check_workspace(workspace);
  TableArgs a{p.page_table, p.num_rows, p.stride, p.num_pages,
              p.rows,       p.offsets,  p.pages,  &static_cast<MoveWorkspace*>(workspace)->status};
  page_table_update_kernel<<<p.num_updates, kTableThreads, 0, stream>>>(a);
  TREEMLA_CHECK_LAUNCH("page_table_update_kernel");
}

void check_move_status(void* workspace, cudaStream_t stream) {
  check_workspace(workspace);
  const DeviceStatus st =
      take_device_status(&static_cast<MoveWorkspace*>(workspace)->status, stream);
  switch (st.code) {
    case kStatusOk:
      return;
    case kStatusBadPageMove:
      TREEMLA_FAIL("apply_page_moves skipped moves[" << st.index
                                                     << "]: a page index outside [0, num_pages)");
    case kStatusBadRowMove:
      TREEMLA_FAIL("apply_row_moves skipped moves["
                   << st.index
                   << "]: a page outside [0, num_pages) or a slot outside [0, page_size)");
    case kStatusBadTableUpdate:
      TREEMLA_FAIL("update_page_tables skipped update "
                   << st.index
                   << ": row outside [0, num_rows), list longer than stride, "
                      "or a page outside [0, num_pages)");
    default:
      TREEMLA_FAIL("kvpool workspace status record holds unknown code " << st.code);
  }
}

}  // namespace treemla::cuda
