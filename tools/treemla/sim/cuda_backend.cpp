// treemla_sim: the CUDA backend of the serving loop (simulation.h), for --device cuda.
//
// The bytes live in a device cache of bf16 latent rows, [num_pages, page_size, 576]; every
// operation of SimBackend runs there: rows are scattered and hashed by small kernels
// (cuda/tool_kernels.h), plans are applied with the library's kernels (treemla/cuda/kvpool.h),
// verify attention is cuda::verify_attention, and acceptance + commit run on the device
// (device_commit, way (2) of treemla/cuda/kvpool.h). Buffers are device memory that grows as
// needed and is kept, so rounds in steady state allocate nothing; everything runs on one stream.
// GPU times come from CUDA events around the kernels alone (uploads and downloads excluded).
// Host C++20, like the loop; the kernels are C++17 in cuda/sim_kernels.cu.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "cuda/tool_kernels.h"
#include "sim/backend.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/kvpool.h"
#include "treemla/cuda/verify.h"

namespace treemla::tool {

namespace {

// Device memory that only grows. reserve() synchronizes the stream before it frees a block,
// since work still queued may read it; the old contents are dropped.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);  // no throwing from a destructor; a failure here changes nothing
  }

  void* reserve(size_t bytes, cudaStream_t stream) {
    if (bytes <= cap_ && ptr_) return ptr_;
    const size_t want = std::max<size_t>({bytes, cap_ + cap_ / 2, 256});
    if (ptr_) {
      TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
      TREEMLA_CUDA_CHECK(cudaFree(ptr_));
      ptr_ = nullptr;
      cap_ = 0;
    }
    TREEMLA_CUDA_CHECK(cudaMalloc(&ptr_, want));
    cap_ = want;
    return ptr_;
  }
  // reserve, then an asynchronous copy of host data (a pageable source is consumed before the
  // call returns, so the caller may reuse it at once).
  template <class T>
  T* upload(const T* src, size_t count, cudaStream_t stream) {
    T* dst = static_cast<T*>(reserve(count * sizeof(T), stream));
    if (count)
      TREEMLA_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    return dst;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

template <class T>
void download(T* dst, const void* src, size_t count, cudaStream_t stream) {
  if (count)
    TREEMLA_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
}

// A pair of events on the stream; ms() waits for the second.
class EventTimer {
 public:
  EventTimer() {
    TREEMLA_CUDA_CHECK(cudaEventCreate(&e0_));
    const cudaError_t e = cudaEventCreate(&e1_);
    if (e != cudaSuccess) cudaEventDestroy(e0_);
    TREEMLA_CUDA_CHECK(e);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  void start(cudaStream_t s) { TREEMLA_CUDA_CHECK(cudaEventRecord(e0_, s)); }
  void stop(cudaStream_t s) { TREEMLA_CUDA_CHECK(cudaEventRecord(e1_, s)); }
  double ms() {
    TREEMLA_CUDA_CHECK(cudaEventSynchronize(e1_));
    float t = 0.f;
    TREEMLA_CUDA_CHECK(cudaEventElapsedTime(&t, e0_, e1_));
    return t;
  }

 private:
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

class Stream {
 public:
  Stream() { TREEMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaBackend final : public SimBackend {
 public:
  CudaBackend(const kvpool::PoolConfig& config, const BackendLimits& limits) : config_(config) {
    TREEMLA_CHECK(config.elem_size == 2 && config.row_width == kHeadDimQK,
                  "the CUDA backend holds bf16 rows of "
                      << kHeadDimQK << " elements (got row_width " << config.row_width
                      << ", elem_size " << config.elem_size << ")");
    const size_t bytes =
        static_cast<size_t>(config.num_pages) * static_cast<size_t>(config.page_bytes());
    cache_.reserve(bytes, stream());
    // Rows are hashed and checked only after they were written, but a defined start makes a
    // run reproducible even if a kernel ever read an unwritten row.
    TREEMLA_CUDA_CHECK(cudaMemsetAsync(cache_.as<void>(), 0, bytes, stream()));
    move_ws_.reserve(cuda::kMoveWorkspaceBytes, stream());
    TREEMLA_CUDA_CHECK(
        cudaMemsetAsync(move_ws_.as<void>(), 0, cuda::kMoveWorkspaceBytes, stream()));
    ensure_plan(std::max(limits.max_batch, 1), std::max<int64_t>(limits.max_total_q, 1),
                std::max(limits.num_heads, 1));
    TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream());  // queued work may still use the buffers freed below
  }

  const char* name() const override { return "cuda"; }

  void write_rows(std::span<const kvpool::RowSlot> slots, std::span<const uint16_t> rows) override {
    TREEMLA_CHECK(rows.size() == slots.size() * static_cast<size_t>(config_.row_width),
                  "write_rows: " << rows.size() << " elements for " << slots.size() << " rows");
    if (slots.empty()) return;
    check_slots(slots);
    verified_ = false;
    const int32_t* d_slots =
        slots_.upload(reinterpret_cast<const int32_t*>(slots.data()), 2 * slots.size(), stream());
    const uint16_t* d_rows = staging_.upload(rows.data(), rows.size(), stream());
    kernels::scatter_rows(cache(), config_.page_size, config_.row_bytes(), d_slots, d_rows,
                          static_cast<int64_t>(slots.size()), stream());
    // The next write reuses the staging buffer; uploads are ordered after this kernel on the
    // stream, so no synchronization is needed here.
  }

  // Hashed on the device: a full re-read of 128k-token requests ships 8 bytes per row back,
  // not the rows (the kernel computes exactly hash_row).
  std::vector<uint64_t> hash_rows(std::span<const kvpool::RowSlot> slots) override {
    std::vector<uint64_t> out(slots.size());
    if (slots.empty()) return out;
    check_slots(slots);
    const int32_t* d_slots =
        slots_.upload(reinterpret_cast<const int32_t*>(slots.data()), 2 * slots.size(), stream());
    auto* d_out =
        static_cast<uint64_t*>(hashes_.reserve(slots.size() * sizeof(uint64_t), stream()));
    kernels::hash_rows(cache(), config_.page_size, config_.row_bytes(), d_slots,
                       static_cast<int64_t>(slots.size()), d_out, stream());
    download(out.data(), d_out, out.size(), stream());
    sync();
    return out;
  }

  // Host-planned commit (way (1)); the loop uses device_commit instead, this keeps the
  // interface complete.
  void apply_commit(const kvpool::CommitPlan& plan) override {
    apply_moves<cuda::RowMoveParams>(plan.moves, plan.wave_offsets, cuda::apply_row_moves);
  }

  // The page moves of a defrag, all waves in one launch. The page tables need no device update:
  // the loop uploads every request's page list from the host bookkeeping before each verify.
  void apply_defrag(const kvpool::DefragPlan& plan) override {
    apply_moves<cuda::PageMoveParams>(plan.moves, plan.wave_offsets, cuda::apply_page_moves);
  }

  // Uploads a plan's moves and waves, applies them in one launch, times it and checks status.
  template <class Params, class Move, class Apply>
  void apply_moves(const std::vector<Move>& moves, const std::vector<int32_t>& wave_offsets,
                   Apply apply) {
    verified_ = false;
    last_ms_ = 0.0;
    if (moves.empty()) return;
    Params p;
    p.cache = cuda::device_cache(config_, cache());
    p.moves = moves_.upload(moves.data(), moves.size(), stream());
    p.wave_offsets = waves_.upload(wave_offsets.data(), wave_offsets.size(), stream());
    p.num_moves = static_cast<int32_t>(moves.size());
    p.num_waves = static_cast<int32_t>(wave_offsets.size()) - 1;
    timer_.start(stream());
    apply(p, move_ws_.as<void>(), stream());
    timer_.stop(stream());
    cuda::check_move_status(move_ws_.as<void>(), stream());
    last_ms_ = timer_.ms();
  }

  void verify(VerifyParams p, float* o, float* lse) override {
    const int64_t total_q = p.q_indptr[p.batch];
    VerifyParams d = upload_batch(p);
    d.part = VerifyPart::kAll;
    void* d_o = o_.reserve(static_cast<size_t>(total_q) * p.num_heads * kHeadDimV * 2, stream());
    auto* d_lse =
        static_cast<float*>(lse_.reserve(static_cast<size_t>(total_q) * p.num_heads * 4, stream()));
    timer_.start(stream());
    cuda::verify_attention(d, plan_, ws_.as<void>(), d_o, d_lse, stream());
    timer_.stop(stream());
    download_outputs(total_q * p.num_heads, d_o, d_lse, o, lse);
    cuda::check_status(plan_, ws_.as<void>(),
                       stream());  // synchronizes; throws on a device-side check
    last_ms_ = timer_.ms();
    // device_commit reads this batch's lengths and page table where verify left them.
    verified_ = true;
    batch_ = p.batch;
    total_q_ = total_q;
    stride_ = p.page_table_stride;
  }

  // cpu::verify_full on a host copy of only the pages this batch reads (gathered on the device),
  // so the copy is the size of the batch's rows, not of the cache.
  void verify_reference(VerifyParams p, float* o, float* lse) override {
    const int64_t stride = p.page_table_stride;
    std::vector<int32_t> table(p.page_table, p.page_table + p.batch * stride);
    std::vector<int32_t> pages;  // compact index -> cache page
    std::unordered_map<int32_t, int32_t> compact;
    for (int b = 0; b < p.batch; ++b) {
      const int64_t rows = int64_t{p.prefix_lens[b]} + p.q_indptr[b + 1] - p.q_indptr[b];
      const int64_t used = (rows + config_.page_size - 1) / config_.page_size;
      for (int64_t k = 0; k < stride; ++k) {
        int32_t& e = table[static_cast<size_t>(b * stride + k)];
        if (k >= used) {
          e = 0;  // never read; any index inside the copy keeps cpu::validate content
          continue;
        }
        TREEMLA_CHECK(e >= 0 && e < config_.num_pages,
                      "verify_reference: page " << e << " outside the cache");
        const auto [it, fresh] = compact.emplace(e, static_cast<int32_t>(pages.size()));
        if (fresh) pages.push_back(e);
        e = it->second;
      }
    }
    if (pages.empty()) pages.push_back(0);
    const int32_t* d_pages = pages_.upload(pages.data(), pages.size(), stream());
    const size_t bytes = pages.size() * static_cast<size_t>(config_.page_bytes());
    void* d_copy = staging_.reserve(bytes, stream());
    kernels::gather_pages(cache(), config_.page_bytes(), d_pages,
                          static_cast<int64_t>(pages.size()), d_copy, stream());
    std::vector<uint16_t> host(bytes / 2);
    download(host.data(), d_copy, host.size(), stream());
    sync();
    p.kv_cache = host.data();
    p.num_pages = static_cast<int>(pages.size());
    p.page_table = table.data();
    p.part = VerifyPart::kAll;
    cpu::verify_full(p, o, lse);
  }

  // The GPU rounds o to bf16 (the CPU keeps float) and accumulates in fp32 with bf16
  // probabilities, so the bounds are those of the GPU tests (tests/cuda/gpu_case.h).
  VerifyTolerance tolerance() const override { return {6e-3, 2e-2, 2e-3, 2e-4}; }

  bool device_commit(std::span<const int32_t> parents, std::span<const int32_t> node_tokens,
                     std::span<const int32_t> target_tokens, int max_accept,
                     DeviceCommitResult& out) override {
    TREEMLA_CHECK(
        verified_,
        "device_commit must follow verify() of the same batch, with nothing written in between");
    TREEMLA_CHECK(static_cast<int64_t>(parents.size()) == total_q_ &&
                      node_tokens.size() == parents.size() &&
                      target_tokens.size() == parents.size(),
                  "device_commit: " << parents.size() << " parents, " << node_tokens.size()
                                    << " node tokens, " << target_tokens.size()
                                    << " target tokens for " << total_q_ << " tree nodes");
    verified_ = false;
    const size_t B = static_cast<size_t>(batch_);
    const size_t acc_n = B * static_cast<size_t>(max_accept);
    cuda::AcceptParams ap;
    ap.batch = batch_;
    ap.max_accept = max_accept;
    ap.q_indptr = indptr_.as<int32_t>();
    ap.parents = parents_.upload(parents.data(), parents.size(), stream());
    ap.node_tokens = tokens_.upload(node_tokens.data(), node_tokens.size(), stream());
    ap.target_tokens = targets_.upload(target_tokens.data(), target_tokens.size(), stream());
    // One block for the outputs: accepted [B, max_accept], then accept_len, bonus, new lengths,
    // and the two status arrays, B each.
    auto* outs =
        static_cast<int32_t*>(commit_out_.reserve((acc_n + 5 * B) * sizeof(int32_t), stream()));
    ap.accepted = outs;
    ap.accept_len = outs + acc_n;
    ap.bonus_tokens = outs + acc_n + B;
    ap.status = outs + acc_n + 3 * B;
    cuda::CommitParams cp;
    cp.cache = cuda::device_cache(config_, cache());
    cp.batch = batch_;
    cp.max_accept = max_accept;
    cp.page_table_stride = stride_;
    cp.page_table = table_.as<int32_t>();
    cp.prefix_lens = prefix_.as<int32_t>();
    cp.accepted = ap.accepted;
    cp.accept_len = ap.accept_len;
    cp.new_seq_lens = outs + acc_n + 2 * B;
    cp.status = outs + acc_n + 4 * B;
    timer_.start(stream());
    cuda::accept_paths(ap, stream());
    cuda::commit_accepted(cp, stream());
    timer_.stop(stream());
    std::vector<int32_t> host(acc_n + 5 * B);
    download(host.data(), outs, host.size(), stream());
    sync();
    last_ms_ = timer_.ms();
    for (size_t b = 0; b < B; ++b) {
      const auto accept_status = static_cast<cuda::KvStatus>(host[acc_n + 3 * B + b]);
      const auto commit_status = static_cast<cuda::KvStatus>(host[acc_n + 4 * B + b]);
      TREEMLA_CHECK(accept_status == cuda::KvStatus::kOk && commit_status == cuda::KvStatus::kOk,
                    "device acceptance/commit of request "
                        << b << " of the batch failed: accept_paths says '"
                        << cuda::kv_status_name(accept_status) << "', commit_accepted says '"
                        << cuda::kv_status_name(commit_status) << "'");
    }
    out.max_accept = max_accept;
    out.accepted.assign(host.begin(), host.begin() + acc_n);
    out.accept_len.assign(host.begin() + acc_n, host.begin() + acc_n + B);
    out.bonus_tokens.assign(host.begin() + acc_n + B, host.begin() + acc_n + 2 * B);
    out.new_seq_lens.assign(host.begin() + acc_n + 2 * B, host.begin() + acc_n + 3 * B);
    return true;
  }

  double last_gpu_ms() const override { return last_ms_; }

  bool time_prefix_pass(VerifyParams p, int reps, PrefixTiming& out) override {
    VerifyParams d = upload_batch(p);
    verified_ = false;
    time_prefix(d, p.q_indptr[p.batch], reps, out);
    return true;
  }

  // Copies each request's prefix rows into a fresh cache of `page_size` rows per page, request
  // after request (so every request is one contiguous, ascending run of pages), and times the
  // prefix pass there. The fresh cache lives only for this call.
  bool time_prefix_pass_contiguous(VerifyParams p, int page_size, int reps,
                                   PrefixTiming& out) override {
    VerifyParams d = upload_batch(p);  // q, lengths, mask; the source page table
    verified_ = false;
    std::vector<int32_t> rows(static_cast<size_t>(p.batch)),
        base(static_cast<size_t>(p.batch) + 1, 0);
    int64_t max_rows = 0, stride = 1;
    for (int b = 0; b < p.batch; ++b) {
      rows[b] = p.prefix_lens[b];
      max_rows = std::max<int64_t>(max_rows, rows[b]);
      const int64_t need =
          (int64_t{p.prefix_lens[b]} + p.q_indptr[b + 1] - p.q_indptr[b] + page_size - 1) /
          page_size;
      stride = std::max(stride, need);
      base[b + 1] = base[b] + static_cast<int32_t>(need);
    }
    std::vector<int32_t> table(static_cast<size_t>(p.batch * stride));
    for (int b = 0; b < p.batch; ++b) {
      for (int64_t k = 0; k < stride; ++k)  // past a request's pages: its first page, never read
        table[static_cast<size_t>(b * stride + k)] =
            base[b] + static_cast<int32_t>(k < base[b + 1] - base[b] ? k : 0);
    }
    const int32_t num_pages = std::max(base[p.batch], 1);
    const size_t bytes =
        static_cast<size_t>(num_pages) * page_size * static_cast<size_t>(config_.row_bytes());
    DeviceBuffer fresh, fresh_table, d_rows;
    void* fresh_cache = fresh.reserve(bytes, stream());
    TREEMLA_CUDA_CHECK(cudaMemsetAsync(fresh_cache, 0, bytes, stream()));
    const int32_t* dt = fresh_table.upload(table.data(), table.size(), stream());
    kernels::relayout_rows(cache(), config_.page_size, d.page_table, d.page_table_stride,
                           fresh_cache, page_size, dt, static_cast<int32_t>(stride),
                           d_rows.upload(rows.data(), rows.size(), stream()), p.batch, max_rows,
                           config_.row_bytes(), stream());
    d.kv_cache = fresh_cache;
    d.page_size = page_size;
    d.num_pages = num_pages;
    d.page_table = dt;
    d.page_table_stride = static_cast<int>(stride);
    time_prefix(d, p.q_indptr[p.batch], reps, out);
    return true;  // fresh buffers are freed on return, after time_prefix synchronized
  }

 private:
  cudaStream_t stream() const { return stream_.get(); }
  void* cache() const { return cache_.as<void>(); }
  void sync() { TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream())); }

  void check_slots(std::span<const kvpool::RowSlot> slots) const {
    for (const kvpool::RowSlot& s : slots) {
      TREEMLA_CHECK(
          s.page >= 0 && s.page < config_.num_pages && s.slot >= 0 && s.slot < config_.page_size,
          "row slot (" << s.page << ", " << s.slot << ") is outside the cache ("
                       << config_.num_pages << " pages of " << config_.page_size << " rows)");
    }
  }

  // A verify plan covering the batch; remade (and its workspace grown) only when a call needs
  // more than the plan allows, which with the loop's limits happens at most once.
  void ensure_plan(int batch, int64_t total_q, int heads) {
    if (have_plan_ && batch <= plan_.limits.max_batch && total_q <= plan_.limits.max_total_q &&
        heads == plan_.limits.num_heads)
      return;
    cuda::VerifyLimits lim;
    lim.max_batch = have_plan_ ? std::max(batch, plan_.limits.max_batch) : batch;
    lim.max_total_q = have_plan_ && heads == plan_.limits.num_heads
                          ? std::max(total_q, plan_.limits.max_total_q)
                          : total_q;
    lim.num_heads = heads;
    plan_ = cuda::make_verify_plan(lim);
    have_plan_ = true;
    ws_.reserve(plan_.workspace_bytes, stream());
    TREEMLA_CUDA_CHECK(cudaMemsetAsync(ws_.as<void>(), 0, plan_.workspace_bytes, stream()));
  }

  // Uploads the host arrays of p; returns p with device pointers (the backend's cache).
  VerifyParams upload_batch(const VerifyParams& p) {
    TREEMLA_CHECK(p.dtype == DType::kBF16, "the CUDA backend runs bf16");
    TREEMLA_CHECK(p.page_size == config_.page_size && p.num_pages == config_.num_pages,
                  "verify params describe another cache (page_size "
                      << p.page_size << ", num_pages " << p.num_pages << ")");
    const int64_t total_q = p.q_indptr[p.batch];
    ensure_plan(p.batch, total_q, p.num_heads);
    VerifyParams d = p;
    const auto* q = static_cast<const uint16_t*>(p.q);
    d.q = q_.upload(q, static_cast<size_t>(total_q) * p.num_heads * kHeadDimQK, stream());
    d.kv_cache = cache();
    d.page_table =
        table_.upload(p.page_table, static_cast<size_t>(p.batch) * p.page_table_stride, stream());
    d.prefix_lens = prefix_.upload(p.prefix_lens, static_cast<size_t>(p.batch), stream());
    d.q_indptr = indptr_.upload(p.q_indptr, static_cast<size_t>(p.batch) + 1, stream());
    d.tree_mask = mask_.upload(p.tree_mask, static_cast<size_t>(total_q) * p.mask_words, stream());
    return d;
  }

  // o (bf16 on the device) and lse to host floats; synchronizes.
  void download_outputs(int64_t rows, const void* d_o, const float* d_lse, float* o, float* lse) {
    o_host_.resize(static_cast<size_t>(rows) * kHeadDimV);
    download(o_host_.data(), d_o, o_host_.size(), stream());
    download(lse, d_lse, static_cast<size_t>(rows), stream());
    sync();
    for (size_t i = 0; i < o_host_.size(); ++i) o[i] = bf16_to_float(o_host_[i]);
  }

  // Median of `reps` timed runs of the prefix pass after 3 untimed ones; the schedule depends
  // only on the lengths, so it runs once (as treemla bench does).
  void time_prefix(VerifyParams d, int64_t total_q, int reps, PrefixTiming& out) {
    d.part = VerifyPart::kPrefix;
    const int64_t rows = total_q * d.num_heads;
    void* d_o = o_.reserve(static_cast<size_t>(rows) * kHeadDimV * 2, stream());
    auto* d_lse = static_cast<float*>(lse_.reserve(static_cast<size_t>(rows) * 4, stream()));
    cuda::verify_schedule(d, plan_, ws_.as<void>(), stream());
    for (int i = 0; i < 3; ++i) cuda::verify_run(d, plan_, ws_.as<void>(), d_o, d_lse, stream());
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      timer_.start(stream());
      cuda::verify_run(d, plan_, ws_.as<void>(), d_o, d_lse, stream());
      timer_.stop(stream());
      t.push_back(timer_.ms());
    }
    cuda::check_status(plan_, ws_.as<void>(), stream());
    out.o.resize(static_cast<size_t>(rows) * kHeadDimV);
    out.lse.resize(static_cast<size_t>(rows));
    download_outputs(rows, d_o, d_lse, out.o.data(), out.lse.data());
    std::sort(t.begin(), t.end());
    out.runs = reps;
    out.median_ms = t.empty() ? 0.0 : t[t.size() / 2];
    out.min_ms = t.empty() ? 0.0 : t.front();
  }

  kvpool::PoolConfig config_;
  Stream stream_;  // declared before the buffers, so destroyed after them
  EventTimer timer_;
  DeviceBuffer cache_, move_ws_, ws_;
  // Per-call uploads and outputs, reused round after round.
  DeviceBuffer slots_, staging_, hashes_, moves_, waves_, pages_;
  DeviceBuffer q_, table_, prefix_, indptr_, mask_, o_, lse_;
  DeviceBuffer parents_, tokens_, targets_, commit_out_;
  std::vector<uint16_t> o_host_;
  cuda::VerifyPlan plan_;
  bool have_plan_ = false;
  bool verified_ = false;  // the device holds the lengths and page table of the last verify
  int batch_ = 0, stride_ = 0;
  int64_t total_q_ = 0;
  double last_ms_ = -1.0;
};

}  // namespace

std::unique_ptr<SimBackend> make_cuda_backend(const kvpool::PoolConfig& config,
                                              const BackendLimits& limits) {
  return std::make_unique<CudaBackend>(config, limits);
}

}  // namespace treemla::tool
