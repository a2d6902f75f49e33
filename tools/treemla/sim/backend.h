// treemla_sim: where the KV bytes live and where verify attention runs (public header).
//
// The serving loop (simulation.h) keeps all bookkeeping on the host: the KvPool, the draft trees,
// acceptance. Everything that touches cache bytes or runs attention goes through SimBackend, so
// a GPU backend (device memory, kernels, plans applied on a stream) plugs in without changing the
// loop. The CPU backend below is the reference: a host buffer and the CPU attention code
// (cpu_backend.cpp). The CUDA backend (cuda_backend.cpp, CUDA builds) also accepts and commits
// on the device and times the prefix pass, through the optional hooks below (defaults: "not
// supported").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "treemla/attention.h"
#include "treemla/kvpool.h"

namespace treemla::tool {

// 64-bit FNV-1a over the elements of one latent row. The data checks compare these instead of
// whole rows, so a device backend only has to ship hashes (or rows) back to the host.
inline uint64_t hash_row(const uint16_t* row, int width) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < width; ++i) {
    h ^= row[i];
    h *= 0x100000001b3ull;
  }
  return h ^ (h >> 29);
}

// Bounds for comparing verify() with verify_reference(), per element:
// |got - ref| <= atol + rtol * |ref| (NaN fails).
struct VerifyTolerance {
  double o_atol = 1e-3, o_rtol = 0.0;
  double lse_atol = 1e-3, lse_rtol = 0.0;
};

// The largest calls the loop will make, so that a device backend can size its verify plan once.
struct BackendLimits {
  int max_batch = 1;
  int64_t max_total_q = 1;
  int num_heads = 1;
};

// The device's acceptance and commit of one verified batch (SimBackend::device_commit).
struct DeviceCommitResult {
  int max_accept = 0;
  std::vector<int32_t>
      accepted;  // [batch, max_accept]: local node indices, root first; -1 past the path
  std::vector<int32_t> accept_len;    // [batch]
  std::vector<int32_t> bonus_tokens;  // [batch]: target token at the last accepted node
  std::vector<int32_t> new_seq_lens;  // [batch]: the request's length after the device commit
};

// A timed prefix pass: the median and fastest of `runs` runs, and the outputs of the last one.
struct PrefixTiming {
  double median_ms = 0.0, min_ms = 0.0;
  int runs = 0;
  std::vector<float> o, lse;  // [total_q, H, 512], [total_q, H]
};

class SimBackend {
 public:
  virtual ~SimBackend() = default;
  virtual const char* name() const = 0;

  // Writes rows.size() / row_width rows (bf16, contiguous) to the given cache slots.
  virtual void write_rows(std::span<const kvpool::RowSlot> slots,
                          std::span<const uint16_t> rows) = 0;
  // hash_row of each slot's row as the cache holds it now.
  virtual std::vector<uint64_t> hash_rows(std::span<const kvpool::RowSlot> slots) = 0;

  // Plans from the KvPool, applied before anything else is written to the cache (kvpool.h).
  virtual void apply_commit(const kvpool::CommitPlan& plan) = 0;
  virtual void apply_defrag(const kvpool::DefragPlan& plan) = 0;

  // Verify attention (VerifyPart::kAll). Every pointer in p is a host array except kv_cache,
  // which the backend fills in with its own cache. o: [total_q, H, 512], lse: [total_q, H], host.
  virtual void verify(VerifyParams p, float* o, float* lse) = 0;
  // The specification (cpu::verify_full) on the same inputs, for cross-checks of verify().
  virtual void verify_reference(VerifyParams p, float* o, float* lse) = 0;
  // How closely verify() must match verify_reference(). The CPU split design and the reference
  // both accumulate in double and round once to float, so they agree to 1e-3 absolute.
  virtual VerifyTolerance tolerance() const { return {}; }

