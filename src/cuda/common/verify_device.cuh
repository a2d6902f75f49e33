// Device helpers shared by the verify kernels (schedule, main, combine): recording a device-side
// check's failure in the workspace header, finding which request, row tile and split a work item
// is, a split's prefix blocks and whether it attends the tree tail, the tail blocks a row tile can
// see, and the small arithmetic the main-kernel families share (exp2, the k-th set bit of the tail
// bitmap).
#pragma once

#include <cstdint>

#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

// Programmatic dependent launch (sm_90 and newer; nothing on older targets). The main and combine
// kernels are launched so that they may start while the kernel before them in the stream is still
// running (verify_api.cu, use_pdl). pdl_wait blocks until that kernel has completed and its
// writes are visible: call it before the first global access (the combine kernel reads what only
// the schedule kernel writes before it, combine.cu). pdl_launch_dependents lets the next
// kernel start launching (its CTAs wait in pdl_wait for this one to complete). A kernel launched
// without the attribute passes pdl_wait at once.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// 2^x with the SFU (the online softmax works in the log2 domain).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x with the SFU (about an ulp; no slow-path subroutine for denormals, unlike 1.f / x).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The k-th set bit (k >= 0) of a 64-bit mask.
__device__ __forceinline__ int nth_set_bit(uint64_t m, int k) {
  for (int i = 0; i < k; ++i) m &= m - 1;
  return __ffsll(static_cast<long long>(m)) - 1;
}

// Record a failed device-side check in the call's status record (device_status.h); the first
// failure of a call wins and check_status reports it.
__device__ __forceinline__ void record_status(WorkspaceHeader* hdr, int code, int request,
                                              long long value, long long extra) {
  record_status(&hdr->status, code, request, value, extra);
}

