// treemla_sim: the reference backend (a host cache and the CPU attention code) and the choice of
// backend by device.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/backend.h"

#ifdef TREEMLA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace treemla::tool {

CpuBackend::CpuBackend(const kvpool::PoolConfig& config, double piece_flops)
    : config_(config),
      piece_flops_(piece_flops),
      cache_(static_cast<size_t>(config.num_pages) * config.page_size * config.row_width, 0) {}

void CpuBackend::write_rows(std::span<const kvpool::RowSlot> slots,
                            std::span<const uint16_t> rows) {
  const size_t w = static_cast<size_t>(config_.row_width);
  for (size_t i = 0; i < slots.size(); ++i)
    std::copy(rows.begin() + i * w, rows.begin() + (i + 1) * w, row_ptr(slots[i]));
}

std::vector<uint64_t> CpuBackend::hash_rows(std::span<const kvpool::RowSlot> slots) {
  std::vector<uint64_t> out(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) out[i] = hash_row(row_ptr(slots[i]), config_.row_width);
  return out;
}

void CpuBackend::apply_commit(const kvpool::CommitPlan& plan) {
  kvpool::apply_plan(config_, plan, cache_.data());
}
void CpuBackend::apply_defrag(const kvpool::DefragPlan& plan) {
  kvpool::apply_plan(config_, plan, cache_.data());
}

void CpuBackend::verify(VerifyParams p, float* o, float* lse) {
  in_pieces(cpu::verify_split, p, o, lse);
}
void CpuBackend::verify_reference(VerifyParams p, float* o, float* lse) {
  in_pieces(cpu::verify_full, p, o, lse);
}

// fn on p (all parts), in pieces of about piece_flops_ (see the class comment).
void CpuBackend::in_pieces(VerifyFn fn, VerifyParams p, float* o, float* lse) {
  p.kv_cache = cache_.data();
  p.part = VerifyPart::kAll;
  const int H = p.num_heads;
  // Work of one head of request b: every node against the prefix and (at most) the tree.
  auto head_flops = [&](int b) {
    const int64_t q_len = p.q_indptr[b + 1] - p.q_indptr[b];
    return 2.0 * double(q_len) * double(int64_t{p.prefix_lens[b]} + q_len) *
           (kHeadDimQK + kHeadDimV);
  };
  double total = 0;
  for (int b = 0; b < p.batch; ++b) total += head_flops(b) * H;
  if (total <= piece_flops_) {
    fn(p, o, lse);
    report_work(1.0);
    return;
  }
  double done = 0;
  std::vector<uint16_t> q;
  std::vector<float> piece_o, piece_lse;
  for (int b = 0; b < p.batch; ++b) {
    const int32_t q0 = p.q_indptr[b], q_len = p.q_indptr[b + 1] - q0;
    if (q_len == 0) continue;
    const int32_t indptr[2] = {0, q_len};
    VerifyParams s = p;
    s.batch = 1;
    s.page_table = p.page_table + static_cast<int64_t>(b) * p.page_table_stride;
    s.prefix_lens = p.prefix_lens + b;
    s.q_indptr = indptr;
    s.tree_mask = p.tree_mask + static_cast<int64_t>(q0) * p.mask_words;
    const int group = static_cast<int>(std::clamp(piece_flops_ / head_flops(b), 1.0, double(H)));
    for (int h0 = 0; h0 < H; h0 += group) {
      const int hn = std::min(group, H - h0);
      s.num_heads = hn;
      // Rows of q, o and lse are (node, head) pairs: a group of heads is gathered and scattered.
      const auto* src = static_cast<const uint16_t*>(p.q);  // bf16 or fp16: two bytes
      q.resize(static_cast<size_t>(q_len) * hn * kHeadDimQK);
      piece_o.resize(static_cast<size_t>(q_len) * hn * kHeadDimV);
      piece_lse.resize(static_cast<size_t>(q_len) * hn);
      for (int32_t i = 0; i < q_len; ++i) {
        const uint16_t* row = src + (static_cast<int64_t>(q0 + i) * H + h0) * kHeadDimQK;
        std::copy(row, row + static_cast<int64_t>(hn) * kHeadDimQK,
                  q.data() + static_cast<size_t>(i) * hn * kHeadDimQK);
      }
      s.q = q.data();
      fn(s, piece_o.data(), piece_lse.data());
      for (int32_t i = 0; i < q_len; ++i) {
        const int64_t row = static_cast<int64_t>(q0 + i) * H + h0;
        std::copy_n(piece_o.data() + static_cast<size_t>(i) * hn * kHeadDimV,
                    static_cast<int64_t>(hn) * kHeadDimV, o + row * kHeadDimV);
        std::copy_n(piece_lse.data() + static_cast<size_t>(i) * hn, hn, lse + row);
      }
      done += head_flops(b) * hn;
      report_work(done / total);
    }
  }
}

uint16_t* CpuBackend::row_ptr(kvpool::RowSlot s) {
  return cache_.data() +
         (static_cast<size_t>(s.page) * config_.page_size + s.slot) * config_.row_width;
}

void check_device(const std::string& device) {
  if (device == "cpu") return;
  if (device == "cuda") {
#ifdef TREEMLA_WITH_CUDA
    return;
#else
    throw std::invalid_argument(
        "--device: 'cuda' is not available in this build; use --device cpu");
#endif
  }
  throw std::invalid_argument("--device: '" + device + "' must be cpu or cuda");
}

void require_device(const std::string& device) {
  check_device(device);
#ifdef TREEMLA_WITH_CUDA
  if (device != "cuda") return;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    const std::string why = e != cudaSuccess
                                ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)
                                : std::string("0 devices");
    throw std::runtime_error("--device cuda: no CUDA device is visible (cudaGetDeviceCount: " +
                             why + "); use --device cpu");
  }
#endif
}

std::unique_ptr<SimBackend> make_backend(const std::string& device,
                                         const kvpool::PoolConfig& config,
                                         const BackendLimits& limits) {
  require_device(device);
#ifdef TREEMLA_WITH_CUDA
  if (device == "cuda") return make_cuda_backend(config, limits);
#endif
  (void)limits;
  return std::make_unique<CpuBackend>(config);
}

}  // namespace treemla::tool
