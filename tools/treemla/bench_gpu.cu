// treemla bench: verify attention on the GPU over a grid of shapes, each reported against two
// ceilings measured in the same run: HBM read bandwidth (a streaming read kernel) and the bf16
// mma.sync m16n8k16 peak (a register-only microbenchmark; the only tensor instruction sm_120
// has). Inputs are random, pages are scattered, and several copies of each workload are
// rotated so that the L2 cache does not serve repeated runs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "cuda/common/check.h"
#include "cuda/common/mma.cuh"
#include "gpu_timing.h"
#include "options.h"
#include "treemla/cuda/verify.h"

namespace treemla::tool {

namespace {

using treemla::cuda::KernelFamily;
using treemla::cuda::TileConfig;

// ---- ceilings ----------------------------------------------------------------------------

__global__ void hbm_read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = i + k * stride < n ? __ldcs(src + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (acc == 0x12345679u) sink[0] = acc;  // keeps the loads alive
}

__global__ void mma_peak_kernel(int iters, float* sink) {
  constexpr int kAcc = 8;
  float acc[kAcc][4];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const uint32_t x = threadIdx.x * 2654435761u;
  uint32_t a[4] = {x & 0x3f803f80u, (x >> 1) & 0x3f803f80u, (x >> 2) & 0x3f803f80u, (x >> 3) & 0x3f803f80u};
  const uint32_t b0 = (x >> 4) & 0x3f803f80u, b1 = (x >> 5) & 0x3f803f80u;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) treemla::cuda::mma_16816<__nv_bfloat16>(acc[i], a, b0, b1);
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  if (s == 1.2345f) sink[0] = s;
}

// The decode access pattern without the attention: every prefix row of a workload read once
// through its page table, each request's rows cut into near-equal splits (one per CTA), 32-row
// blocks, 8 threads per row and nine 16-byte loads each, kUnroll blocks in flight per thread.
// Run with many CTAs per SM it measures what the pages allow (the decode ceiling); with the
// verify kernel's grid (one 8-warp CTA per SM) what that occupancy allows with plain loads.
template <int kUnroll>
__global__ void paged_read_kernel(const uint4* __restrict__ kv, const int32_t* __restrict__ page_table,
                                  int stride, int batch, int rows, int page_size, int splits, uint32_t* sink) {
  constexpr int kRowVecs = treemla::kHeadDimQK * 2 / 16;  // 72 x 16 B per row
  const int sub = threadIdx.x & 7, r = threadIdx.x >> 3;
  const int blocks = (rows + 31) / 32;
  uint32_t acc = 0;
  for (int item = blockIdx.x; item < batch * splits; item += gridDim.x) {
    const int b = item / splits, s = item % splits;
    const int b0 = static_cast<int>(static_cast<int64_t>(s) * blocks / splits);
    const int b1 = static_cast<int>(static_cast<int64_t>(s + 1) * blocks / splits);
#pragma unroll kUnroll
    for (int blk = b0; blk < b1; ++blk) {
      const int t = blk * 32 + r;
      if (t < rows) {
        const int page = __ldg(page_table + static_cast<int64_t>(b) * stride + t / page_size);
        const uint4* src = kv + (static_cast<int64_t>(page) * page_size + t % page_size) * kRowVecs + sub;
        uint4 v[9];
#pragma unroll
        for (int i = 0; i < 9; ++i) v[i] = __ldcs(src + 8 * i);
#pragma unroll
        for (int i = 0; i < 9; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
      }
    }
  }
  if (acc == 0x12345679u) sink[0] = acc;  // keeps the loads alive
}

double measure_hbm_gbps(size_t bytes) {
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&buf, bytes));
  TREEMLA_CUDA_CHECK(cudaMalloc(&sink, 4));
  TREEMLA_CUDA_CHECK(cudaMemset(buf, 0x5a, bytes));
  int sms = 0;
  TREEMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t n = bytes / 16;
  const double ms = median_ms(0, [&](int) {
    hbm_read_kernel<<<sms * 8, 512>>>(static_cast<const uint4*>(buf), n, sink);
  }, 3, 15);
  TREEMLA_CHECK_LAUNCH("hbm_read_kernel");
  TREEMLA_CUDA_CHECK(cudaFree(buf));
  TREEMLA_CUDA_CHECK(cudaFree(sink));
  return bytes / (ms * 1e-3) / 1e9;
}

