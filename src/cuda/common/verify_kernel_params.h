// Device-side view of one verify call and of its workspace. Shared by the schedule, main and
// combine kernels of every family, and by the host code that sizes and reads the workspace;
// plain data (the status record and its codes are in device_status.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/device_status.h"
#include "cuda/common/schedule_model.h"  // kBlockM, kMinChunkBlocks, kMaxWaves
#include "treemla/attention.h"

namespace treemla::cuda {

struct WorkspaceHeader {
  int counter;          // next work item of the main kernel; reset by schedule and combine
  int num_items;        // work items of this call
  int num_groups;       // (request, tile) groups with more than one split
  int refine_first;     // WorkRefine::first: work items from here on are pieces of the refined last
                        // wave (num_items when none are); beside num_items, so that a main kernel
                        // knows at once whether an item is a piece
  DeviceStatus status;  // first failed device-side check (device_status.h); check_status reads it
};
static_assert(offsetof(WorkspaceHeader, status) == 16 && sizeof(WorkspaceHeader) == 40,
              "the header's layout: four counters, then the status record");

struct RequestSched {
  int q_start;  // q_indptr[b]
  int q_len;    // 0 when the request was rejected by a check
  int prefix_len;
  int tiles;      // ceil(q_len * H / kBlockM)
  int pblocks;    // prefix blocks of kBlockN rows (0 for VerifyPart::kTail)
  int splits;     // prefix splits, >= 1; split s reads prefix blocks
                  // even_part(pblocks, s, splits, align) (split_range), in the item table
                  // split_part(pblocks, w, ...) with the tree tail's weight w (schedule_model.h,
                  // resolve_work_item); the last also the tail
  int part_base;  // first partial slot (only when splits > 1)
  int pair;       // 1: the row tile is processed as two sub-splits at once (cluster family)
  int align;      // split boundaries in multiples of this many blocks (even_part; split_align)
};

// The refined last wave (schedule.cu, "The last wave"): when the work items fill F whole waves of
// the persistent grid and R more, the R items after the first F waves (work items first ..
// first + count - 1, in the list's order) are each cut into q pieces of their block range, so
// that the last wave has count * q <= grid pieces instead of R whole items. Piece p of that part
// (work item first + p) is piece p % q of item first + p / q, and writes partial slot
// extra_base + p. count = 0: nothing is refined.
struct WorkRefine {
  int first;        // F x grid: the first piece's work item index
  int count;        // R: items refined
  int q;            // pieces an item
  int extra_base;   // partial slot of piece 0 (after the slots of the requests' splits)
  int base_groups;  // combine groups of the requests' splits; groups base_groups + r (r < count)
                    // are the refined items of requests with one split
  int tail_one, tail_tree;  // the tree tail's weights the item table's splits were cut with:
                            // VerifyKernelParams::tail_w_one / tail_w_tree, or 0 for a call
                            // without a tail, with pair items or with items past the table
  int reserved;
};

// One combine group as the schedule kernel resolves it (schedule.cu), read by the combine kernel
// in one 64-byte load instead of a chain of dependent lookups (group_base, sched, item_base,
// refine). Its n partial slots are group_slot(g, f), f < n (below); n = 0: nothing to merge.
// Groups below WorkRefine::base_groups are the (request, tile) pairs of requests with several
// splits: split f < s0 wrote slot part0 + f * tiles; the splits from s0 on are work items of the
// refined last wave, each cut into q pieces with consecutive slots (extra_base + (item0 + (s0 + j)
// * tiles) * q + piece, item0 = split 0's work item minus WorkRefine::first). Group base_groups + r
// is refined item r when its request has one split (else that item is merged with its tile's
// group, and n = 0). q_start, q_len: the request's (its rows and where they go).
struct alignas(16) CombineGroup {
  long long part0;
  int tile, n, s0, q;
  int tiles, item0, extra_base, q_start;
  int q_len, reserved[5];
};
static_assert(sizeof(CombineGroup) == 64, "one combine group: four 16-byte loads");

// Partial slot f (< g.n) of combine group g: the combine kernel's reads, and the tests' check of
// the table (gpu_case.h, expect_groups_cover_partials).
TREEMLA_SCHED_HD long long group_slot(const CombineGroup& g, int f) {
  if (f < g.s0) return g.part0 + static_cast<long long>(f) * g.tiles;
  const int j = (f - g.s0) / g.q;  // the refined split, and piece f - s0 - j q of it
  return g.extra_base + static_cast<long long>(g.item0 + (g.s0 + j) * g.tiles) * g.q +
         (f - g.s0 - j * g.q);
}

// What a main-kernel family needs of work item `item` (0 .. hdr->num_items - 1): request, row
// tile, its prefix blocks [pb_begin, pb_end) (32 rows each, within the request's pblocks; the
// last may end past prefix_len), whether it also attends the tree tail (tail != 0), and where it
// writes: slot -1 is the final O and LSE (the item is the tile's only one), else the partial
// slot. Items before refine.first are one split of (request, tile); a piece of the refined last
// wave (WorkRefine) is piece k of q of such a split: the split's blocks cut into q near-equal
// ranges, the tail with the last. The schedule kernel resolves the first
// VerifyKernelParams::item_capacity items into a table (schedule.cu), so that a main kernel reads
// its item right after the header's count, or beside it (fetch_item_issue_now), instead of
// through a chain of dependent lookups (item_base by binary search, sched, refine); fetch_item
// (verify_device.cuh) resolves any item past the table the long way.
struct alignas(16) WorkItem {
  RequestSched rs;  // request b's schedule entry (kp.sched[b])
  int b, tile;
  int pb_begin, pb_end;
  int tail;
  long long slot;
};
static_assert(sizeof(RequestSched) == 36 && sizeof(WorkItem) == 64,
              "one work item: four 16-byte loads");

// Work items the table holds (VerifyPlan::item_capacity): every item of a call whose items fill
// at most max_waves + 2 grids (the splits' waves, a refined last wave, and requests of one split
// beyond them), i.e. the partial slots plus two grids; a call with more items (many short
// requests, each a single split) looks the rest up item by item.
inline int work_item_capacity(int partial_slots, int target_items) {
  return partial_slots + 2 * target_items;
}

// A TMA tensor map (the driver's CUtensorMap: 128 bytes, 64-byte aligned), encoded on the host.
struct alignas(64) TmaMap {
  unsigned long long opaque[16];
};

struct VerifyKernelParams {
  VerifyParams p;
  void* o;           // [total_q, H, 512] p.dtype
  float* lse;        // [total_q, H] natural log
  float scale_log2;  // sm_scale * log2(e)
  int page_shift;    // log2(page_size)
  int target_items;
  int partial_slots;
  long long max_total_q;
  int pair_rows;  // row tiles of at most this many rows run as sub-split pairs (0: never)
  int max_q_len;  // the plan's bound on a request's q_len (limits.max_q_len, or kMaxTreeNodes)
  int max_waves;  // the schedule aims for at most this many waves (the plan's partial slots)
  // Measurement switches of the cluster family, from the environment variable TREEMLA_WAIT_MODE
  // (0 in normal use): 1/2/4 spin on test_wait instead of try_wait (producer empty / stage full /
  // peer exchange waits); timing ablations that give WRONG results: 8 skips the peer exchange,
  // 32 the P V products, 64 the Q K^T products.
  int wait_mode;
  // The decode family's copies (verify_api.cu; TREEMLA_DECODE_COPY, a measurement and test
  // switch): 0 bulk copies where the device has them (sm_90 and newer), 1 cp.async everywhere
  // (the path of sm_80 .. sm_89).
  int decode_cpasync;
  // The schedule takes a refined last wave when its estimate is below refine_pct % of the best
  // plain one's (96 for sm90a, 97 for the other families; TREEMLA_REFINE_PCT, a measurement
  // switch read by verify_api.cu, overrides it).
  int refine_pct;
  // Split boundaries in multiples of this many prefix blocks (schedule_model.h, even_part): 2 for
  // the sm90a family, 1 for the others (split_align_for).
  int split_align;
  // workspace views
  WorkspaceHeader* hdr;
  int* item_base;        // [batch + 1]
  int* group_base;       // [batch + 1]
  RequestSched* sched;   // [batch]
  WorkRefine* refine;    // the refined last wave
  CombineGroup* groups;  // [partial_slots]: the call's combine groups (hdr->num_groups of them)
  WorkItem* items;       // [item_capacity]: work items 0 .. min(num_items, item_capacity) - 1
  int item_capacity;     // VerifyPlan::item_capacity, at least 1
  float* part_o;         // [partial_slots, kBlockM, 512] normalized partial outputs
  float* part_lse;       // [partial_slots, kBlockM] log2-domain LSE of each partial
  // The sm90a TMA kernel's maps over the cache (verify_api.cu, encoded only for it): dimensions
  // [num_pages][page_size][576], boxes of 64 columns x 32 rows (0, page_size >= 32) and x 64 rows
  // (1, page_size >= 64), 128-byte swizzle.
  TmaMap kv_map[2];
  // Prefix blocks the split that carries the tree tail gives up to the others in the item table
  // (schedule_model.h, tail_weight; schedule.cu): for requests of one row (q_len = 1) and of
  // several; per family (tail_weights_for, dispatch.h), TREEMLA_TAIL_WEIGHT overrides them
  // (verify_api.cu). Last, so that the fields the main kernels read keep their offsets.
  int tail_w_one, tail_w_tree;
};

// Workspace layout, computed identically on host and device.
struct WorkspaceLayout {
  size_t header, item_base, group_base, sched, refine, groups, items, part_o, part_lse, total;
};

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

inline WorkspaceLayout workspace_layout(int max_batch, int partial_slots, int item_capacity) {
  WorkspaceLayout l{};
  size_t off = 0;
  l.header = off;
  off = align_up(off + sizeof(WorkspaceHeader), 256);
  l.item_base = off;
  off = align_up(off + sizeof(int) * (max_batch + 1), 256);
  l.group_base = off;
  off = align_up(off + sizeof(int) * (max_batch + 1), 256);
  l.sched = off;
  off = align_up(off + sizeof(RequestSched) * max_batch, 256);
  l.refine = off;
  off = align_up(off + sizeof(WorkRefine), 256);
  l.groups = off;  // groups <= partial slots: each has two or more
  off = align_up(off + sizeof(CombineGroup) * size_t(partial_slots), 256);
  l.items = off;
  off = align_up(off + sizeof(WorkItem) * size_t(item_capacity > 1 ? item_capacity : 1), 256);
  l.part_o = off;
  off = align_up(off + sizeof(float) * size_t(partial_slots) * kBlockM * kHeadDimV, 256);
  l.part_lse = off;
  off = align_up(off + sizeof(float) * size_t(partial_slots) * kBlockM, 256);
  l.total = off;
  return l;
}

}  // namespace treemla::cuda
