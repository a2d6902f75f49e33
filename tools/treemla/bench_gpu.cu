// treemla bench: verify attention on the GPU over a grid of shapes, each reported against two
// ceilings measured in the same run: HBM read bandwidth (a streaming read kernel) and the bf16
// mma.sync m16n8k16 peak (a register-only microbenchmark; the only tensor instruction sm_120
// has). Inputs are random, pages are scattered, and several copies of each workload are
// rotated so that the L2 cache does not serve repeated runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "cuda/tool_kernels.h"
#include "gpu_timing.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/verify.h"

namespace treemla::tool {

namespace {

using treemla::cuda::KernelFamily;
using treemla::cuda::TileConfig;

// ---- ceilings (their kernels are cuda/bench_kernels.cu) --------------------------------------

double measure_hbm_gbps(size_t bytes) {
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&buf, bytes));
  TREEMLA_CUDA_CHECK(cudaMalloc(&sink, 4));
  TREEMLA_CUDA_CHECK(cudaMemset(buf, 0x5a, bytes));
  int sms = 0;
  TREEMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t n = bytes / 16;
  const double ms = median_ms(
      0, [&](int) { kernels::launch_hbm_read(sms * 8, 512, buf, n, sink, 0); }, 3, 15);
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
  const double ms = median_ms(
      0, [&](int) { kernels::launch_mma_peak(blocks, threads, iters, sink, 0); }, 3, 15);
  TREEMLA_CHECK_LAUNCH("mma_peak_kernel");
  TREEMLA_CUDA_CHECK(cudaFree(sink));
  const double flops = double(blocks) * (threads / 32) * iters * 8 * (2.0 * 16 * 8 * 16);
  return flops / (ms * 1e-3) / 1e12;
}

// The bf16 wgmma peak (0 where the device or the build has no sm_90a wgmma).
double measure_wgmma_tflops(const cudaDeviceProp& prop) {
  if (!treemla::cuda::sm90a_available(prop.major, prop.minor)) return 0;
  float* sink = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&sink, 4));
  const int blocks = prop.multiProcessorCount, iters = 2048;
  const double ms = median_ms(
      0, [&](int) { kernels::launch_wgmma_peak(blocks, iters, sink, 0); }, 3, 15);
  TREEMLA_CHECK_LAUNCH("wgmma_peak_kernel");
  TREEMLA_CUDA_CHECK(cudaFree(sink));
  return double(kernels::wgmma_peak_flops(blocks, iters)) / (ms * 1e-3) / 1e12;
}