double measure_mma_tflops() {
  float* sink = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&sink, 4));
  int sms = 0;
  TREEMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * 4, threads = 256, iters = 4096;
  const double ms = median_ms(0, [&](int) { mma_peak_kernel<<<blocks, threads>>>(iters, sink); }, 3, 15);
  TREEMLA_CHECK_LAUNCH("mma_peak_kernel");
  TREEMLA_CUDA_CHECK(cudaFree(sink));
  const double flops = double(blocks) * (threads / 32) * iters * 8 * (2.0 * 16 * 8 * 16);
  return flops / (ms * 1e-3) / 1e12;
}

// ---- workloads ---------------------------------------------------------------------------

__global__ void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale);
  }
}

struct Case {
  int batch, heads, q_len, prefix, page_size;
  TileConfig tile;
  KernelFamily family;
};

struct Workload {  // one copy of a case's inputs and outputs on the device
  void *q = nullptr, *kv = nullptr, *o = nullptr;
  int32_t *pt = nullptr, *prefix = nullptr, *indptr = nullptr;
  uint64_t* mask = nullptr;
  float* lse = nullptr;
  treemla::VerifyParams p;
  size_t kv_bytes = 0;
};

// DDTree-like random tree mask: parent[i] uniform in [max(0, i - 8), i), depth-limited by chance.
std::vector<uint64_t> random_tree_mask(int q_len, int words, std::mt19937& rng) {
  std::vector<uint64_t> m(static_cast<size_t>(q_len) * words, 0);
  for (int i = 0; i < q_len; ++i) {
    if (i > 0) {
      std::uniform_int_distribution<int> d(std::max(0, i - 8), i - 1);
      const int par = d(rng);
      for (int w = 0; w < words; ++w) m[size_t(i) * words + w] = m[size_t(par) * words + w];
    }
    m[size_t(i) * words + i / 64] |= uint64_t{1} << (i % 64);
  }
  return m;
}

