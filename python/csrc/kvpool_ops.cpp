// KV page pool: the host bookkeeping class (treemla._C.KvPool) and the operators that move cache
// data -- plan application (defrag page moves, commit row moves), page-table scatter, and the
// device-driven acceptance and commit of verified trees.
//
// Every operator has a CPU kernel (the library's host code, or a direct loop with the same checks
// as the device) so the same Python code runs on either device, and a CUDA kernel that enqueues
// on torch's current stream without synchronizing. The CUDA kernels exist when the build has
// CUDA and the library's GPU pool module (TREEMLA_BIND_CUDA_KVPOOL, set by setup.py when
// include/treemla/cuda/kvpool.h and its sources are present); otherwise they raise.
#include <torch/extension.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "common.h"
#include "ops.h"
#include "treemla/kvpool.h"
#include "treemla/tree.h"

#if defined(TREEMLA_WITH_CUDA) && defined(TREEMLA_BIND_CUDA_KVPOOL)
#define TREEMLA_KVPOOL_GPU 1
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "treemla/cuda/kvpool.h"
#endif

namespace treemla::binding {

namespace {

namespace py = pybind11;

// Status codes of accept_paths / commit_accepted, as treemla::cuda::KvStatus.
enum : int32_t {
  kOk = 0,
  kBadTreeSize = 1,
  kBadParents = 2,
  kBadAcceptLen = 3,
  kBadPath = 4,
  kBadPrefixLen = 5,
  kBadPage = 6
};

// The cache's geometry: [num_pages, page_size, row_width] or [num_pages, page_size, 1, row_width].
kvpool::PoolConfig cache_config(const at::Tensor& cache) {
  const bool ok3 = cache.dim() == 3, ok4 = cache.dim() == 4 && cache.size(2) == 1;
  TREEMLA_CHECK_VALUE(ok3 || ok4,
                      "cache must have shape [num_pages, page_size, row_width] or "
                      "[num_pages, page_size, 1, row_width], got ",
                      shape_str(cache));
  check_contiguous(cache, "cache");
  TREEMLA_CHECK_VALUE(cache.size(0) >= 1 && cache.size(0) < (int64_t{1} << 31) &&
                          cache.size(1) < (int64_t{1} << 31) && cache.size(-1) < (int64_t{1} << 31),
                      "cache dimensions must be >= 1 pages and < 2^31, got ", shape_str(cache));
  kvpool::PoolConfig c;
  c.num_pages = static_cast<int32_t>(cache.size(0));
  c.page_size = static_cast<int32_t>(cache.size(1));
  c.row_width = static_cast<int32_t>(cache.size(-1));
  c.elem_size = static_cast<int32_t>(cache.element_size());
  guarded([&] { kvpool::validate(c); });
  return c;
}

// An int32 tensor of the given layout, contiguous, on the reference's device.
void check_int(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
               int64_t cols, const char* layout) {
  check_dtype(t, name, {at::kInt});
  // cols > 0: [rows, cols]; cols < 0: 2-D of any width; cols == 0: 1-D.
  const bool ok = cols > 0   ? (t.dim() == 2 && t.size(1) == cols)
                  : cols < 0 ? t.dim() == 2
                             : t.dim() == 1;
  TREEMLA_CHECK_VALUE(ok, name, " must have shape ", layout, ", got ", shape_str(t));
  check_contiguous(t, name);
  check_same_device(t, name, ref, ref_name);
}

// Shapes only: the CPU kernels check the contents too (kvpool::validate_waves); a GPU kernel reads
// them on the device, where malformed offsets can reorder moves but never index out of range.
void check_waves(const at::Tensor& moves, const at::Tensor& wave_offsets, const at::Tensor& cache) {
  check_int(wave_offsets, "wave_offsets", cache, "cache", 0, "[num_waves + 1]");
  TREEMLA_CHECK_VALUE(
      moves.size(0) < (int64_t{1} << 31) && wave_offsets.size(0) < (int64_t{1} << 31),
      "moves and wave_offsets must have fewer than 2^31 rows, got ", shape_str(moves), " and ",
      shape_str(wave_offsets));
  TREEMLA_CHECK_VALUE(wave_offsets.size(0) >= (moves.size(0) > 0 ? 2 : 1),
                      "wave_offsets must have shape "
                      "[num_waves + 1] with num_waves >= ",
                      moves.size(0) > 0 ? 1 : 0, " for ", moves.size(0), " moves, got ",
                      shape_str(wave_offsets));
}

std::span<const int32_t> offsets_span(const at::Tensor& wave_offsets) {
  return {wave_offsets.data_ptr<int32_t>(), static_cast<size_t>(wave_offsets.size(0))};
}

// ---- CPU kernels ---------------------------------------------------------------------------

void apply_page_moves_cpu(const at::Tensor& cache, const at::Tensor& moves,
                          const at::Tensor& wave_offsets, const std::optional<at::Tensor>&) {
  const kvpool::PoolConfig c = cache_config(cache);
  check_int(moves, "moves", cache, "cache", 2, "[num_moves, 2] (src, dst)");
  check_waves(moves, wave_offsets, cache);
  const auto* m = reinterpret_cast<const kvpool::PageMove*>(moves.data_ptr<int32_t>());
  guarded([&] {
    kvpool::apply_page_moves(c, {m, static_cast<size_t>(moves.size(0))}, offsets_span(wave_offsets),
                             cache.data_ptr());
  });
}

void apply_row_moves_cpu(const at::Tensor& cache, const at::Tensor& moves,
                         const at::Tensor& wave_offsets, const std::optional<at::Tensor>&) {
  const kvpool::PoolConfig c = cache_config(cache);
  check_int(moves, "moves", cache, "cache", 4,
            "[num_moves, 4] (src page, src slot, dst page, dst slot)");
  check_waves(moves, wave_offsets, cache);
  const auto* m = reinterpret_cast<const kvpool::RowMove*>(moves.data_ptr<int32_t>());
  guarded([&] {
    kvpool::apply_row_moves(c, {m, static_cast<size_t>(moves.size(0))}, offsets_span(wave_offsets),
                            cache.data_ptr());
  });
}

void check_table_update(const at::Tensor& page_table, const at::Tensor& rows,
                        const at::Tensor& offsets, const at::Tensor& pages, int64_t num_pages) {
  TREEMLA_CHECK_VALUE(num_pages >= 1 && num_pages < (int64_t{1} << 31),
                      "num_pages must be in [1, 2^31), got ", num_pages);
  check_dtype(page_table, "page_table", {at::kInt});
  TREEMLA_CHECK_VALUE(page_table.dim() == 2 && page_table.size(0) >= 1 && page_table.size(1) >= 1,
                      "page_table must have shape [num_rows, stride], got ", shape_str(page_table));
  check_contiguous(page_table, "page_table");
  check_int(rows, "rows", page_table, "page_table", 0, "[num_updates]");
  check_int(offsets, "offsets", page_table, "page_table", 0, "[num_updates + 1]");
  check_int(pages, "pages", page_table, "page_table", 0, "[offsets[-1]]");
  TREEMLA_CHECK_VALUE(offsets.size(0) == rows.size(0) + 1,
                      "offsets must have shape [num_updates + 1] = [", rows.size(0) + 1, "], got ",
                      shape_str(offsets));
}

// Same rule as the device: an update with a bad row, a list longer than the stride, a bad offset
// or a page outside [0, num_pages) is skipped whole; the first one is reported.
void update_page_tables_cpu(const at::Tensor& page_table, const at::Tensor& rows,
                            const at::Tensor& offsets, const at::Tensor& pages, int64_t num_pages,
                            const std::optional<at::Tensor>&) {
  check_table_update(page_table, rows, offsets, pages, num_pages);
  const int64_t n_rows = page_table.size(0), stride = page_table.size(1), n = rows.size(0);
  const int32_t* r = rows.data_ptr<int32_t>();
  const int32_t* off = offsets.data_ptr<int32_t>();
  const int32_t* pg = pages.data_ptr<int32_t>();
  int32_t* table = page_table.data_ptr<int32_t>();
  std::string first_error;
  for (int64_t u = 0; u < n; ++u) {
    const int64_t lo = off[u], hi = off[u + 1];
    std::string why;  // the first bound update u breaks
    if (r[u] < 0 || r[u] >= n_rows) {
      why =
          c10::str("rows[", u, "] = ", r[u], " is outside [0, ", n_rows, ") (page_table.shape[0])");
    } else if (lo < 0 || hi < lo || hi > pages.size(0)) {
      why = c10::str("offsets[", u, "], offsets[", u + 1, "] = ", lo, ", ", hi,
                     " must satisfy 0 <= offsets[", u, "] <= offsets[", u + 1,
                     "] <= ", pages.size(0), " (pages.shape[0])");
    } else if (hi - lo > stride) {
      why = c10::str("its ", hi - lo, " pages do not fit in the row's stride ", stride,
                     " (page_table.shape[1])");
    } else {
      for (int64_t k = lo; why.empty() && k < hi; ++k) {
        if (pg[k] < 0 || pg[k] >= num_pages)
          why = c10::str("pages[", k, "] = ", pg[k], " is outside [0, ", num_pages, ")");
      }
    }
    if (!why.empty()) {
      if (first_error.empty())
        first_error = c10::str("page-table update ", u, " is invalid: ", why);
      continue;
    }
    std::memcpy(table + r[u] * stride, pg + lo, static_cast<size_t>(hi - lo) * sizeof(int32_t));
  }
  TREEMLA_CHECK_RUNTIME(first_error.empty(), "treemla: ", first_error,
                        "; it was skipped, the valid updates were made");
}

void check_accept_args(const at::Tensor& q_indptr, const at::Tensor& parents,
                       const at::Tensor& node_tokens, const at::Tensor& target_tokens,
                       int64_t max_accept) {
  check_int(q_indptr, "q_indptr", q_indptr, "q_indptr", 0, "[batch + 1]");
  TREEMLA_CHECK_VALUE(q_indptr.size(0) >= 2,
                      "q_indptr must have shape [batch + 1] with batch >= 1, got ",
                      shape_str(q_indptr));
  check_int(parents, "parents", q_indptr, "q_indptr", 0, "[total_q]");
  check_int(node_tokens, "node_tokens", q_indptr, "q_indptr", 0, "[total_q]");
  check_int(target_tokens, "target_tokens", q_indptr, "q_indptr", 0, "[total_q]");
  TREEMLA_CHECK_VALUE(
      node_tokens.size(0) == parents.size(0) && target_tokens.size(0) == parents.size(0),
      "parents, node_tokens and target_tokens must have the same shape [total_q], got ",
      shape_str(parents), ", ", shape_str(node_tokens), ", ", shape_str(target_tokens));
  TREEMLA_CHECK_VALUE(max_accept >= 1 && max_accept <= kMaxTreeNodes, "max_accept must be in [1, ",
                      kMaxTreeNodes, "], got ", max_accept);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> accept_paths_cpu(
    const at::Tensor& q_indptr, const at::Tensor& parents, const at::Tensor& node_tokens,
    const at::Tensor& target_tokens, int64_t max_accept) {
  check_accept_args(q_indptr, parents, node_tokens, target_tokens, max_accept);
  const int64_t batch = q_indptr.size(0) - 1, total = parents.size(0);
  const auto opts = q_indptr.options();
  at::Tensor accepted = at::full({batch, max_accept}, -1, opts);
  at::Tensor len = at::zeros({batch}, opts), bonus = at::full({batch}, -1, opts),
             status = at::zeros({batch}, opts);
  const int32_t* ip = q_indptr.data_ptr<int32_t>();
  const int32_t* par_all = parents.data_ptr<int32_t>();
  const int32_t* nt = node_tokens.data_ptr<int32_t>();
  const int32_t* tt = target_tokens.data_ptr<int32_t>();
  int32_t* acc = accepted.data_ptr<int32_t>();
  int32_t *ln = len.data_ptr<int32_t>(), *bo = bonus.data_ptr<int32_t>(),
          *st = status.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lo = ip[b], hi = ip[b + 1];
    if (lo < 0 || hi > total || hi - lo < 1 || hi - lo > kMaxTreeNodes) {
      st[b] = kBadTreeSize;
      continue;
    }
    const std::span<const int32_t> par(par_all + lo, static_cast<size_t>(hi - lo));
    try {
      tree::validate_parents(par);
    } catch (const treemla::Error&) {
      st[b] = kBadParents;
      continue;
    }
    const tree::Acceptance a = guarded([&] {
      return tree::accept_path(par, {nt + lo, par.size()}, {tt + lo, par.size()});
    });
    // A path longer than max_accept is cut; the bonus is the target token at the last kept node.
    const int64_t n = std::min<int64_t>(a.length, max_accept);
    for (int64_t k = 0; k < n; ++k) acc[b * max_accept + k] = a.nodes[k];
    ln[b] = static_cast<int32_t>(n);
    bo[b] = tt[lo + a.nodes[n - 1]];
  }
  return {accepted, len, bonus, status};
}

void check_commit_args(const at::Tensor& cache, const at::Tensor& page_table,
                       const at::Tensor& prefix_lens, const at::Tensor& accepted,
                       const at::Tensor& accept_len) {
  check_int(prefix_lens, "prefix_lens", cache, "cache", 0, "[batch]");
  const int64_t batch = prefix_lens.size(0);
  TREEMLA_CHECK_VALUE(batch >= 1, "prefix_lens must have shape [batch] with batch >= 1, got ",
                      shape_str(prefix_lens));
  check_dtype(page_table, "page_table", {at::kInt});
  TREEMLA_CHECK_VALUE(
      page_table.dim() == 2 && page_table.size(0) == batch && page_table.size(1) >= 1,
      "page_table must have shape [batch, stride] = [", batch, ", >= 1], got ",
      shape_str(page_table));
  check_contiguous(page_table, "page_table");
  check_same_device(page_table, "page_table", cache, "cache");
  check_int(accepted, "accepted", cache, "cache", -1, "[batch, max_accept]");
  TREEMLA_CHECK_VALUE(
      accepted.size(0) == batch && accepted.size(1) >= 1 && accepted.size(1) <= kMaxTreeNodes,
      "accepted must have shape [batch, max_accept] = [", batch, ", 1..", kMaxTreeNodes, "], got ",
      shape_str(accepted));
  check_int(accept_len, "accept_len", cache, "cache", 0, "[batch]");
  TREEMLA_CHECK_VALUE(accept_len.size(0) == batch, "accept_len must have shape [batch] = [", batch,
                      "], got ", shape_str(accept_len));
}

// The device commit's rule, request by request: check everything, then move rows
// prefix + accepted[k] -> prefix + k in increasing k (safe in place, see tree::plan_commit).
std::tuple<at::Tensor, at::Tensor> commit_accepted_cpu(const at::Tensor& cache,
                                                       const at::Tensor& page_table,
                                                       const at::Tensor& prefix_lens,
                                                       const at::Tensor& accepted,
                                                       const at::Tensor& accept_len) {
  const kvpool::PoolConfig c = cache_config(cache);
  check_commit_args(cache, page_table, prefix_lens, accepted, accept_len);
  const int64_t batch = prefix_lens.size(0), stride = page_table.size(1),
                max_accept = accepted.size(1);
  at::Tensor new_lens = prefix_lens.clone(), status = at::zeros_like(prefix_lens);
  const int32_t* pl = prefix_lens.data_ptr<int32_t>();
  const int32_t* acc = accepted.data_ptr<int32_t>();
  const int32_t* al = accept_len.data_ptr<int32_t>();
  const int32_t* table = page_table.data_ptr<int32_t>();
  int32_t* st = status.data_ptr<int32_t>();
  auto* base = static_cast<unsigned char*>(cache.data_ptr());
  const int64_t row_bytes = c.row_bytes();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t prefix = pl[b], n = al[b];
    const int32_t* path = acc + b * max_accept;
    const int32_t* row_pages = table + b * stride;
    if (prefix < 0) {
      st[b] = kBadPrefixLen;
      continue;
    }
    if (n < 1 || n > max_accept) {
      st[b] = kBadAcceptLen;
      continue;
    }
    bool ok = path[0] == 0;
    for (int64_t k = 1; ok && k < n; ++k) ok = path[k] > path[k - 1];
    if (!ok) {
      st[b] = kBadPath;
      continue;
    }
    auto page_ok = [&](int64_t row) {
      const int64_t e = row / c.page_size;
      return e < stride && row_pages[e] >= 0 && row_pages[e] < c.num_pages;
    };
    for (int64_t k = 1; ok && k < n; ++k) {
      if (path[k] != k) ok = page_ok(prefix + path[k]) && page_ok(prefix + k);
    }
    if (!ok) {
      st[b] = kBadPage;
      continue;
    }
    auto offset = [&](int64_t row) {
      return (int64_t{row_pages[row / c.page_size]} * c.page_size + row % c.page_size) * row_bytes;
    };
    for (int64_t k = 1; k < n; ++k) {
      if (path[k] == k) continue;
      std::memcpy(base + offset(prefix + k), base + offset(prefix + path[k]),
                  static_cast<size_t>(row_bytes));
    }
    new_lens[b] = static_cast<int32_t>(prefix + n);
  }
  return {new_lens, status};
}

// ---- CUDA kernels --------------------------------------------------------------------------

#ifdef TREEMLA_KVPOOL_GPU

// A 64-byte move workspace: the caller's (zeroed once), or a fresh zeroed one.
at::Tensor move_workspace(const std::optional<at::Tensor>& ws, const at::Tensor& ref) {
  if (!ws.has_value())
    return at::zeros({static_cast<int64_t>(cuda::kMoveWorkspaceBytes)},
                     ref.options().dtype(at::kByte));
  check_dtype(*ws, "workspace", {at::kByte});
  check_same_device(*ws, "workspace", ref, "cache");
  check_contiguous(*ws, "workspace");
  TREEMLA_CHECK_VALUE(ws->numel() >= static_cast<int64_t>(cuda::kMoveWorkspaceBytes),
                      "workspace must hold at least ", cuda::kMoveWorkspaceBytes, " bytes, got ",
                      ws->numel());
  return *ws;
}

cudaStream_t stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

void apply_page_moves_cuda(const at::Tensor& cache, const at::Tensor& moves,
                           const at::Tensor& wave_offsets,
                           const std::optional<at::Tensor>& workspace) {
  const kvpool::PoolConfig c = cache_config(cache);
  check_int(moves, "moves", cache, "cache", 2, "[num_moves, 2] (src, dst)");
  check_waves(moves, wave_offsets, cache);
  const c10::cuda::CUDAGuard guard(cache.device());
  const at::Tensor ws = move_workspace(workspace, cache);
  cuda::PageMoveParams p;
  p.cache = cuda::device_cache(c, cache.data_ptr());
  p.moves = reinterpret_cast<const kvpool::PageMove*>(moves.data_ptr<int32_t>());
  p.wave_offsets = wave_offsets.data_ptr<int32_t>();
  p.num_moves = static_cast<int32_t>(moves.size(0));
  p.num_waves = static_cast<int32_t>(wave_offsets.size(0) - 1);
  guarded([&] { cuda::apply_page_moves(p, ws.data_ptr(), stream_of(cache)); });
}

void apply_row_moves_cuda(const at::Tensor& cache, const at::Tensor& moves,
                          const at::Tensor& wave_offsets,
                          const std::optional<at::Tensor>& workspace) {
  const kvpool::PoolConfig c = cache_config(cache);
  check_int(moves, "moves", cache, "cache", 4,
            "[num_moves, 4] (src page, src slot, dst page, dst slot)");
  check_waves(moves, wave_offsets, cache);
  const c10::cuda::CUDAGuard guard(cache.device());
  const at::Tensor ws = move_workspace(workspace, cache);
  cuda::RowMoveParams p;
  p.cache = cuda::device_cache(c, cache.data_ptr());
  p.moves = reinterpret_cast<const kvpool::RowMove*>(moves.data_ptr<int32_t>());
  p.wave_offsets = wave_offsets.data_ptr<int32_t>();
  p.num_moves = static_cast<int32_t>(moves.size(0));
  p.num_waves = static_cast<int32_t>(wave_offsets.size(0) - 1);
  guarded([&] { cuda::apply_row_moves(p, ws.data_ptr(), stream_of(cache)); });
}

void update_page_tables_cuda(const at::Tensor& page_table, const at::Tensor& rows,
                             const at::Tensor& offsets, const at::Tensor& pages, int64_t num_pages,
                             const std::optional<at::Tensor>& workspace) {
  check_table_update(page_table, rows, offsets, pages, num_pages);
  const c10::cuda::CUDAGuard guard(page_table.device());
  const at::Tensor ws = move_workspace(workspace, page_table);
  cuda::PageTableUpdateParams p;
  p.page_table = page_table.data_ptr<int32_t>();
  p.num_rows = static_cast<int32_t>(page_table.size(0));
  p.stride = static_cast<int32_t>(page_table.size(1));
  p.num_pages = static_cast<int32_t>(num_pages);
  p.rows = rows.data_ptr<int32_t>();
  p.offsets = offsets.data_ptr<int32_t>();
  p.pages = pages.data_ptr<int32_t>();
  p.num_updates = static_cast<int32_t>(rows.size(0));
  guarded([&] { cuda::update_page_tables(p, ws.data_ptr(), stream_of(page_table)); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> accept_paths_cuda(
    const at::Tensor& q_indptr, const at::Tensor& parents, const at::Tensor& node_tokens,
    const at::Tensor& target_tokens, int64_t max_accept) {
  check_accept_args(q_indptr, parents, node_tokens, target_tokens, max_accept);
  const c10::cuda::CUDAGuard guard(q_indptr.device());
  const int64_t batch = q_indptr.size(0) - 1;
  const auto opts = q_indptr.options();
  at::Tensor accepted = at::empty({batch, max_accept}, opts), len = at::empty({batch}, opts);
  at::Tensor bonus = at::empty({batch}, opts), status = at::empty({batch}, opts);
  cuda::AcceptParams p;
  p.batch = static_cast<int32_t>(batch);
  p.max_accept = static_cast<int32_t>(max_accept);
  p.q_indptr = q_indptr.data_ptr<int32_t>();
  p.parents = parents.data_ptr<int32_t>();
  p.node_tokens = node_tokens.data_ptr<int32_t>();
  p.target_tokens = target_tokens.data_ptr<int32_t>();
  p.accepted = accepted.data_ptr<int32_t>();
  p.accept_len = len.data_ptr<int32_t>();
  p.bonus_tokens = bonus.data_ptr<int32_t>();
  p.status = status.data_ptr<int32_t>();
  guarded([&] { cuda::accept_paths(p, stream_of(q_indptr)); });
  return {accepted, len, bonus, status};
}

std::tuple<at::Tensor, at::Tensor> commit_accepted_cuda(const at::Tensor& cache,
                                                        const at::Tensor& page_table,
                                                        const at::Tensor& prefix_lens,
                                                        const at::Tensor& accepted,
                                                        const at::Tensor& accept_len) {
  const kvpool::PoolConfig c = cache_config(cache);
  check_commit_args(cache, page_table, prefix_lens, accepted, accept_len);
  const c10::cuda::CUDAGuard guard(cache.device());
  at::Tensor new_lens = at::empty_like(prefix_lens), status = at::empty_like(prefix_lens);
  cuda::CommitParams p;
  p.cache = cuda::device_cache(c, cache.data_ptr());
  p.batch = static_cast<int32_t>(prefix_lens.size(0));
  p.max_accept = static_cast<int32_t>(accepted.size(1));
  p.page_table_stride = static_cast<int32_t>(page_table.size(1));
  p.page_table = page_table.data_ptr<int32_t>();
  p.prefix_lens = prefix_lens.data_ptr<int32_t>();
  p.accepted = accepted.data_ptr<int32_t>();
  p.accept_len = accept_len.data_ptr<int32_t>();
  p.new_seq_lens = new_lens.data_ptr<int32_t>();
  p.status = status.data_ptr<int32_t>();
  guarded([&] { cuda::commit_accepted(p, stream_of(cache)); });
  return {new_lens, status};
}

#else  // no GPU pool module in this build

[[noreturn]] void no_gpu_pool() {
  TREEMLA_THROW(Error,
                "treemla was built without the GPU KV-pool kernels (no CUDA in the build, or "
                "include/treemla/cuda/kvpool.h and its sources were missing); CPU tensors work");
}
void apply_page_moves_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&) {
  no_gpu_pool();
}
void apply_row_moves_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>&) {
  no_gpu_pool();
}
void update_page_tables_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, int64_t, const std::optional<at::Tensor>&) {
  no_gpu_pool();
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> accept_paths_cuda(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t) {
  no_gpu_pool();
}
std::tuple<at::Tensor, at::Tensor> commit_accepted_cuda(const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&) {
  no_gpu_pool();
}

#endif

// ---- the host pool as a Python class ---------------------------------------------------------

at::Tensor int_tensor(const int32_t* data, int64_t n, int64_t cols = 0) {
  at::Tensor t = cols > 0 ? at::empty({n / cols, cols}, at::dtype(at::kInt))
                          : at::empty({n}, at::dtype(at::kInt));
  if (n > 0) std::memcpy(t.data_ptr<int32_t>(), data, static_cast<size_t>(n) * sizeof(int32_t));
  return t;
}
at::Tensor int_tensor(const std::vector<int32_t>& v) {
  return int_tensor(v.data(), static_cast<int64_t>(v.size()));
}

py::dict defrag_dict(const kvpool::DefragPlan& plan) {
  py::dict d;
  d["moves"] = int_tensor(reinterpret_cast<const int32_t*>(plan.moves.data()),
                          2 * static_cast<int64_t>(plan.moves.size()), 2);
  d["wave_offsets"] =
      int_tensor(plan.wave_offsets.empty() ? std::vector<int32_t>{0} : plan.wave_offsets);
  py::list tables;
  for (const auto& u : plan.tables) tables.append(py::make_tuple(u.request, int_tensor(u.pages)));
  d["tables"] = tables;
  d["pages_relocated"] = plan.pages_relocated;
  return d;
}

py::dict commit_dict(const kvpool::CommitPlan& plan) {
  py::dict d;
  d["request"] = plan.request;
  d["num_tokens"] = plan.num_tokens;
  d["moves"] = int_tensor(reinterpret_cast<const int32_t*>(plan.moves.data()),
                          4 * static_cast<int64_t>(plan.moves.size()), 4);
  d["wave_offsets"] =
      int_tensor(plan.wave_offsets.empty() ? std::vector<int32_t>{0} : plan.wave_offsets);
  d["released_pages"] = int_tensor(plan.released_pages);
  return d;
}

kvpool::FreePolicy parse_policy(const std::string& s) {
  if (s == "as_freed") return kvpool::FreePolicy::kAsFreed;
  if (s == "sorted") return kvpool::FreePolicy::kSorted;
  throw py::value_error("policy must be 'as_freed' or 'sorted', got '" + s + "'");
}

}  // namespace

void define_kvpool_ops(torch::Library& m) {
  m.def(
      "apply_page_moves(Tensor(a!) cache, Tensor moves, Tensor wave_offsets, Tensor(b!)? "
      "workspace=None) -> ()");
  m.def(
      "apply_row_moves(Tensor(a!) cache, Tensor moves, Tensor wave_offsets, Tensor(b!)? "
      "workspace=None) -> ()");
  m.def(
      "update_page_tables(Tensor(a!) page_table, Tensor rows, Tensor offsets, Tensor pages, int "
      "num_pages, "
      "Tensor(b!)? workspace=None) -> ()");
  m.def(
      "accept_paths(Tensor q_indptr, Tensor parents, Tensor node_tokens, Tensor target_tokens, int "
      "max_accept) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "commit_accepted(Tensor(a!) cache, Tensor page_table, Tensor prefix_lens, Tensor accepted, "
      "Tensor accept_len) -> (Tensor, Tensor)");
}

void define_kvpool_python(py::module& m) {
#ifdef TREEMLA_KVPOOL_GPU
  m.def("with_cuda_kvpool", [] { return true; });
  m.def("move_workspace_bytes", [] { return static_cast<int64_t>(cuda::kMoveWorkspaceBytes); });
  m.def("check_move_status", [](const at::Tensor& ws) {
    TREEMLA_CHECK_VALUE(ws.is_cuda() && ws.scalar_type() == at::kByte && ws.is_contiguous() &&
                            ws.numel() >= static_cast<int64_t>(cuda::kMoveWorkspaceBytes),
                        "workspace must be a contiguous uint8 CUDA tensor of at least ",
                        cuda::kMoveWorkspaceBytes, " bytes");
    const c10::cuda::CUDAGuard guard(ws.device());
    guarded([&] { cuda::check_move_status(ws.data_ptr(), stream_of(ws)); });
  });
#else
  m.def("with_cuda_kvpool", [] { return false; });
  m.def("move_workspace_bytes", [] { return int64_t{64}; });
  m.def("check_move_status", [](const at::Tensor&) { no_gpu_pool(); });
#endif
  using kvpool::KvPool;
  py::class_<KvPool>(m, "KvPool")
      .def(py::init([](int64_t num_pages, int64_t page_size, int64_t row_width, int64_t elem_size,
                       const std::string& policy) {
             kvpool::PoolConfig c{to_int32(num_pages, "num_pages"),
                                  to_int32(page_size, "page_size"),
                                  to_int32(row_width, "row_width"),
                                  to_int32(elem_size, "elem_size"), parse_policy(policy)};
             return guarded([&] { return std::make_unique<KvPool>(c); });
           }),
           py::arg("num_pages"), py::arg("page_size"), py::arg("row_width") = 576,
           py::arg("elem_size") = 2, py::arg("policy") = "as_freed")
      .def_property_readonly("num_pages", [](const KvPool& p) { return p.config().num_pages; })
      .def_property_readonly("page_size", [](const KvPool& p) { return p.config().page_size; })
      .def_property_readonly("row_width", [](const KvPool& p) { return p.config().row_width; })
      .def_property_readonly("elem_size", [](const KvPool& p) { return p.config().elem_size; })
      .def_property_readonly(
          "policy", [](const KvPool& p) { return kvpool::free_policy_name(p.config().policy); })
      .def(
          "pages_for",
          [](const KvPool& p, int64_t n) { return guarded([&] { return p.pages_for(n); }); },
          py::arg("num_tokens"))
      .def(
          "alloc", [](KvPool& p, int64_t r, int64_t n) { guarded([&] { p.alloc(r, n); }); },
          py::arg("request"), py::arg("num_tokens"))
      .def(
          "extend", [](KvPool& p, int64_t r, int64_t n) { guarded([&] { p.extend(r, n); }); },
          py::arg("request"), py::arg("num_tokens"))
      .def(
          "truncate", [](KvPool& p, int64_t r, int64_t n) { guarded([&] { p.truncate(r, n); }); },
          py::arg("request"), py::arg("num_tokens"))
      .def(
          "free", [](KvPool& p, int64_t r) { guarded([&] { p.free(r); }); }, py::arg("request"))
      .def("__contains__", &KvPool::contains)
      .def(
          "num_tokens",
          [](const KvPool& p, int64_t r) { return guarded([&] { return p.num_tokens(r); }); },
          py::arg("request"))
      .def(
          "pages",
          [](const KvPool& p, int64_t r) {
            return int_tensor(guarded([&] { return p.pages(r); }));
          },
          py::arg("request"))
      .def("request_ids", &KvPool::request_ids)
      .def_property_readonly("num_free_pages", &KvPool::num_free_pages)
      .def_property_readonly("num_used_pages", &KvPool::num_used_pages)
      .def("free_list", [](const KvPool& p) { return int_tensor(p.free_list()); })
      .def(
          "locate",
          [](const KvPool& p, int64_t r, int64_t row) {
            const kvpool::RowSlot s = guarded([&] { return p.locate(r, row); });
            return py::make_tuple(s.page, s.slot);
          },
          py::arg("request"), py::arg("row"))
      .def(
          "page_table_row",
          [](const KvPool& p, int64_t r, int64_t stride, int32_t pad) {
            return int_tensor(guarded([&] { return p.page_table_row(r, stride, pad); }));
          },
          py::arg("request"), py::arg("stride"), py::arg("pad") = 0)
      .def(
          "runs", [](const KvPool& p, int64_t r) { return guarded([&] { return p.runs(r); }); },
          py::arg("request"))
      .def("metrics",
           [](const KvPool& p) {
             const kvpool::PoolMetrics x = p.metrics();
             py::dict d;
             d["num_requests"] = x.num_requests;
             d["pages_used"] = x.pages_used;
             d["pages_free"] = x.pages_free;
             d["total_runs"] = x.total_runs;
             d["mean_run_length"] = x.mean_run_length;
             d["largest_free_run"] = x.largest_free_run;
             d["fraction_contiguous"] = x.fraction_contiguous;
             return d;
           })
      .def("plan_defrag",
           [](const KvPool& p) { return defrag_dict(guarded([&] { return p.plan_defrag(); })); })
      .def("defrag", [](KvPool& p) { return defrag_dict(guarded([&] { return p.defrag(); })); })
      .def("plan_partial_defrag",
           [](const KvPool& p, int64_t k) {
             return defrag_dict(guarded([&] { return p.plan_partial_defrag(k); }));
           })
      .def("partial_defrag",
           [](KvPool& p, int64_t k) {
             return defrag_dict(guarded([&] { return p.partial_defrag(k); }));
           })
      .def("commit_accepted",
           [](KvPool& p, int64_t r, int64_t prefix_len, const at::Tensor& accepted) {
             check_cpu(accepted, "accepted");
             check_dtype(accepted, "accepted", {at::kInt});
             TREEMLA_CHECK_VALUE(accepted.dim() == 1, "accepted must be 1-D, got shape ",
                                 shape_str(accepted));
             const at::Tensor a = accepted.contiguous();
             // A path from the root is strictly increasing (parents come before their children),
             // which is what the device commit requires; the C++ pool also takes other orders with
             // a[k] >= k.
             const int32_t* path = a.data_ptr<int32_t>();
             for (int64_t k = 1; k < a.numel(); ++k) {
               TREEMLA_CHECK_RUNTIME(path[k] > path[k - 1],
                                     "treemla: accepted must be strictly increasing (a path from "
                                     "the root), got accepted[",
                                     k, "] = ", path[k], " after accepted[", k - 1,
                                     "] = ", path[k - 1]);
             }
             return commit_dict(guarded([&] {
               return p.commit_accepted(r, prefix_len,
                                        {a.data_ptr<int32_t>(), static_cast<size_t>(a.numel())});
             }));
           })
      .def("check_invariants", [](const KvPool& p) { guarded([&] { p.check_invariants(); }); });
}

}  // namespace treemla::binding

TORCH_LIBRARY_IMPL(treemla, CPU, m) {
  m.impl("apply_page_moves", &treemla::binding::apply_page_moves_cpu);
  m.impl("apply_row_moves", &treemla::binding::apply_row_moves_cpu);
  m.impl("update_page_tables", &treemla::binding::update_page_tables_cpu);
  m.impl("accept_paths", &treemla::binding::accept_paths_cpu);
  m.impl("commit_accepted", &treemla::binding::commit_accepted_cpu);
}

TORCH_LIBRARY_IMPL(treemla, CUDA, m) {
  m.impl("apply_page_moves", &treemla::binding::apply_page_moves_cuda);
  m.impl("apply_row_moves", &treemla::binding::apply_row_moves_cuda);
  m.impl("update_page_tables", &treemla::binding::update_page_tables_cuda);
  m.impl("accept_paths", &treemla::binding::accept_paths_cuda);
  m.impl("commit_accepted", &treemla::binding::commit_accepted_cuda);
}
