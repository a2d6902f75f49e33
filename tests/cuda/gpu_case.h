// treemla GPU tests: device copies of a VerifyCase, a runner, result readback, the comparison
// against the double reference with per-row bounds derived from a same-precision baseline
// (common/row_check.h), and the split boundaries the schedule makes.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/row_check.h"
#include "common/verify_case.h"
#include "cuda/common/verify_kernel_params.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/verify.h"

namespace treemla::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!::treemla::test::have_gpu()) GTEST_SKIP() << "no CUDA device"

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : count(n) {
    TREEMLA_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void upload(const void* src, size_t bytes) {
    ASSERT_LE(bytes, count * sizeof(T));
    TREEMLA_CUDA_CHECK(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(count);
    TREEMLA_CUDA_CHECK(cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// Device copy of a VerifyCase. Capacities may exceed the case so that a later, smaller case can
// be uploaded into the same addresses (CUDA graph replay); the page table is re-laid to the
// capacity stride and padded with the poison page index.
struct DeviceCase {
  int num_pages_cap, stride_cap, words_cap;
  DeviceBuffer<uint8_t> q, kv;
  DeviceBuffer<int32_t> page_table, prefix_lens, q_indptr;
  DeviceBuffer<uint64_t> mask;
  DeviceBuffer<uint8_t> o;
  DeviceBuffer<float> lse;
  VerifyParams p;

  DeviceCase(const VerifyCase& c, size_t q_bytes_cap = 0, size_t kv_bytes_cap = 0,
             int num_pages_cap_ = 0, int stride_cap_ = 0, int total_q_cap = 0)
      : num_pages_cap(std::max(num_pages_cap_, c.num_pages)),
        stride_cap(std::max(stride_cap_, c.page_table_stride)),
        words_cap(c.mask_words),
        q(std::max(q_bytes_cap, c.q.size())),
        kv(std::max(kv_bytes_cap, c.kv_cache.size())),
        page_table(size_t(c.batch) * std::max(stride_cap_, c.page_table_stride)),
        prefix_lens(c.batch),
        q_indptr(c.batch + 1),
        mask(size_t(std::max(total_q_cap, c.total_q)) * c.mask_words),
        o(size_t(std::max(total_q_cap, c.total_q)) * c.num_heads * kHeadDimV *
          dtype_size(c.spec.dtype)),
        lse(size_t(std::max(total_q_cap, c.total_q)) * c.num_heads) {
    load(c);
  }

  void load(const VerifyCase& c) {
    ASSERT_EQ(c.mask_words, words_cap);
    ASSERT_LE(c.num_pages, num_pages_cap);
    ASSERT_LE(c.page_table_stride, stride_cap);
    q.upload(c.q.data(), c.q.size());
    kv.upload(c.kv_cache.data(), c.kv_cache.size());
    std::vector<int32_t> pt(size_t(c.batch) * stride_cap, kPoisonPageIndex);
    for (int b = 0; b < c.batch; ++b)
      std::memcpy(&pt[size_t(b) * stride_cap], &c.page_table[size_t(b) * c.page_table_stride],
                  c.page_table_stride * 4);
    page_table.upload(pt.data(), pt.size() * 4);
    prefix_lens.upload(c.prefix_lens.data(), c.prefix_lens.size() * 4);
    q_indptr.upload(c.q_indptr.data(), c.q_indptr.size() * 4);
    mask.upload(c.tree_mask.data(), c.tree_mask.size() * 8);
    p = c.params();
    p.num_pages = num_pages_cap;
    p.page_table_stride = stride_cap;
    p.q = q.ptr;
    p.kv_cache = kv.ptr;
    p.page_table = page_table.ptr;
    p.prefix_lens = prefix_lens.ptr;
    p.q_indptr = q_indptr.ptr;
    p.tree_mask = mask.ptr;
  }

  // Every output byte NaN (0xff), so an unwritten row fails the comparison.
  void poison_outputs() {
    TREEMLA_CUDA_CHECK(cudaMemset(o.ptr, 0xff, o.count));
    TREEMLA_CUDA_CHECK(cudaMemset(lse.ptr, 0xff, lse.count * 4));
  }

  // O as floats for the first n rows x heads.
  std::vector<float> o_float(int64_t rows_heads) const {
    std::vector<uint8_t> raw = o.download();
    std::vector<float> out(size_t(rows_heads) * kHeadDimV);
    for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(raw.data(), int64_t(i), p.dtype);
    return out;
  }
  std::vector<float> lse_float(int64_t rows_heads) const {
    std::vector<float> v = lse.download();
    v.resize(size_t(rows_heads));
    return v;
  }
};

struct GpuResult {
  std::vector<float> o, lse;
};

// A kernel family and tile configuration to run (kAuto: what the plan picks).
struct GpuConfig {
  cuda::KernelFamily family = cuda::KernelFamily::kAuto;
  cuda::TileConfig tile = cuda::TileConfig::kAuto;
  std::string name() const {
    return std::string(cuda::kernel_family_name(family)) + "/" + cuda::tile_config_name(tile);
  }
};

// The longest request of a case (at least 1): the bound run_gpu gives the plan
// (VerifyLimits::max_q_len).
inline int case_max_q_len(const VerifyCase& c) {
  int m = 1;
  for (int b = 0; b < c.batch; ++b) m = std::max(m, c.q_indptr[b + 1] - c.q_indptr[b]);
  return m;
}

// Every family and tile configuration the device must run: the 99 KB configurations always
// (they are what ships for sm_120), the large ones where the device has the shared memory, the
// cluster and warpspec families on compute capability 9.0 and newer (warpspec: 99 KB only), the
// sm90a family on 9.0 when the build has
// sm_90a code, and the decode family (99 KB only) when the plan's bound on a request's rows
// (max_q_len * H, `bound_rows`) is 1..16. make_verify_plan throws (and the test fails) if one of
// them cannot run, so nothing is dropped silently.
inline std::vector<GpuConfig> configs_to_test(int64_t bound_rows = 0) {
  int dev = 0, major = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  int minor = 0;
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  std::vector<cuda::KernelFamily> families{cuda::KernelFamily::kCpAsync};
  if (major >= 9) families.push_back(cuda::KernelFamily::kCluster);
  if (major >= 9) families.push_back(cuda::KernelFamily::kWarpSpec);
  if (bound_rows >= 1 && bound_rows <= 16) families.push_back(cuda::KernelFamily::kDecode);
  std::vector<GpuConfig> out;
  for (cuda::KernelFamily f : families) {
    out.push_back({f, cuda::TileConfig::kSmem99K});
    // The decode and warpspec families have only the 99 KB configuration.
    if (optin >= 150000 && f != cuda::KernelFamily::kDecode && f != cuda::KernelFamily::kWarpSpec)
      out.push_back({f, cuda::TileConfig::kSmemLarge});
  }
  // sm90a (one configuration) on sm_90 whenever the build has its code.
  if (cuda::sm90a_available(major, minor))
    out.push_back({cuda::KernelFamily::kSm90a, cuda::TileConfig::kSmemLarge});
  // TREEMLA_TEST_FAMILY=<name> keeps one family (a quicker run while working on it; the full
  // suite runs them all). A test whose case the family cannot run then runs nothing.
  if (const char* only = std::getenv("TREEMLA_TEST_FAMILY"); only && *only) {
    static const std::vector<std::string> kNames{"cpasync", "cluster", "sm90a", "decode",
                                                 "warpspec"};
    // A name that matches no family would let every test pass without running a kernel.
    if (std::find(kNames.begin(), kNames.end(), only) == kNames.end())
      throw std::runtime_error(std::string("TREEMLA_TEST_FAMILY=") + only +
                               " names no family (cpasync, cluster, sm90a, decode, warpspec)");
    std::vector<GpuConfig> kept;
    for (const GpuConfig& c : out)
      if (std::string(cuda::kernel_family_name(c.family)) == only) kept.push_back(c);
    out = kept;
  }
  return out;
}

// The configurations for a case: those above, the decode family when its requests fit 16 rows.
inline std::vector<GpuConfig> configs_to_test(const VerifyCase& c) {
  return configs_to_test(int64_t{case_max_q_len(c)} * c.num_heads);
}

// The largest persistent grid (work items run at once) of the configurations under test, for
// 16-row requests; 0 when TREEMLA_TEST_FAMILY left none. A batch of more requests than this makes
// every CTA run more than one item.
inline int largest_persistent_grid() {
  int grid = 0;
  for (const GpuConfig& cfg : configs_to_test(16))
    grid =
        std::max(grid, cuda::make_verify_plan({1, 4, 4, 4}, -1, cfg.tile, cfg.family).target_items);
  return grid;
}

// item_capacity > 0 replaces the plan's (VerifyPlan::item_capacity: the work items the schedule
// resolves into its table; a smaller table leaves the workspace's size as it is).
inline GpuResult run_gpu(DeviceCase& d, const VerifyCase& c, const GpuConfig& cfg, VerifyPart part,
                         int item_capacity = 0) {
  d.p.part = part;
  cuda::VerifyLimits lim{c.batch, std::max(1, c.total_q), c.num_heads, case_max_q_len(c)};
  cuda::VerifyPlan plan = cuda::make_verify_plan(lim, -1, cfg.tile, cfg.family);
  if (item_capacity > 0) plan.item_capacity = std::min(item_capacity, plan.item_capacity);
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  TREEMLA_CUDA_CHECK(cudaMemset(ws.ptr, 0xa5, plan.workspace_bytes));  // garbage but the header
  cuda::init_workspace(plan, ws.ptr, 0);
  d.poison_outputs();
  cuda::verify_attention(d.p, plan, ws.ptr, d.o.ptr, d.lse.ptr, 0);
  cuda::check_status(plan, ws.ptr, 0);
  TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
  const int64_t rh = int64_t(c.total_q) * c.num_heads;
  return {d.o_float(rh), d.lse_float(rh)};
}

// The double reference (cpu::verify_full) with the per-row bounds a GPU result must meet.
using CpuResult = Reference;

inline CpuResult run_reference(const VerifyCase& c, VerifyPart part) {
  return reference_with_bounds(c.params(part));
}

// inf/NaN positions first, then every (node, head) row within its derived bounds (row_check.h:
// kBoundFactor times the same-precision baseline's error plus unit-roundoff floors); the message
// names the worst row and its worst element.
inline ::testing::AssertionResult matches(const GpuResult& g, const CpuResult& r,
                                          const VerifyCase& c) {
  ::testing::AssertionResult res = rows_within_bounds(g.o, g.lse, r, c.num_heads);
  if (!res) res << "\n  case: " << c.describe();
  return res;
}

// The request whose work items hold item `item` (item_base: the schedule's [batch + 1] prefix sum
// of items; requests with no items are skipped).
inline int request_of_item(const std::vector<int>& item_base, int item) {
  return static_cast<int>(std::upper_bound(item_base.begin(), item_base.end() - 1, item) -
                          item_base.begin() - 1);
}

// The tree tail's weight the schedule gave request rs in the item table (resolve_work_item,
// verify_device.cuh): from the weights it wrote into the refinement record, which are 0 where it
// weighs nothing (no tail, pair items, items past the table).
inline int tail_weight_of(const cuda::RequestSched& rs, const cuda::WorkRefine& rf) {
  return cuda::tail_weight(rs.q_len, rs.pblocks, rs.splits, true, rf.tail_one, rf.tail_tree);
}

// The split boundaries the schedule makes for d.p: runs cuda::verify_schedule on ws (a workspace
// of plan.workspace_bytes) and reads back the per-request schedule (RequestSched and WorkRefine in
// src/cuda/common/verify_kernel_params.h). Split s of request b reads the 32-row prefix blocks
// split_part(pblocks, w, s, splits, align) (schedule_model.h: near-equal, on 64-key boundaries for
// the sm90a family, the last split w blocks lighter: tail_weight_of); a work item of the refined
// last wave cuts its split's blocks [b0, e0) the same way into q pieces, piece k starting at b0 +
// even_part(e0 - b0, k, q, align). Returns, per request, the first logical row (32 x the block) of
// each split s = 1 .. splits - 1 and of each refined piece k = 1 .. q - 1 (empty: one split,
// nothing refined). With request_of_item and host_work_items, the only place in the tests that
// knows the schedule's layout: adapt it here when that changes.
inline std::vector<std::vector<int64_t>> schedule_boundaries(const DeviceCase& d,
                                                             const cuda::VerifyPlan& plan,
                                                             void* ws) {
  constexpr int64_t kScheduleBlockRows = 32;
  cuda::verify_schedule(d.p, plan, ws, 0);
  cuda::check_status(plan, ws, 0);
  const cuda::WorkspaceLayout layout =
      cuda::workspace_layout(plan.limits.max_batch, plan.partial_slots, plan.item_capacity);
  const auto* base = static_cast<const uint8_t*>(ws);
  std::vector<cuda::RequestSched> sched(static_cast<size_t>(d.p.batch));
  TREEMLA_CUDA_CHECK(cudaMemcpy(sched.data(), base + layout.sched,
                                sched.size() * sizeof(cuda::RequestSched), cudaMemcpyDeviceToHost));
  std::vector<int> item_base(static_cast<size_t>(d.p.batch) + 1);
  TREEMLA_CUDA_CHECK(cudaMemcpy(item_base.data(), base + layout.item_base,
                                item_base.size() * sizeof(int), cudaMemcpyDeviceToHost));
  cuda::WorkRefine rf{};
  TREEMLA_CUDA_CHECK(cudaMemcpy(&rf, base + layout.refine, sizeof(rf), cudaMemcpyDeviceToHost));
  auto split_begin = [&rf](const cuda::RequestSched& rs, int64_t s) {
    int begin, end;
    cuda::split_part(rs.pblocks, tail_weight_of(rs, rf), static_cast<int>(s), rs.splits, rs.align,
                     begin, end);
    return static_cast<int64_t>(begin);
  };
  std::vector<std::vector<int64_t>> out(sched.size());
  for (size_t b = 0; b < sched.size(); ++b) {
    const cuda::RequestSched& rs = sched[b];
    for (int64_t s = 1; s < rs.splits; ++s)
      out[b].push_back(kScheduleBlockRows * split_begin(rs, s));
  }
  for (int r = 0; r < rf.count; ++r) {
    const int item = rf.first + r;
    const size_t b = static_cast<size_t>(request_of_item(item_base, item));
    const cuda::RequestSched& rs = sched[b];
    const int64_t s = (item - item_base[b]) / rs.tiles;
    const int64_t b0 = split_begin(rs, s), len = split_begin(rs, s + 1) - b0;
    for (int64_t k = 1; k < rf.q; ++k) {
      int k0, k1;
      cuda::even_part(len, k, rf.q, rs.align, k0, k1);
      out[b].push_back(kScheduleBlockRows * (b0 + k0));
    }
  }
  return out;
}

// Work items 0 .. hdr.num_items - 1 as the schedule's entries define them, computed here from the
// entries read back from ws as the schedule kernel does (resolve_work_item, verify_device.cuh):
// request b (-1 if no request holds the item, the rest then unset), row tile, split index, piece
// k of q (0 of 1 for an item that is a whole split) and partial slot (-1: the final O and LSE).
struct HostItem {
  int b = -1, tile = 0, index = 0, k = 0, q = 1;
  int64_t slot = -1;
};
inline std::vector<HostItem> host_work_items(const uint8_t* ws, const cuda::WorkspaceLayout& layout,
                                             const cuda::WorkspaceHeader& hdr,
                                             const cuda::WorkRefine& rf,
                                             const std::vector<cuda::RequestSched>& sched) {
  std::vector<int> item_base(sched.size() + 1);
  TREEMLA_CUDA_CHECK(cudaMemcpy(item_base.data(), ws + layout.item_base,
                                item_base.size() * sizeof(int), cudaMemcpyDeviceToHost));
  const bool refined = hdr.refine_first < hdr.num_items;
  const int q = refined ? std::max(rf.q, 1) : 1;
  std::vector<HostItem> items(static_cast<size_t>(std::max(hdr.num_items, 0)));
  for (int item = 0; item < hdr.num_items; ++item) {
    HostItem& it = items[static_cast<size_t>(item)];
    const bool piece = refined && item >= rf.first;
    const int at = piece ? rf.first + (item - rf.first) / q : item;
    it.b = request_of_item(item_base, at);
    if (it.b < 0) continue;
    const cuda::RequestSched& rs = sched[static_cast<size_t>(it.b)];
    const int local = at - item_base[static_cast<size_t>(it.b)];
    it.tile = local % rs.tiles;
    it.index = local / rs.tiles;
    it.q = piece ? q : 1;
    it.k = piece ? (item - rf.first) - (at - rf.first) * q : 0;
    if (piece)
      it.slot = int64_t{rf.extra_base} + (item - rf.first);
    else if (rs.splits > 1)
      it.slot = rs.part_base + int64_t{it.index} * rs.tiles + it.tile;
  }
  return items;
}

// The combine groups the schedule kernel writes (CombineGroup, read by the combine kernel) against
// the work items' partial slots (host_work_items): every slot an item writes is slot f < n of
// exactly one group, that group is the item's request and row tile, and it carries the request's
// rows; no group has a slot no item writes. A group with n = 0 (a refined item of a request with
// several splits) is merged with its tile's group.
inline void expect_groups_cover_partials(const uint8_t* ws, const cuda::WorkspaceLayout& layout,
                                         const cuda::WorkspaceHeader& hdr,
                                         const cuda::WorkRefine& rf,
                                         const std::vector<cuda::RequestSched>& sched) {
  std::vector<cuda::CombineGroup> groups(static_cast<size_t>(hdr.num_groups));
  TREEMLA_CUDA_CHECK(cudaMemcpy(groups.data(), ws + layout.groups,
                                groups.size() * sizeof(cuda::CombineGroup),
                                cudaMemcpyDeviceToHost));
  // slot -> (request, tile) of the item that writes it
  std::map<int64_t, std::pair<int, int>> writer;
  for (const HostItem& it : host_work_items(ws, layout, hdr, rf, sched)) {
    ASSERT_GE(it.b, 0);
    if (it.slot < 0) continue;
    EXPECT_TRUE(writer.emplace(it.slot, std::make_pair(it.b, it.tile)).second)
        << "slot " << it.slot << " twice";
  }
  size_t covered = 0;
  for (size_t grp = 0; grp < groups.size(); ++grp) {
    const cuda::CombineGroup& g = groups[grp];
    if (g.n == 0) continue;
    EXPECT_GE(g.n, 2) << "group " << grp;
    for (int f = 0; f < g.n; ++f) {
      const int64_t slot = cuda::group_slot(g, f);
      const auto it = writer.find(slot);
      if (it == writer.end()) {
        ADD_FAILURE() << "group " << grp << " slot " << f << " = " << slot << ": no item writes it";
        continue;
      }
      const cuda::RequestSched& rs = sched[static_cast<size_t>(it->second.first)];
      EXPECT_EQ(g.tile, it->second.second) << "group " << grp << " slot " << slot;
      EXPECT_EQ(g.q_start, rs.q_start) << "group " << grp;
      EXPECT_EQ(g.q_len, rs.q_len) << "group " << grp;
      ++covered;
    }
  }
  EXPECT_EQ(covered, writer.size()) << "partials that no group merges, or merged twice";
}

// The work-item table the schedule kernel writes (WorkItem, verify_kernel_params.h; what the main
// kernels read, fetch_item in verify_device.cuh) against the items computed here from the
// schedule's entries (host_work_items): for every item the table holds
// (min(num_items, capacity)), its request, row tile, prefix blocks, tree-tail flag, partial slot
// and request entry. with_tail: the call attends the tree tail (its VerifyPart is not kPrefix).
inline void expect_item_table(const uint8_t* ws, const cuda::WorkspaceLayout& layout,
                              const cuda::WorkspaceHeader& hdr, const cuda::WorkRefine& rf,
                              const std::vector<cuda::RequestSched>& sched, int capacity,
                              bool with_tail) {
  const std::vector<HostItem> items = host_work_items(ws, layout, hdr, rf, sched);
  const int n = std::min(hdr.num_items, capacity);
  std::vector<cuda::WorkItem> table(static_cast<size_t>(std::max(n, 0)));
  TREEMLA_CUDA_CHECK(cudaMemcpy(table.data(), ws + layout.items,
                                table.size() * sizeof(cuda::WorkItem), cudaMemcpyDeviceToHost));
  for (int item = 0; item < n; ++item) {
    const HostItem& it = items[static_cast<size_t>(item)];
    ASSERT_GE(it.b, 0);
    const cuda::RequestSched& rs = sched[static_cast<size_t>(it.b)];
    int b0, e0, k0, k1;
    cuda::split_part(rs.pblocks, tail_weight_of(rs, rf), it.index, rs.splits, rs.align, b0, e0);
    cuda::even_part(e0 - b0, it.k, it.q, rs.align, k0, k1);
    const bool tail = with_tail && rs.q_len > 0 && it.index == rs.splits - 1 && it.k == it.q - 1;
    const cuda::WorkItem& w = table[static_cast<size_t>(item)];
    SCOPED_TRACE("work item " + std::to_string(item));
    EXPECT_EQ(w.b, it.b);
    EXPECT_EQ(w.tile, it.tile);
    EXPECT_EQ(w.pb_begin, b0 + k0);
    EXPECT_EQ(w.pb_end, b0 + k1);
    EXPECT_EQ(w.tail != 0, tail);
    EXPECT_EQ(w.slot, it.slot);
    EXPECT_EQ(std::memcmp(&w.rs, &rs, sizeof(rs)), 0) << "its request's schedule entry";
  }
}

}  // namespace treemla::test