Workload make_workload(const Case& c, uint32_t seed) {
  Workload w;
  std::mt19937 rng(seed);
  const int total_q = c.batch * c.q_len;
  const int rows_per_req = c.prefix + c.q_len;
  const int pages_per_req = (rows_per_req + c.page_size - 1) / c.page_size;
  const int num_pages = pages_per_req * c.batch;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // pages scattered in any order
  const int words = (c.q_len + 63) / 64;
  std::vector<int32_t> prefix(c.batch, c.prefix), indptr(c.batch + 1);
  for (int b = 0; b <= c.batch; ++b) indptr[b] = b * c.q_len;
  std::vector<uint64_t> mask;
  for (int b = 0; b < c.batch; ++b) {
    auto m = random_tree_mask(c.q_len, words, rng);
    mask.insert(mask.end(), m.begin(), m.end());
  }
  const size_t q_elems = size_t(total_q) * c.heads * treemla::kHeadDimQK;
  w.kv_bytes = size_t(num_pages) * c.page_size * treemla::kHeadDimQK * 2;
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.q, q_elems * 2));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.kv, w.kv_bytes));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.o, size_t(total_q) * c.heads * treemla::kHeadDimV * 2));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.lse, size_t(total_q) * c.heads * 4));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.pt, perm.size() * 4));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.prefix, c.batch * 4));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.indptr, (c.batch + 1) * 4));
  TREEMLA_CUDA_CHECK(cudaMalloc(&w.mask, mask.size() * 8));
  fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(w.q), q_elems, seed * 7 + 1, 1.0f);
  fill_random_bf16<<<4096, 256>>>(static_cast<__nv_bfloat16*>(w.kv), w.kv_bytes / 2, seed * 7 + 2, 1.0f);
  TREEMLA_CHECK_LAUNCH("fill_random_bf16");
  TREEMLA_CUDA_CHECK(cudaMemcpy(w.pt, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  TREEMLA_CUDA_CHECK(cudaMemcpy(w.prefix, prefix.data(), c.batch * 4, cudaMemcpyHostToDevice));
  TREEMLA_CUDA_CHECK(cudaMemcpy(w.indptr, indptr.data(), (c.batch + 1) * 4, cudaMemcpyHostToDevice));
  TREEMLA_CUDA_CHECK(cudaMemcpy(w.mask, mask.data(), mask.size() * 8, cudaMemcpyHostToDevice));
  treemla::VerifyParams& p = w.p;
  p.dtype = treemla::DType::kBF16;
  p.batch = c.batch;
  p.num_heads = c.heads;
  p.page_size = c.page_size;
  p.num_pages = num_pages;
  p.page_table_stride = pages_per_req;
  p.mask_words = words;
  p.sm_scale = 1.0f / std::sqrt(576.0f);
  p.q = w.q;
  p.kv_cache = w.kv;
  p.page_table = w.pt;
  p.prefix_lens = w.prefix;
  p.q_indptr = w.indptr;
  p.tree_mask = w.mask;
  return w;
}

void free_workload(Workload& w) {
  for (void* ptr : {w.q, w.kv, w.o, static_cast<void*>(w.pt), static_cast<void*>(w.prefix),
                    static_cast<void*>(w.indptr), static_cast<void*>(w.mask), static_cast<void*>(w.lse)}) {
    cudaFree(ptr);
  }
}

struct Result {
  Case c;
  double us_all = 0, us_prefix = 0, us_tail = 0;
  double tflops = 0, gbps = 0, frac_mma = 0, frac_hbm = 0;
  double paged_read_gbps = 0;       // q_len = 1 cases: the same pages read at full occupancy
  double paged_read_1cta_gbps = 0;  // ... and by one 8-warp CTA per SM, as the verify grid
};

Result run_case(const Case& c, size_t l2_bytes, int reps) {
  // Enough copies that one rotation touches more than 3x the L2.
  Workload first = make_workload(c, 1);
  const int copies = static_cast<int>(std::min<size_t>(8, std::max<size_t>(1, 3 * l2_bytes / first.kv_bytes + 1)));
  std::vector<Workload> ws{first};
  for (int i = 1; i < copies; ++i) ws.push_back(make_workload(c, 1 + i));
  treemla::cuda::VerifyLimits lim{c.batch, int64_t(c.batch) * c.q_len, c.heads};
  const auto plan = treemla::cuda::make_verify_plan(lim, -1, c.tile, c.family);
  void* wsp = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&wsp, plan.workspace_bytes));
  treemla::cuda::init_workspace(plan, wsp, 0);
  Result r;
  r.c = c;
  cudaStream_t stream;
  TREEMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto time_part = [&](treemla::VerifyPart part) {
    for (auto& w : ws) w.p.part = part;
    // The schedule depends only on the lengths, which every copy shares: plan once, run many,
    // as an engine does per layer. The calls are captured back to back in one CUDA graph (one
    // per copy, rotating) and the graph is replayed: the median replay over the calls in it.
    treemla::cuda::verify_schedule(ws[0].p, plan, wsp, stream);
    const int calls = std::max(copies, 4);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TREEMLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) {
      Workload& w = ws[i % copies];
      treemla::cuda::verify_run(w.p, plan, wsp, w.o, w.lse, stream);
    }
    TREEMLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    TREEMLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms = median_ms(stream, [&](int) { TREEMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 3, reps);
    TREEMLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TREEMLA_CUDA_CHECK(cudaGraphDestroy(graph));
    treemla::cuda::check_status(plan, wsp, stream);
    return ms * 1e3 / calls;
  };
  if (c.q_len == 1 && c.prefix > 0) {
    const int sms = plan.num_ctas;
    const int pblocks = (c.prefix + 31) / 32;
    uint32_t* sink = nullptr;
    TREEMLA_CUDA_CHECK(cudaMalloc(&sink, 4));
    auto paged_gbps = [&](int ctas, bool one_per_sm) {
      // Splits as the schedule makes them for q_len = 1 (one row tile per request), for `ctas`.
      const int splits = std::max(1, std::min(ctas / c.batch, pblocks / 8));
      // One CTA per SM needs blocks in flight per thread; many CTAs need few registers.
      const auto kernel = one_per_sm ? paged_read_kernel<4> : paged_read_kernel<1>;
      const double ms = median_ms(0, [&](int i) {
        const Workload& w = ws[i % copies];
        kernel<<<ctas, 256>>>(static_cast<const uint4*>(w.kv), w.pt, w.p.page_table_stride, c.batch, c.prefix,
                              c.page_size, splits, sink);
      }, 3, reps);
      TREEMLA_CHECK_LAUNCH("paged_read_kernel");
      return double(c.batch) * c.prefix * treemla::kHeadDimQK * 2 / (ms * 1e-3) / 1e9;
    };
    r.paged_read_gbps = paged_gbps(sms * 8, false);
    r.paged_read_1cta_gbps = paged_gbps(sms, true);
    TREEMLA_CUDA_CHECK(cudaFree(sink));
  }
  r.us_all = time_part(treemla::VerifyPart::kAll);
  r.us_prefix = time_part(treemla::VerifyPart::kPrefix);
  r.us_tail = time_part(treemla::VerifyPart::kTail);
  const double rows = double(c.batch) * c.q_len * c.heads;
  const double flops = 2.0 * rows * c.prefix * (treemla::kHeadDimQK + treemla::kHeadDimV);
  const double bytes = double(c.batch) * c.prefix * treemla::kHeadDimQK * 2;
  r.tflops = flops / (r.us_all * 1e-6) / 1e12;
  r.gbps = bytes / (r.us_all * 1e-6) / 1e9;
  TREEMLA_CUDA_CHECK(cudaStreamDestroy(stream));
  TREEMLA_CUDA_CHECK(cudaFree(wsp));
  for (auto& w : ws) free_workload(w);
  return r;
}