  // ---- optional device hooks ----
  // Acceptance and commit on the device, for the batch of the last verify() (its q_indptr,
  // prefix lengths and page table are still in device memory; nothing may be written in
  // between): accept_paths from the per-node tokens, then commit_accepted (way (2) of
  // treemla/cuda/kvpool.h). parents (request-local), node_tokens and target_tokens are host
  // arrays aligned with the batch's tree nodes. The caller then updates the KvPool bookkeeping
  // with the returned paths WITHOUT applying the CommitPlan: the device already moved the rows.
  // Returns false (and does nothing) when the backend commits through apply_commit only.
  virtual bool device_commit(std::span<const int32_t> /*parents*/,
                             std::span<const int32_t> /*node_tokens*/,
                             std::span<const int32_t> /*target_tokens*/, int /*max_accept*/,
                             DeviceCommitResult& /*out*/) {
    return false;
  }
  // Device time in ms of the kernels of the last verify(), device_commit(), apply_commit() or
  // apply_defrag() (CUDA events; transfers excluded). Negative when the backend has no device.
  virtual double last_gpu_ms() const { return -1.0; }
  // The prefix pass alone (VerifyPart::kPrefix) of the batch p (host arrays, as for verify()),
  // timed `reps` times. Returns false when the backend cannot time it (the CPU backend).
  virtual bool time_prefix_pass(VerifyParams /*p*/, int /*reps*/, PrefixTiming& /*out*/) {
    return false;
  }
  // The same with each request's prefix rows copied into a fresh cache of page_size rows per
  // page, every request one contiguous ascending run (p's page table says where the rows are).
  virtual bool time_prefix_pass_contiguous(VerifyParams /*p*/, int /*page_size*/, int /*reps*/,
                                           PrefixTiming& /*out*/) {
    return false;
  }

  // verify() and verify_reference() call `f` with the fraction of their work done as they go
  // (the CPU backend after each piece of a long call; a backend may never call it). Empty: none.
  void set_work_callback(std::function<void(double)> f) { work_callback_ = std::move(f); }

 protected:
  void report_work(double fraction) const {
    if (work_callback_) work_callback_(fraction);
  }

 private:
  std::function<void(double)> work_callback_;
};

// The reference backend: a host buffer of bf16 latent rows, [num_pages, page_size, row_width].
// A verify call of more than `piece_flops` runs in pieces of about that much work, one request
// or a group of its heads at a time, so that the loop can show progress; every (row, head) is
// computed on its own, so the pieces give the same bits as one call.
class CpuBackend final : public SimBackend {
 public:
  static constexpr double kPieceFlops = 2e9;  // about a quarter of a second on one core

  explicit CpuBackend(const kvpool::PoolConfig& config, double piece_flops = kPieceFlops);

  const char* name() const override { return "cpu"; }
  void write_rows(std::span<const kvpool::RowSlot> slots, std::span<const uint16_t> rows) override;
  std::vector<uint64_t> hash_rows(std::span<const kvpool::RowSlot> slots) override;
  void apply_commit(const kvpool::CommitPlan& plan) override;
  void apply_defrag(const kvpool::DefragPlan& plan) override;
  void verify(VerifyParams p, float* o, float* lse) override;
  void verify_reference(VerifyParams p, float* o, float* lse) override;

 private:
  using VerifyFn = void (*)(const VerifyParams&, float*, float*);
  void in_pieces(VerifyFn fn, VerifyParams p, float* o, float* lse);
  uint16_t* row_ptr(kvpool::RowSlot s);

  kvpool::PoolConfig config_;
  double piece_flops_;
  std::vector<uint16_t> cache_;
};

// Option check only (no device is touched): cpu always; cuda in a CUDA build. Throws
// std::invalid_argument naming --device.
void check_device(const std::string& device);

// For cuda: throws std::runtime_error (exit 1 in the tool, unlike a bad option) when no GPU is
// visible. Nothing to do for cpu.
void require_device(const std::string& device);

// The backend of a device: CpuBackend, or in a CUDA build with a GPU the CUDA backend.
std::unique_ptr<SimBackend> make_backend(const std::string& device,
                                         const kvpool::PoolConfig& config,
                                         const BackendLimits& limits = {});

#ifdef TREEMLA_WITH_CUDA
// The CUDA backend (cuda_backend.cpp): the cache in device memory, every operation on the GPU.
// make_backend("cuda") calls it.
std::unique_ptr<SimBackend> make_cuda_backend(const kvpool::PoolConfig& config,
                                              const BackendLimits& limits);
#endif

// Builds a backend for a loop (SimulationHooks::backend); tests use their own.
using BackendFactory = std::unique_ptr<SimBackend> (*)(const kvpool::PoolConfig&,
                                                       const BackendLimits&);

}  // namespace treemla::tool