// ---- workloads ---------------------------------------------------------------------------

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
  kernels::launch_fill_random_bf16(1024, 256, w.q, q_elems, seed * 7 + 1, 1.0f, 0);
  kernels::launch_fill_random_bf16(4096, 256, w.kv, w.kv_bytes / 2, seed * 7 + 2, 1.0f, 0);
  TREEMLA_CHECK_LAUNCH("fill_random_bf16");
  TREEMLA_CUDA_CHECK(cudaMemcpy(w.pt, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  TREEMLA_CUDA_CHECK(cudaMemcpy(w.prefix, prefix.data(), c.batch * 4, cudaMemcpyHostToDevice));
  TREEMLA_CUDA_CHECK(
      cudaMemcpy(w.indptr, indptr.data(), (c.batch + 1) * 4, cudaMemcpyHostToDevice));
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
  for (void* ptr :
       {w.q, w.kv, w.o, static_cast<void*>(w.pt), static_cast<void*>(w.prefix),
        static_cast<void*>(w.indptr), static_cast<void*>(w.mask), static_cast<void*>(w.lse)}) {
    cudaFree(ptr);
  }
}

// Median microseconds of one call of `part`, timed as an engine runs it per layer: the schedule
// once (it depends only on the lengths, which every copy shares), then back-to-back calls over
// the rotating copies captured in one CUDA graph, replayed `reps` times.
double time_calls(std::vector<Workload>& ws, const treemla::cuda::VerifyPlan& plan, void* wsp,
                  treemla::VerifyPart part, int reps, cudaStream_t stream) {
  for (auto& w : ws) w.p.part = part;
  treemla::cuda::verify_schedule(ws[0].p, plan, wsp, stream);
  const int copies = static_cast<int>(ws.size());
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
  const double ms = median_ms(
      stream, [&](int) { TREEMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 3, reps);
  TREEMLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TREEMLA_CUDA_CHECK(cudaGraphDestroy(graph));
  treemla::cuda::check_status(plan, wsp, stream);
  return ms * 1e3 / calls;
}

// Copies of a case's inputs: enough that one rotation touches more than 3x the L2.
std::vector<Workload> make_copies(const Case& c, size_t l2_bytes) {
  Workload first = make_workload(c, 1);
  const int copies =
      static_cast<int>(std::min<size_t>(8, std::max<size_t>(1, 3 * l2_bytes / first.kv_bytes + 1)));
  std::vector<Workload> ws{first};
  for (int i = 1; i < copies; ++i) ws.push_back(make_workload(c, 1 + i));
  return ws;
}

// One case timed: the row without its fractions of the ceilings (the caller has those).
bench::Row run_case(const Case& c, size_t l2_bytes, int reps) {
  std::vector<Workload> ws = make_copies(c, l2_bytes);
  const int copies = static_cast<int>(ws.size());
  // Every request has q_len nodes: that bound lets the decode family run q_len * H <= 16.
  treemla::cuda::VerifyLimits lim{c.batch, int64_t(c.batch) * c.q_len, c.heads, c.q_len};
  const auto plan = treemla::cuda::make_verify_plan(lim, -1, c.tile, c.family);
  void* wsp = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&wsp, plan.workspace_bytes));
  treemla::cuda::init_workspace(plan, wsp, 0);
  cudaStream_t stream;
  TREEMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bench::Row r;
  r.family = treemla::cuda::kernel_family_name(c.family);
  r.tile = treemla::cuda::tile_config_name(c.tile);
  r.shape = {c.batch, c.heads, c.q_len, c.prefix, c.page_size};
  auto time_part = [&](treemla::VerifyPart part) {
    return time_calls(ws, plan, wsp, part, reps, stream);
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
      const int unroll = one_per_sm ? 4 : 1;
      const double ms = median_ms(
          0,
          [&](int i) {
            const Workload& w = ws[i % copies];
            kernels::launch_paged_read(unroll, ctas, 256, w.kv, w.pt, w.p.page_table_stride,
                                       c.batch, c.prefix, c.page_size, splits, sink, 0);
          },
          3, reps);
      TREEMLA_CHECK_LAUNCH("paged_read_kernel");
      return double(c.batch) * c.prefix * treemla::kHeadDimQK * 2 / (ms * 1e-3) / 1e9;
    };
    r.paged_read_gbps = paged_gbps(sms * 8, false);
    r.paged_read_1cta_gbps = paged_gbps(sms, true);
    TREEMLA_CUDA_CHECK(cudaFree(sink));
  }
  r.us = time_part(treemla::VerifyPart::kAll);
  r.us_prefix = time_part(treemla::VerifyPart::kPrefix);
  r.us_tail = time_part(treemla::VerifyPart::kTail);
  const double rows = double(c.batch) * c.q_len * c.heads;
  const double flops = 2.0 * rows * c.prefix * (treemla::kHeadDimQK + treemla::kHeadDimV);
  const double bytes = double(c.batch) * c.prefix * treemla::kHeadDimQK * 2;
  r.tflops = flops / (r.us * 1e-6) / 1e12;
  r.kv_gbps = bytes / (r.us * 1e-6) / 1e9;
  TREEMLA_CUDA_CHECK(cudaStreamDestroy(stream));
  TREEMLA_CUDA_CHECK(cudaFree(wsp));
  for (auto& w : ws) free_workload(w);
  return r;
}

// The cost table of docs/budget.md: verify time per layer (one request, H heads, 1 + B tree
// nodes, prefix L, the plan's default family and tile) on the grid of include/treemla/budget.h.
int cost_table(const bench::Options& opt, const bench::Header& header, size_t l2_bytes) {
  const std::vector<int> n = bench::cost_table_sizes();
  const std::vector<int64_t> L = bench::cost_table_prefix_lens();
  std::ofstream f(opt.cost_table);
  if (!f)
    throw std::invalid_argument("--cost-table: '" + opt.cost_table +
                                "' cannot be opened for writing");
  std::vector<bench::CostPoint> points;
  std::string family, tile;
  std::cout << "# cost table: H=" << opt.cost_heads << " page_size=" << opt.cost_page_size << "\n";
  for (int ni : n) {
    for (int64_t l : L) {
      Case c{1,
             opt.cost_heads,
             ni,
             static_cast<int>(l),
             opt.cost_page_size,
             TileConfig::kAuto,
             KernelFamily::kAuto};
      std::vector<Workload> ws = make_copies(c, l2_bytes);
      const auto plan = treemla::cuda::make_verify_plan({1, ni, opt.cost_heads});
      family = treemla::cuda::kernel_family_name(plan.family);
      tile = treemla::cuda::tile_config_name(plan.tile);
      void* wsp = nullptr;
      TREEMLA_CUDA_CHECK(cudaMalloc(&wsp, plan.workspace_bytes));
      treemla::cuda::init_workspace(plan, wsp, 0);
      cudaStream_t stream;
      TREEMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      const double us =
          time_calls(ws, plan, wsp, treemla::VerifyPart::kAll, std::max(3, opt.reps), stream);
      TREEMLA_CUDA_CHECK(cudaStreamDestroy(stream));
      TREEMLA_CUDA_CHECK(cudaFree(wsp));
      for (auto& w : ws) free_workload(w);
      points.push_back({ni, l, us});
      std::cout << "n=" << ni << " L=" << l << " us=" << us << "\n" << std::flush;
    }
  }
  bench::write_cost_table(f, header, opt.cost_heads, opt.cost_page_size, family, tile, n, L,
                          points);
  return 0;
}

}  // namespace