// Largest b in [0, n) with base[b] <= x (base non-decreasing, base[0] <= x): the request whose
// range of an exclusive prefix sum (work items, combine groups) holds x.
__device__ __forceinline__ int find_base(const int* base, int n, int x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (base[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Where work item `item` of the schedule sits: request b, row tile, and its index among the
// request's items of that tile (items of a request go tile-fastest). That index is the split,
// except for the cluster family's pair items, which cover splits 2 index and 2 index + 1.
struct ItemPos {
  int b, tile, index;
};
__device__ __forceinline__ ItemPos locate_item(const VerifyKernelParams& kp, int item) {
  ItemPos pos;
  pos.b = find_base(kp.item_base, kp.p.batch, item);
  const int local = item - kp.item_base[pos.b];
  const int tiles = kp.sched[pos.b].tiles;
  pos.tile = local % tiles;
  pos.index = local / tiles;
  return pos;
}

// Whether split s of a request also attends its tree tail: the last split, unless the call
// computes the prefix part only or the request has no tree nodes.
__device__ __forceinline__ bool split_has_tail(const VerifyKernelParams& kp, const RequestSched& rs,
                                               int s) {
  return kp.p.part != VerifyPart::kPrefix && rs.q_len > 0 && s == rs.splits - 1;
}

// Prefix blocks [begin, end) of split `s` of a request: its pblocks cut into rs.splits near-equal
// ranges, on 64-key boundaries for the sm90a family (even_part, schedule_model.h). Without the
// tree tail's weight: the item table's splits may be weighted (resolve_work_item), a lookup's
// never (a weighted call's items are all in the table; schedule.cu).
__device__ __forceinline__ void split_range(const RequestSched& rs, int s, int& begin, int& end) {
  even_part(rs.pblocks, s, rs.splits, rs.align, begin, end);
}

// Work item `item` resolved from the schedule's entries (item_base, sched, refine): what the
// schedule kernel writes into the item table (schedule.cu), and how a main kernel looks up an item
// past the table. `first`: the header's refine_first. Whether the item is a piece is
// known from it, so a plain item's lookups do not wait for the refinement's load. Only a piece
// (the last wave) loads the refinement before it looks up its item. w_one, w_tree: the tree
// tail's weights (tail_weight, schedule_model.h) that the schedule cuts the table's splits with;
// the main kernels' lookups pass none (a weighted call has all its items in the table).
__device__ __forceinline__ WorkItem resolve_work_item(const VerifyKernelParams& kp, int item,
                                                      int first, int w_one = 0, int w_tree = 0) {
  int k = 0, q = 1, at = item;
  int64_t piece_slot = -1;
  const bool piece = item >= first;
  if (piece) {
    const WorkRefine rf = *kp.refine;
    q = max(rf.q, 1);
    at = first + (item - first) / q;
    k = (item - first) - (at - first) * q;
    piece_slot = static_cast<int64_t>(rf.extra_base) + (item - first);
  }
  const ItemPos pos = locate_item(kp, at);
  const RequestSched rs = kp.sched[pos.b];
  WorkItem w;
  w.b = pos.b;
  w.tile = pos.tile;
  w.rs = rs;
  int b0, e0;
  const int tw = w_one > 0 || w_tree > 0
                     ? tail_weight(rs.q_len, rs.pblocks, rs.splits, true, w_one, w_tree)
                     : 0;
  if (tw > 0) {
    split_part(rs.pblocks, tw, pos.index, rs.splits, rs.align, b0, e0);
  } else {
    split_range(rs, pos.index, b0, e0);
  }
  int k0, k1;
  even_part(e0 - b0, k, q, rs.align, k0, k1);  // b0 is a multiple of rs.align: the pieces too
  w.pb_begin = b0 + k0;
  w.pb_end = b0 + k1;
  w.tail = split_has_tail(kp, rs, pos.index) && k == q - 1 ? 1 : 0;
  w.slot = piece           ? piece_slot
           : rs.splits > 1 ? rs.part_base + static_cast<int64_t>(pos.index) * rs.tiles + pos.tile
                           : -1;
  return w;
}

// The work list's size and where its refined pieces start (WorkspaceHeader), from the header's
// first 16 bytes, which the caller loads in one 16-byte load (header_row, or volatile in
// fetch_item_issue_now).
struct ListCounts {
  int num_items, refine_first;
};
__device__ __forceinline__ ListCounts list_counts(const int4& first_row) {
  static_assert(
      offsetof(WorkspaceHeader, num_items) == 4 && offsetof(WorkspaceHeader, refine_first) == 12,
      "the header's first 16 bytes: counter, num_items, num_groups, refine_first");
  return ListCounts{first_row.y, first_row.w};
}
__device__ __forceinline__ int4 header_row(const WorkspaceHeader* hdr) {
  return *reinterpret_cast<const int4*>(hdr);
}

// Work item `item` into w, or false past the end of the work list: the header's counts, then the
// item's record in the schedule's table (schedule.cu): two L2 round trips, where the lookup from
// the schedule's entries is a chain of log2(batch) + 2 (the header, a binary search of item_base,
// the request's entry). Items past the table
// (VerifyKernelParams::item_capacity) take the chain. The loads are ordinary ones from a
// warp-uniform address, so the compiler keeps the record's fields in uniform registers.
__device__ __forceinline__ bool fetch_item(const VerifyKernelParams& kp, int item, WorkItem& w) {
  const int4 first_row = header_row(kp.hdr);
  const ListCounts lc = list_counts(first_row);
  if (item >= lc.num_items) return false;
  if (item < kp.item_capacity) {
    w = kp.items[item];
  } else {
    w = resolve_work_item(kp, item, lc.refine_first);
  }
  return true;
}

// fetch_item in one round trip: the record and the header's counts are loaded together, before
// either is used. The loads are volatile asm so that the compiler issues them here, in this
// order, rather than sinking the record's past the count's test (it did). The price: asm results
// are not known to be warp-uniform, so the record's fields take vector registers. In the sm90a
// family that cost no registers or stack, and the round trip saved up to 2.5% in one call and was
// level in another (docs/verify-kernel.md, "The item table"); in warpspec, decode and cpasync it
// spilled registers, and warpspec ran 7-11% slower.
__device__ __forceinline__ int4 ld_v4_issue_now(const void* p) {
  int4 v;
  asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ bool fetch_item_issue_now(const VerifyKernelParams& kp, int item,
                                                     WorkItem& w) {
  static_assert(sizeof(WorkItem) == 4 * sizeof(int4), "a record is four 16-byte loads");
  const int4* rp = reinterpret_cast<const int4*>(kp.items + min(item, kp.item_capacity - 1));
  int4 r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = ld_v4_issue_now(rp + i);
  const ListCounts lc = list_counts(ld_v4_issue_now(kp.hdr));
  if (item >= lc.num_items) return false;
  if (item < kp.item_capacity) {
    memcpy(&w, r, sizeof(w));
  } else {
    w = resolve_work_item(kp, item, lc.refine_first);
  }
  return true;
}

// 32-key block `it` of a work item whose prefix blocks are [pb_begin, pb_begin + n_pb) and whose
// tail blocks are the set bits of tail_bits: its first logical row, the row where its keys end,
// and its tail block index (-1 for prefix blocks).
struct KeyBlock {
  int t0, limit, jb;
};
__device__ __forceinline__ KeyBlock key_block_at(int it, int pb_begin, int n_pb, uint64_t tail_bits,
                                                 int prefix_len, int q_len) {
  constexpr int kN = 32;
  if (it < n_pb) return {(pb_begin + it) * kN, prefix_len, -1};
  const int jb = nth_set_bit(tail_bits, it - n_pb);
  return {prefix_len + jb * kN, prefix_len + q_len, jb};
}

// Tail blocks (32 tree nodes each) that some row of row tile `tile` can see: bit j set when the
// OR of the mask rows of the tile's nodes has a bit in [32 j, 32 j + 32). Computed by the calling
// warp (every lane gets the same value).
__device__ __forceinline__ uint64_t tile_tail_bits(const VerifyKernelParams& kp,
                                                   const RequestSched& rs, int tile, int lane) {
  const int H = kp.p.num_heads;
  const int rows = rs.q_len * H;
  const int row0 = tile * kBlockM;
  const int node_lo = row0 / H, node_hi = (min(row0 + kBlockM, rows) - 1) / H;
  const int words = kp.p.mask_words;
  const int n_pairs = (node_hi - node_lo + 1) * words;
  uint32_t lo = 0, hi = 0;  // blocks 0..31, 32..63
  for (int idx = lane; idx < n_pairs; idx += 32) {
    const int node = node_lo + idx / words, w = idx - (idx / words) * words;
    const uint64_t m = kp.p.tree_mask[static_cast<int64_t>(rs.q_start + node) * words + w];
    // 32-node blocks 2w and 2w+1 hold bits [64w, 64w+32) and [64w+32, 64w+64).
    const uint32_t bits = (static_cast<uint32_t>(m) != 0u ? 1u : 0u) |
                          (static_cast<uint32_t>(m >> 32) != 0u ? 2u : 0u);
    if (2 * w < 32)
      lo |= bits << (2 * w);
    else
      hi |= bits << (2 * w - 32);
  }
  lo = __reduce_or_sync(0xffffffffu, lo);
  hi = __reduce_or_sync(0xffffffffu, hi);
  uint64_t t = (static_cast<uint64_t>(hi) << 32) | lo;
  const int tblocks = (rs.q_len + 31) / 32;
  if (tblocks < 64) t &= (uint64_t{1} << tblocks) - 1;
  return t;
}

// What every warp of a CTA knows of a work item in the families that run 16-key blocks (half a
// 32-key schedule block: the decode and warpspec families): request, row tile, the tile's rows
// (at most max_rows), the item's prefix blocks, the tail blocks some row of the tile can see, the
// item's 16-key blocks and its output slot (WorkItem). A warp collective (tile_tail_bits).
// The item's 16-key blocks are two a schedule block, except that the second half of the last
// tail block is left out when the tail ends in that block's first 16 rows (it holds no key: the
// one tail row of a q_len = 1 call, the 65th node of a 65-node tree); so n_blocks may be odd.
struct HalfItem {
  int b, tile, rows, pb_begin, n_pb, n_blocks;
  uint64_t tail_bits;
  int64_t slot;
};
__device__ __forceinline__ HalfItem half_item(const VerifyKernelParams& kp, const WorkItem& w,
                                              int lane, int max_rows) {
  const RequestSched& rs = w.rs;
  HalfItem it;
  it.b = w.b;
  it.tile = w.tile;
  it.slot = w.slot;
  it.rows = min(rs.q_len * kp.p.num_heads - w.tile * kBlockM, max_rows);
  it.pb_begin = w.pb_begin;
  it.n_pb = max(0, w.pb_end - w.pb_begin);
  it.tail_bits = w.tail ? tile_tail_bits(kp, rs, w.tile, lane) : 0;
  it.n_blocks = 2 * (it.n_pb + __popcll(it.tail_bits));
  if (it.tail_bits != 0 && rs.q_len - 32 * (63 - __clzll(it.tail_bits)) <= 16) --it.n_blocks;
  return it;
}
// 16-key block h of an item: its 32-key schedule block (the block's keys start at
// t0 + 16 (h & 1)).
__device__ __forceinline__ KeyBlock half_block(const VerifyKernelParams& kp, const HalfItem& it,
                                               int h) {
  const RequestSched& rs = kp.sched[it.b];
  return key_block_at(h >> 1, it.pb_begin, it.n_pb, it.tail_bits, rs.prefix_len, rs.q_len);
}

}  // namespace treemla::cuda
