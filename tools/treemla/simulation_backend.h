// treemla simulate: where the KV bytes live and where verify attention runs.
//
// The serving loop (simulation.h) keeps all bookkeeping on the host: the KvPool, the draft trees,
// acceptance. Everything that touches cache bytes or runs attention goes through SimBackend, so
// a GPU backend (device memory, kernels, plans applied on a stream) plugs in without changing the
// loop. The CPU backend below is the reference: a host buffer and the CPU attention code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
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

class SimBackend {
 public:
  virtual ~SimBackend() = default;
  virtual const char* name() const = 0;

  // Writes rows.size() / row_width rows (bf16, contiguous) to the given cache slots.
  virtual void write_rows(std::span<const kvpool::RowSlot> slots, std::span<const uint16_t> rows) = 0;
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
};

// The reference backend: a host buffer of bf16 latent rows, [num_pages, page_size, row_width].
class CpuBackend final : public SimBackend {
 public:
  explicit CpuBackend(const kvpool::PoolConfig& config)
      : config_(config), cache_(static_cast<size_t>(config.num_pages) * config.page_size * config.row_width, 0) {}

  const char* name() const override { return "cpu"; }

  void write_rows(std::span<const kvpool::RowSlot> slots, std::span<const uint16_t> rows) override {
    const size_t w = static_cast<size_t>(config_.row_width);
    for (size_t i = 0; i < slots.size(); ++i) {
      std::copy(rows.begin() + i * w, rows.begin() + (i + 1) * w, row_ptr(slots[i]));
    }
  }

  std::vector<uint64_t> hash_rows(std::span<const kvpool::RowSlot> slots) override {
    std::vector<uint64_t> out(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) out[i] = hash_row(row_ptr(slots[i]), config_.row_width);
    return out;
  }

  void apply_commit(const kvpool::CommitPlan& plan) override { kvpool::apply_plan(config_, plan, cache_.data()); }
  void apply_defrag(const kvpool::DefragPlan& plan) override { kvpool::apply_plan(config_, plan, cache_.data()); }

  void verify(VerifyParams p, float* o, float* lse) override {
    p.kv_cache = cache_.data();
    p.part = VerifyPart::kAll;
    cpu::verify_split(p, o, lse);
  }
  void verify_reference(VerifyParams p, float* o, float* lse) override {
    p.kv_cache = cache_.data();
    p.part = VerifyPart::kAll;
    cpu::verify_full(p, o, lse);
  }

 private:
  uint16_t* row_ptr(kvpool::RowSlot s) {
    return cache_.data() + (static_cast<size_t>(s.page) * config_.page_size + s.slot) * config_.row_width;
  }

  kvpool::PoolConfig config_;
  std::vector<uint16_t> cache_;
};

// "cpu" is the only backend so far. A GPU backend goes here (behind TREEMLA_WITH_CUDA) once it
// exists; until then "cuda" is refused like a bad option value.
inline void check_device(const std::string& device) {
  if (device == "cpu") return;
  if (device == "cuda") {
    throw std::invalid_argument("--device = 'cuda' is not available in this build; use --device cpu");
  }
  throw std::invalid_argument("--device = '" + device + "' must be cpu or cuda");
}

inline std::unique_ptr<SimBackend> make_backend(const std::string& device, const kvpool::PoolConfig& config) {
  check_device(device);
  return std::make_unique<CpuBackend>(config);
}

}  // namespace treemla::tool