int bench::run(const bench::Options& opt) {
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
  for (const bench::Shape& s : opt.cases)
    shapes.push_back({s.batch, s.heads, s.q_len, s.prefix, s.page_size, {}, {}});
  if (shapes.empty()) {
    shapes = {
        // compute-bound: H x q_len >= 256
        {1, 16, 16, 131072, 64, {}, {}},
        {1, 8, 65, 131072, 64, {}, {}},
        {1, 8, 65, 185000, 64, {}, {}},
        {1, 128, 64, 131072, 64, {}, {}},
        {8, 128, 16, 131072, 64, {}, {}},
        {1, 16, 65, 32768, 64, {}, {}},
        {1, 8, 65, 32768, 64, {}, {}},
        {4, 16, 257, 16384, 64, {}, {}},
        // memory-bound: q_len = 1
        {8, 16, 1, 131072, 64, {}, {}},
        {8, 8, 1, 131072, 64, {}, {}},
        {32, 16, 1, 32768, 64, {}, {}},
        // page_size 1, pages scattered, against the same case at 64 above
        {1, 8, 65, 131072, 1, {}, {}},
        // the fixed cost of a call: nothing to attend but each node's own row
        {1, 8, 1, 0, 64, {}, {}},
    };
  }
  std::vector<TileConfig> tiles;
  const std::string& ts = opt.tiles;
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  if (ts == "all" || ts == "smem-large") {
    if (optin >= 150000) tiles.push_back(TileConfig::kSmemLarge);
  }
  if (ts == "all" || ts == "smem99k") tiles.push_back(TileConfig::kSmem99K);
  if (tiles.empty()) throw std::invalid_argument("--tiles: '" + ts + "' does not fit this device");
  std::vector<KernelFamily> families;
  auto named = [&](const char* f) {
    return std::find(opt.families.begin(), opt.families.end(), f) != opt.families.end();
  };
  const bool all = named("all");
  if (all || named("cpasync")) families.push_back(KernelFamily::kCpAsync);
  if ((all && prop.major >= 9) || named("cluster")) families.push_back(KernelFamily::kCluster);
  const bool sm90a_here = treemla::cuda::sm90a_available(prop.major, prop.minor);
  if ((all && sm90a_here) || named("sm90a")) families.push_back(KernelFamily::kSm90a);
  if (all || named("decode")) families.push_back(KernelFamily::kDecode);
  if ((all && prop.major >= 9) || named("warpspec")) families.push_back(KernelFamily::kWarpSpec);
  std::ofstream json_file;
  if (!opt.json.empty()) {  // before the run, which takes minutes
    json_file.open(opt.json);
    if (!json_file)
      throw std::invalid_argument("--json: '" + opt.json + "' cannot be opened for writing");
  }

  bench::Header header;
  header.device = {prop.name,       prop.major * 10 + prop.minor, prop.multiProcessorCount,
                   clock_khz / 1e3, mem_clock_khz / 1e3,          runtime,
                   driver};
  header.ceilings.hbm_read_gbps = measure_hbm_gbps(size_t(4) << 30);
  header.ceilings.mma_tflops = measure_mma_tflops();
  header.ceilings.wgmma_tflops = measure_wgmma_tflops(prop);
  header.date = bench::utc_date();
  header.commit = opt.commit;
  header.reps = opt.reps;
  bench::print_header(std::cout, header);

  if (!opt.cost_table.empty()) return cost_table(opt, header, prop.l2CacheSize);
  std::vector<bench::Row> rows;
  for (const Case& shape : shapes) {
    for (KernelFamily f : families) {
      for (TileConfig t : tiles) {
        if (f == KernelFamily::kSm90a && t != TileConfig::kSmemLarge) continue;   // its only one
        if (f == KernelFamily::kWarpSpec && t != TileConfig::kSmem99K) continue;  // its only one
        // The decode family runs requests of at most 16 rows (q_len * H), in its one
        // configuration.
        if (f == KernelFamily::kDecode &&
            (shape.q_len * shape.heads > 16 || t != TileConfig::kSmem99K))
          continue;
        Case c = shape;
        c.tile = t;
        c.family = f;
        bench::Row r = run_case(c, prop.l2CacheSize, opt.reps);
        r.frac_mma = r.tflops / header.ceilings.mma_tflops;
        if (header.ceilings.wgmma_tflops > 0)
          r.frac_wgmma = r.tflops / header.ceilings.wgmma_tflops;
        r.frac_hbm = r.kv_gbps / header.ceilings.hbm_read_gbps;
        rows.push_back(r);
        bench::print_row(std::cout, rows.back());
      }
    }
  }
  bench::print_targets(std::cout, rows);
  if (json_file.is_open()) bench::write_json(json_file, header, rows);
  return 0;
}

}  // namespace treemla::tool