std::string git_commit() {
#ifdef TREEMLA_GIT_COMMIT
  return TREEMLA_GIT_COMMIT;
#else
  return "unknown";
#endif
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Options opt("bench",
              "Times verify attention (prefix + tail + merge) on the GPU over a grid of shapes, with\n"
              "HBM read bandwidth and the bf16 mma.sync peak measured in the same run. Each listed\n"
              "shape runs with every tile configuration that fits the device.");
  opt.add("cases", "default",
          "'default' for the standard grid, or semicolon-separated batch:heads:q_len:prefix:page_size");
  opt.add("tiles", "all", "tile configurations: all, smem99k, smem-large");
  opt.add("families", "all", "kernel families: all (every family the device runs), cpasync, cluster");
  opt.add("reps", "20", "timed repetitions per measurement (median reported)");
  opt.add("json", "", "write results as JSON to this file");
  opt.add("commit", git_commit(), "commit recorded in the JSON");
  bool ok = true;
  if (!opt.parse(argc, argv, 2, ok)) return ok ? 0 : 2;
  const int reps = static_cast<int>(opt.integer("reps", 3, 1000));

  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::cerr << "treemla bench: no CUDA device is visible; the benchmark needs a GPU\n";
    return 1;
  }
  cudaDeviceProp prop{};
  TREEMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, mem_clock_khz = 0, runtime = 0, driver = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);

  std::vector<Case> shapes;
  const std::string cs = opt.str("cases");
  if (cs == "default") {
    shapes = {
        // compute-bound: H x q_len >= 256
        {1, 16, 16, 131072, 64, {}}, {1, 8, 65, 131072, 64, {}},  {1, 8, 65, 185000, 64, {}},
        {1, 128, 64, 131072, 64, {}}, {8, 128, 16, 131072, 64, {}}, {1, 16, 65, 32768, 64, {}},
        {1, 8, 65, 32768, 64, {}}, {4, 16, 257, 16384, 64, {}},
        // memory-bound: q_len = 1
        {8, 16, 1, 131072, 64, {}}, {8, 8, 1, 131072, 64, {}}, {32, 16, 1, 32768, 64, {}},
        // page_size 1, pages scattered, against the same case at 64 above
        {1, 8, 65, 131072, 1, {}},
        // the fixed cost of a call: nothing to attend but each node's own row
        {1, 8, 1, 0, 64, {}},
    };
  } else {
    std::stringstream ss(cs);
    std::string item;
    while (std::getline(ss, item, ';')) {
      Case c{};
      if (std::sscanf(item.c_str(), "%d:%d:%d:%d:%d", &c.batch, &c.heads, &c.q_len, &c.prefix, &c.page_size) != 5 ||
          c.batch < 1 || c.heads < 1 || c.heads > 128 || c.q_len < 1 || c.q_len > 1025 || c.prefix < 0 ||
          c.page_size < 1 || (c.page_size & (c.page_size - 1))) {
        throw std::invalid_argument("--cases entry '" + item +
                                    "' must be batch:heads:q_len:prefix:page_size with heads in [1,128], "
                                    "q_len in [1,1025], prefix >= 0, page_size a power of two");
      }
      shapes.push_back(c);
    }
  }
  std::vector<TileConfig> tiles;
  const std::string ts = opt.str("tiles");
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  if (ts == "all" || ts == "smem-large") {
    if (optin >= 150000) tiles.push_back(TileConfig::kSmemLarge);
  }
  if (ts == "all" || ts == "smem99k") tiles.push_back(TileConfig::kSmem99K);
  if (ts != "all" && ts != "smem99k" && ts != "smem-large")
    throw std::invalid_argument("--tiles = '" + ts + "' must be all, smem99k or smem-large");
  if (tiles.empty()) throw std::invalid_argument("--tiles = '" + ts + "' does not fit this device");
  std::vector<KernelFamily> families;
  const std::string fs = opt.str("families");
  if (fs != "all" && fs != "cpasync" && fs != "cluster")
    throw std::invalid_argument("--families = '" + fs + "' must be all, cpasync or cluster");
  if (fs == "all" || fs == "cpasync") families.push_back(KernelFamily::kCpAsync);
  if ((fs == "all" && prop.major >= 9) || fs == "cluster") families.push_back(KernelFamily::kCluster);

  const double hbm = measure_hbm_gbps(size_t(4) << 30);
  const double mma = measure_mma_tflops();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::printf("# treemla bench  gpu: %s (sm_%d%d, %d SMs, %.0f MHz SM, %.0f MHz mem)  cuda runtime %d driver %d\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, clock_khz / 1e3,
              mem_clock_khz / 1e3, runtime, driver);
  std::printf("# date %s  commit %s  reps %d (median)\n", date, opt.str("commit").c_str(), reps);
  std::printf("# ceilings measured now: HBM read %.0f GB/s, bf16 mma.sync m16n8k16 %.1f TFLOP/s\n", hbm, mma);
  std::printf("# us = prefix + tail + merge; prefix-only and tail-only are the same kernels on one part\n");
  std::printf("%-8s %-10s %5s %4s %5s %7s %5s | %9s %9s %9s | %8s %6s | %8s %6s\n", "family", "tile", "batch", "H", "q_len",
              "prefix", "page", "us", "us_pref", "us_tail", "TFLOP/s", "%mma", "KV GB/s", "%hbm");

  std::vector<Result> results;
  for (const Case& shape : shapes) {
    for (KernelFamily f : families) {
      for (TileConfig t : tiles) {
        Case c = shape;
        c.tile = t;
        c.family = f;
        Result r = run_case(c, prop.l2CacheSize, reps);
        r.frac_mma = r.tflops / mma;
        r.frac_hbm = r.gbps / hbm;
        std::printf("%-8s %-10s %5d %4d %5d %7d %5d | %9.1f %9.1f %9.1f | %8.1f %5.1f%% | %8.0f %5.1f%%\n",
                    treemla::cuda::kernel_family_name(f), treemla::cuda::tile_config_name(t), c.batch, c.heads,
                    c.q_len, c.prefix, c.page_size, r.us_all, r.us_prefix, r.us_tail, r.tflops, 100 * r.frac_mma,
                    r.gbps, 100 * r.frac_hbm);
        std::fflush(stdout);
        results.push_back(r);
      }
    }
  }
  // The design targets, read off the rows above (no new measurement).
  std::printf("\n# targets (H200 figures in docs/benchmarks.md)\n");
  for (const Result& r : results) {
    const Case& c = r.c;
    const std::string tname = std::string(treemla::cuda::kernel_family_name(c.family)) + "/" +
                              treemla::cuda::tile_config_name(c.tile);
    const char* tn = tname.c_str();
    if (c.heads * c.q_len >= 256 && c.prefix >= 16384)
      std::printf("compute-bound  %-18s B=%d H=%d q=%d L=%d: %.1f%% of mma.sync peak (target >= 60%%)\n", tn,
                  c.batch, c.heads, c.q_len, c.prefix, 100 * r.frac_mma);
    if (c.q_len == 1 && c.heads >= 8 && c.heads <= 16 && c.prefix >= 32768)
      std::printf("memory-bound   %-18s B=%d H=%d q=1 L=%d: %.1f%% of HBM read (target >= 90%%); the same pages "
                  "read by a plain copy: %.1f%% of HBM at full occupancy, %.1f%% with one 8-warp CTA per SM\n",
                  tn, c.batch, c.heads, c.prefix, 100 * r.frac_hbm, 100 * r.paged_read_gbps * r.frac_hbm / r.gbps,
                  100 * r.paged_read_1cta_gbps * r.frac_hbm / r.gbps);
    if (c.prefix == 32768 && c.q_len == 65)
      std::printf("tail + merge   %-18s B=%d H=%d q=65 L=32768: fused tail adds %.1f%% over prefix only; "
                  "tail alone %.1f%% of the whole (target <= 10%%)\n",
                  tn, c.batch, c.heads, 100 * std::max(0.0, r.us_all - r.us_prefix) / r.us_all,
                  100 * r.us_tail / r.us_all);
    if (c.prefix == 0)
      std::printf("fixed cost     %-18s B=%d H=%d q=%d L=0: %.1f us per call (target <= 8 us)\n", tn, c.batch,
                  c.heads, c.q_len, r.us_all);
    if (c.page_size == 1) {
      for (const Result& o : results) {
        if (o.c.page_size == 64 && o.c.batch == c.batch && o.c.heads == c.heads && o.c.q_len == c.q_len &&
            o.c.prefix == c.prefix && o.c.tile == c.tile && o.c.family == c.family)
          std::printf("page size 1    %-18s B=%d H=%d q=%d L=%d: %.1f%% slower than page size 64 (target <= 10%%)\n",
                      tn, c.batch, c.heads, c.q_len, c.prefix, 100 * (r.us_all / o.us_all - 1));
      }
    }
  }
  const std::string json = opt.str("json");
  if (!json.empty()) {
    std::ofstream f(json);
    if (!f) throw std::invalid_argument("--json = '" + json + "' cannot be opened for writing");
    f << "{\n  \"gpu\": \"" << prop.name << "\",\n  \"sm\": " << prop.major * 10 + prop.minor
      << ",\n  \"sm_count\": " << prop.multiProcessorCount << ",\n  \"date\": \"" << date
      << "\",\n  \"commit\": \"" << opt.str("commit") << "\",\n  \"cuda_runtime\": " << runtime
      << ",\n  \"driver\": " << driver << ",\n  \"hbm_read_gbps\": " << hbm
      << ",\n  \"mma_sync_bf16_tflops\": " << mma << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << "    {\"family\": \"" << treemla::cuda::kernel_family_name(r.c.family) << "\", \"tile\": \""
        << treemla::cuda::tile_config_name(r.c.tile) << "\", \"batch\": " << r.c.batch
        << ", \"heads\": " << r.c.heads << ", \"q_len\": " << r.c.q_len << ", \"prefix\": " << r.c.prefix
        << ", \"page_size\": " << r.c.page_size << ", \"us\": " << r.us_all << ", \"us_prefix_only\": "
        << r.us_prefix << ", \"us_tail_only\": " << r.us_tail << ", \"tflops\": " << r.tflops
        << ", \"kv_gbps\": " << r.gbps << ", \"frac_mma_peak\": " << r.frac_mma
        << ", \"frac_hbm\": " << r.frac_hbm << ", \"paged_read_gbps\": " << r.paged_read_gbps
        << ", \"paged_read_one_cta_per_sm_gbps\": " << r.paged_read_1cta_gbps << "}"
        << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
  }
  return 0;
}

}  // namespace treemla::tool
