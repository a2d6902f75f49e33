// treemla GPU tests: device copies of a VerifyCase, a runner, and result readback.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/verify_case.h"
#include "cuda/common/check.h"
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
  explicit DeviceBuffer(size_t n) : count(n) { TREEMLA_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
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

  DeviceCase(const VerifyCase& c, size_t q_bytes_cap = 0, size_t kv_bytes_cap = 0, int num_pages_cap_ = 0,
             int stride_cap_ = 0, int total_q_cap = 0)
      : num_pages_cap(std::max(num_pages_cap_, c.num_pages)),
        stride_cap(std::max(stride_cap_, c.page_table_stride)),
        words_cap(c.mask_words),
        q(std::max(q_bytes_cap, c.q.size())),
        kv(std::max(kv_bytes_cap, c.kv_cache.size())),
        page_table(size_t(c.batch) * std::max(stride_cap_, c.page_table_stride)),
        prefix_lens(c.batch),
        q_indptr(c.batch + 1),
        mask(size_t(std::max(total_q_cap, c.total_q)) * c.mask_words),
        o(size_t(std::max(total_q_cap, c.total_q)) * c.num_heads * kHeadDimV * dtype_size(c.spec.dtype)),
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
      std::memcpy(&pt[size_t(b) * stride_cap], &c.page_table[size_t(b) * c.page_table_stride], c.page_table_stride * 4);
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

// Every family and tile configuration the device must run: the 99 KB configurations always
// (they are what ships for sm_120), the large ones where the device has the shared memory, the
// cluster family on compute capability 9.0 and newer. make_verify_plan throws (and the test
// fails) if one of them cannot run, so nothing is dropped silently.
inline std::vector<GpuConfig> configs_to_test() {
  int dev = 0, major = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  std::vector<cuda::KernelFamily> families{cuda::KernelFamily::kCpAsync};
  if (major >= 9) families.push_back(cuda::KernelFamily::kCluster);
  std::vector<GpuConfig> out;
  for (cuda::KernelFamily f : families) {
    out.push_back({f, cuda::TileConfig::kSmem99K});
    if (optin >= 150000) out.push_back({f, cuda::TileConfig::kSmemLarge});
  }
  return out;
}

inline GpuResult run_gpu(DeviceCase& d, const VerifyCase& c, const GpuConfig& cfg, VerifyPart part) {
  d.p.part = part;
  cuda::VerifyLimits lim{c.batch, std::max(1, c.total_q), c.num_heads};
  const cuda::VerifyPlan plan = cuda::make_verify_plan(lim, -1, cfg.tile, cfg.family);
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

struct CpuResult {
  std::vector<float> o, lse;
};

inline CpuResult run_reference(const VerifyCase& c, VerifyPart part) {
  CpuResult r;
  r.o.assign(c.o_elems(), 0.f);
  r.lse.assign(c.lse_elems(), 0.f);
  cpu::verify_full(c.params(part), r.o.data(), r.lse.data());
  return r;
}

// ||a - b|| / ||b|| over finite reference entries.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - b[i];
    num += d * d;
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Tolerances: O is rounded to the input dtype and P is rounded to it before P V, so the error
// scales with the dtype's unit roundoff (bf16 2^-8, fp16 2^-11). The LSE is accumulated in fp32.
inline Tolerance o_tolerance(DType t) { return t == DType::kBF16 ? Tolerance{6e-3, 2e-2} : Tolerance{1e-3, 4e-3}; }
inline double o_rel_l2_bound(DType t) { return t == DType::kBF16 ? 1e-2 : 2e-3; }
inline Tolerance lse_tolerance() { return Tolerance{2e-3, 2e-4}; }

inline ::testing::AssertionResult matches(const GpuResult& g, const CpuResult& r, const VerifyCase& c) {
  const std::vector<int64_t> oshape{c.total_q, c.num_heads, kHeadDimV};
  const std::vector<int64_t> lshape{c.total_q, c.num_heads};
  auto lr = all_close(g.lse, r.lse, lse_tolerance(), "lse", lshape);
  if (!lr) return lr << "\n  case: " << c.describe();
  auto orr = all_close(g.o, r.o, o_tolerance(c.spec.dtype), "o", oshape);
  if (!orr) return orr << "\n  case: " << c.describe();
  const double e = rel_l2(g.o, r.o);
  if (e > o_rel_l2_bound(c.spec.dtype))
    return ::testing::AssertionFailure() << "o relative L2 error " << e << " > " << o_rel_l2_bound(c.spec.dtype)
                                         << "\n  case: " << c.describe();
  return ::testing::AssertionSuccess();
}


}  // namespace treemla::test
