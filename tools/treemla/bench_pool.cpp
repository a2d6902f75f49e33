// treemla bench-pool: the KV pool's GPU side. (a) Defrag throughput: a pool of a few GB is
// churned on the host (alloc / extend / free under the as-freed policy), the full defrag is
// planned on the host and its page moves applied on the GPU; reported as GB/s moved (read +
// write) against a device-to-device cudaMemcpyAsync measured in the same run. (b) Commit
// latency: the device-driven commit (and acceptance + commit) captured in a CUDA graph and
// replayed for 1..16 accepted rows at batch 1 and 64.
//
// Host C++20 (KvPool is C++20; .cu files build as C++17): the kernels are reached through the
// public API, the timing through the CUDA runtime.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "cli.h"
#include "commands.h"

#ifdef TREEMLA_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "gpu_timing.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/kvpool.h"
#include "treemla/kvpool.h"
#endif

namespace treemla::tool {

namespace {

struct PoolBenchOptions {
  std::vector<int64_t> page_sizes{1, 64};
  double pool_gb = 4, fill = 0.85;
  int churn_ops = 4000;
  std::vector<int64_t> batches{1, 64};
  int reps = 10, commit_reps = 200;
  uint32_t seed = 1;
  std::string json, commit = "unknown";
};

// Parses `treemla bench-pool`; nothing when the benchmark should run, else the exit code.
std::optional<int> parse_options(int argc, char** argv, PoolBenchOptions& o) {
  CLI::App app(
      "Times the KV pool on the GPU: defrag of a churned pool (page moves planned on the host, "
      "applied on the\n"
      "GPU) against a device-to-device copy measured in the same run, and the CUDA-graph-replayed "
      "commit of\n"
      "1..16 accepted rows at batch 1 and 64.\n",
      "treemla bench-pool");
  cli::configure(app);
  cli::add_list(app, "--page-sizes", o.page_sizes, cli::power_of_two_in(1, 1024),
                "page sizes of the defrag runs");
  cli::add_number(app, "--pool-gb", o.pool_gb, 0.01, 64, "cache size of each defrag run in GiB");
  cli::add_number(app, "--fill", o.fill, 0.1, 0.99, "pool occupancy the churn keeps");
  cli::add_integer(app, "--churn-ops", o.churn_ops, 1, 1000000,
                   "alloc / extend / free operations before the defrag");
  cli::add_list(app, "--batches", o.batches, cli::integer_in(1, 1024),
                "batch sizes of the commit runs");
  cli::add_integer(app, "--reps", o.reps, 3, 1000, "timed repetitions of each defrag (median)");
  cli::add_integer(app, "--commit-reps", o.commit_reps, 3, 100000,
                   "timed graph replays of each commit case (median)");
  cli::add_integer(app, "--seed", o.seed, 0, 4294967295LL, "seed of the churn");
  app.add_option("--json", o.json, "write results as JSON to this file");
  app.add_option("--commit", o.commit, "commit recorded in the table and the JSON")
      ->capture_default_str();
  return cli::parse(app, argc, argv);
}

}  // namespace

#ifdef TREEMLA_WITH_CUDA

namespace {

using kvpool::KvPool;

template <class T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty())
    TREEMLA_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Device-to-device copy of `bytes` (read + write counted), in GB/s.
double measure_d2d_gbps(size_t bytes, cudaStream_t s) {
  void *a = nullptr, *b = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&a, bytes));
  TREEMLA_CUDA_CHECK(cudaMalloc(&b, bytes));
  TREEMLA_CUDA_CHECK(cudaMemset(a, 0x5a, bytes));
  const double ms = median_ms(
      s,
      [&](int) { TREEMLA_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); },
      3, 15);
  TREEMLA_CUDA_CHECK(cudaFree(a));
  TREEMLA_CUDA_CHECK(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// Churn at about `fill` occupancy: requests of up to 1/30 of the pool come and go and grow, so
// pages of live requests end up scattered as a serving engine leaves them.
void churn(KvPool& pool, double fill, int ops, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = int64_t{pool.config().num_pages} * pool.config().page_size;
  const int64_t slack = int64_t((1.0 - fill) * pool.config().num_pages);
  std::vector<int64_t> live;
  int64_t next = 0;
  for (int it = 0; it < ops; ++it) {
    const int op = int(rng() % 4);
    if (op <= 1) {
      const int64_t tok = 1 + int64_t(rng() % uint64_t(rows / 30));
      if (pool.pages_for(tok) + slack <= pool.num_free_pages()) {
        pool.alloc(next, tok);
        live.push_back(next++);
        continue;
      }
    } else if (op == 2 && !live.empty()) {
      const int64_t id = live[rng() % live.size()];
      const int64_t tok = 1 + int64_t(rng() % uint64_t(8 * pool.config().page_size));
      const int64_t need =
          pool.pages_for(pool.num_tokens(id) + tok) - int64_t(pool.pages(id).size());
      if (need + slack / 2 <= pool.num_free_pages()) pool.extend(id, tok);
      continue;
    }
    if (!live.empty()) {
      const size_t i = rng() % live.size();
      pool.free(live[i]);
      live.erase(live.begin() + std::ptrdiff_t(i));
    }
  }
}

struct DefragResult {
  int page_size = 0;
  int64_t num_pages = 0, pages_used = 0, runs_before = 0, moves = 0, waves = 0, single_waves = 0;
  double plan_ms = 0, apply_ms = 0, gbps = 0, frac_d2d = 0;
};

DefragResult bench_defrag(int page_size, double pool_gb, double fill, int ops, int reps,
                          uint32_t seed, cudaStream_t s) {
  DefragResult r;
  r.page_size = page_size;
  const int64_t page_bytes = int64_t{page_size} * 576 * 2;
  r.num_pages =
      std::min<int64_t>(int64_t(pool_gb * double(1 << 30)) / page_bytes, (int64_t{1} << 31) - 1);
  const kvpool::PoolConfig cfg{int32_t(r.num_pages), page_size, 576, 2,
                               kvpool::FreePolicy::kAsFreed};
  KvPool pool(cfg);
  churn(pool, fill, ops, seed);
  const kvpool::PoolMetrics m = pool.metrics();
  r.pages_used = m.pages_used;
  r.runs_before = m.total_runs;
  const auto t0 = std::chrono::steady_clock::now();
  const kvpool::DefragPlan plan = pool.plan_defrag();
  r.plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.moves = int64_t(plan.moves.size());
  r.waves = int64_t(plan.wave_offsets.size()) - 1;
  for (int64_t w = 0; w < r.waves; ++w)
    r.single_waves += plan.wave_offsets[w + 1] - plan.wave_offsets[w] == 1;
  void* cache = nullptr;
  void* ws = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&cache, size_t(r.num_pages) * page_bytes));
  TREEMLA_CUDA_CHECK(cudaMemset(cache, 0x3c, size_t(r.num_pages) * page_bytes));
  TREEMLA_CUDA_CHECK(cudaMalloc(&ws, cuda::kMoveWorkspaceBytes));
  TREEMLA_CUDA_CHECK(cudaMemset(ws, 0, cuda::kMoveWorkspaceBytes));
  kvpool::PageMove* moves = device_copy(plan.moves);
  int32_t* waves = device_copy(plan.wave_offsets);
  // Applying the same plan again moves the same bytes along the same dependences (the data is
  // meaningless after the first pass, the work is not).
  TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());  // setup ran on the legacy stream; timing runs on s
  const cuda::PageMoveParams p{cuda::device_cache(cfg, cache), moves, waves, int32_t(r.moves),
                               int32_t(r.waves)};
  r.apply_ms = median_ms(
      s, [&](int) { cuda::apply_page_moves(p, ws, s); }, 2, reps);
  cuda::check_move_status(ws, s);
  r.gbps =
      r.moves > 0 ? 2.0 * double(r.moves) * double(page_bytes) / (r.apply_ms * 1e-3) / 1e9 : 0.0;
  for (void* ptr : {cache, ws, static_cast<void*>(moves), static_cast<void*>(waves)})
    TREEMLA_CUDA_CHECK(cudaFree(ptr));
  return r;
}

struct CommitResult {
  int batch = 0, rows = 0;
  double commit_us = 0, commit_loop_us = 0, accept_commit_us = 0;
};

// Every request: prefix 4096 rows, a 65-node tree whose accepted path is 0, 17, 18, ... so every
// accepted row but the root moves (16 decoy children of the root come first). Page size 64,
// pages scattered.
std::vector<CommitResult> bench_commit(int batch, int reps, cudaStream_t s) {
  constexpr int kPs = 64, kPrefix = 4096, kQ = 65, kMaxAccept = 16;
  constexpr int kPagesPerReq = (kPrefix + kQ + kPs - 1) / kPs;
  const int np = batch * kPagesPerReq + 7;
  const kvpool::PoolConfig cfg{np, kPs, 576, 2, kvpool::FreePolicy::kAsFreed};
  std::vector<int32_t> perm(np);
  for (int i = 0; i < np; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  std::vector<int32_t> table(size_t(batch) * kPagesPerReq), prefix(batch, kPrefix),
      indptr(batch + 1);
  std::copy(perm.begin(), perm.begin() + std::ptrdiff_t(table.size()), table.begin());
  std::vector<int32_t> parents, tokens;
  for (int b = 0; b < batch; ++b) {
    indptr[b] = b * kQ;
    for (int i = 0; i < kQ; ++i) {
      parents.push_back(i == 0 ? -1 : i <= 17 ? 0 : i - 1);
      tokens.push_back(i == 0 ? 0 : i <= 16 ? 1000 + i : i - 16);
    }
  }
  indptr[batch] = batch * kQ;
  void* cache = nullptr;
  TREEMLA_CUDA_CHECK(cudaMalloc(&cache, size_t(np) * cfg.page_bytes()));
  TREEMLA_CUDA_CHECK(cudaMemset(cache, 0x11, size_t(np) * cfg.page_bytes()));
  int32_t *d_table = device_copy(table), *d_prefix = device_copy(prefix),
          *d_indptr = device_copy(indptr);
  int32_t *d_parents = device_copy(parents), *d_tokens = device_copy(tokens);
  int32_t *d_targets = device_copy(std::vector<int32_t>(parents.size())),
          *d_acc = device_copy(std::vector<int32_t>(size_t(batch) * kMaxAccept));
  int32_t *d_len = device_copy(std::vector<int32_t>(batch)),
          *d_new = device_copy(std::vector<int32_t>(batch));
  int32_t* d_bonus = device_copy(std::vector<int32_t>(batch));
  const cuda::CommitParams cp{cuda::device_cache(cfg, cache),
                              batch,
                              kMaxAccept,
                              kPagesPerReq,
                              d_table,
                              d_prefix,
                              d_acc,
                              d_len,
                              d_new,
                              nullptr};
  const cuda::AcceptParams ap{batch,     kMaxAccept, d_indptr, d_parents, d_tokens,
                              d_targets, d_acc,      d_len,    d_bonus,   nullptr};
  auto capture = [&](bool with_accept) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    TREEMLA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (with_accept) cuda::accept_paths(ap, s);
    cuda::commit_accepted(cp, s);
    TREEMLA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    TREEMLA_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    TREEMLA_CUDA_CHECK(cudaGraphDestroy(g));
    return e;
  };
  cudaGraphExec_t commit_only = capture(false), accept_commit = capture(true);
  std::vector<CommitResult> out;
  for (int n = 1; n <= kMaxAccept; ++n) {
    // Path 0, 17, .., 15 + n: targets follow it for n - 1 steps, then name no child.
    std::vector<int32_t> acc(kMaxAccept, -1), targets(kQ, -5), lens(batch, n);
    for (int k = 0; k < n; ++k) acc[k] = k == 0 ? 0 : 16 + k;
    for (int k = 0; k + 1 < n; ++k) targets[acc[k]] = tokens[acc[k + 1]];
    std::vector<int32_t> acc_all, targets_all;
    for (int b = 0; b < batch; ++b) {
      acc_all.insert(acc_all.end(), acc.begin(), acc.end());
      targets_all.insert(targets_all.end(), targets.begin(), targets.end());
    }
    TREEMLA_CUDA_CHECK(
        cudaMemcpy(d_targets, targets_all.data(), targets_all.size() * 4, cudaMemcpyHostToDevice));
    TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());  // legacy-stream setup before the timing stream s
    auto load_path = [&] {
      TREEMLA_CUDA_CHECK(
          cudaMemcpyAsync(d_acc, acc_all.data(), acc_all.size() * 4, cudaMemcpyHostToDevice, s));
      TREEMLA_CUDA_CHECK(
          cudaMemcpyAsync(d_len, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, s));
      TREEMLA_CUDA_CHECK(cudaStreamSynchronize(s));
    };
    CommitResult r;
    r.batch = batch;
    r.rows = n;
    load_path();
    r.commit_us =
        1e3 * median_ms(
                  s, [&](int) { TREEMLA_CUDA_CHECK(cudaGraphLaunch(commit_only, s)); }, 5, reps);
    constexpr int kLoop = 100;
    r.commit_loop_us = 1e3 / kLoop *
                       median_ms(
                           s,
                           [&](int) {
                             for (int i = 0; i < kLoop; ++i)
                               TREEMLA_CUDA_CHECK(cudaGraphLaunch(commit_only, s));
                           },
                           1, 5);
    r.accept_commit_us =
        1e3 * median_ms(
                  s, [&](int) { TREEMLA_CUDA_CHECK(cudaGraphLaunch(accept_commit, s)); }, 5, reps);
    std::vector<int32_t> got(batch);
    TREEMLA_CUDA_CHECK(cudaMemcpy(got.data(), d_len, batch * 4, cudaMemcpyDeviceToHost));
    TREEMLA_CHECK(got[0] == n,
                  "bench-pool: device acceptance gave " << got[0] << " rows, expected " << n);
    out.push_back(r);
  }
  TREEMLA_CUDA_CHECK(cudaGraphExecDestroy(commit_only));
  TREEMLA_CUDA_CHECK(cudaGraphExecDestroy(accept_commit));
  for (void* ptr :
       {cache, static_cast<void*>(d_table), static_cast<void*>(d_prefix),
        static_cast<void*>(d_indptr), static_cast<void*>(d_parents), static_cast<void*>(d_tokens),
        static_cast<void*>(d_targets), static_cast<void*>(d_acc), static_cast<void*>(d_len),
        static_cast<void*>(d_new), static_cast<void*>(d_bonus)}) {
    TREEMLA_CUDA_CHECK(cudaFree(ptr));
  }
  return out;
}

void write_json(std::ostream& os, const cudaDeviceProp& prop, const std::string& date, int runtime,
                int driver, double d2d, const PoolBenchOptions& o,
                const std::vector<DefragResult>& defrag, const std::vector<CommitResult>& commit) {
  using json = nlohmann::ordered_json;
  // "commit" is the source commit, as in bench's JSON; the commit timings are "commit_latency".
  json doc = {{"gpu", prop.name},
              {"sm", prop.major * 10 + prop.minor},
              {"date", date},
              {"commit", o.commit},
              {"cuda_runtime", runtime},
              {"driver", driver},
              {"d2d_copy_gbps", d2d},
              {"pool_gb", o.pool_gb},
              {"fill", o.fill},
              {"defrag", json::array()},
              {"commit_latency", json::array()}};
  for (const DefragResult& r : defrag) {
    doc["defrag"].push_back({{"page_size", r.page_size},
                             {"num_pages", r.num_pages},
                             {"pages_used", r.pages_used},
                             {"runs_before", r.runs_before},
                             {"moves", r.moves},
                             {"waves", r.waves},
                             {"single_move_waves", r.single_waves},
                             {"plan_ms", r.plan_ms},
                             {"apply_ms", r.apply_ms},
                             {"gbps", r.gbps},
                             {"frac_d2d", r.frac_d2d}});
  }
  for (const CommitResult& r : commit) {
    doc["commit_latency"].push_back({{"batch", r.batch},
                                     {"rows", r.rows},
                                     {"commit_us", r.commit_us},
                                     {"commit_loop_us", r.commit_loop_us},
                                     {"accept_commit_us", r.accept_commit_us}});
  }
  os << doc.dump(2) << "\n";
}

int run(const PoolBenchOptions& o) {
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::cerr << "treemla bench-pool: no CUDA device is visible; the benchmark needs a GPU\n";
    return 1;
  }
  std::ofstream json_file;
  if (!o.json.empty()) {  // before the run, which takes minutes
    json_file.open(o.json);
    if (!json_file)
      throw std::invalid_argument("--json: '" + o.json + "' cannot be opened for writing");
  }
  cudaDeviceProp prop{};
  TREEMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  cudaStream_t s;
  TREEMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double d2d = measure_d2d_gbps(size_t(1) << 30, s);
  const std::string date = bench::utc_date();
  std::ostream& os = std::cout;
  fmt::print(os, "# treemla bench-pool  gpu: {} (sm_{}{}, {} SMs)  cuda runtime {} driver {}\n",
             prop.name, prop.major, prop.minor, prop.multiProcessorCount, runtime, driver);
  fmt::print(os, "# date {}  commit {}\n", date, o.commit);
  fmt::print(os,
             "# ceiling measured now: cudaMemcpyAsync D2D of 1 GiB, {:.0f} GB/s (read + write)\n",
             d2d);
  fmt::print(os,
             "\n## defrag: {:.1f} GiB pool churned to {:.0f}%, full defrag planned on the host, "
             "applied on the GPU\n",
             o.pool_gb, 100 * o.fill);
  fmt::print(os, "{:>5} {:>9} {:>9} {:>8} {:>9} {:>7} {:>7} {:>9} {:>9} {:>8} {:>6}\n", "page",
             "pages", "used", "runs", "moves", "waves", "1-move", "plan ms", "apply ms", "GB/s",
             "%d2d");
  std::vector<DefragResult> defrag;
  for (int64_t ps : o.page_sizes) {
    DefragResult r = bench_defrag(int(ps), o.pool_gb, o.fill, o.churn_ops, o.reps, o.seed, s);
    r.frac_d2d = r.gbps / d2d;
    fmt::print(os,
               "{:>5} {:>9} {:>9} {:>8} {:>9} {:>7} {:>7} {:>9.1f} {:>9.3f} {:>8.0f} {:>5.1f}%\n",
               r.page_size, r.num_pages, r.pages_used, r.runs_before, r.moves, r.waves,
               r.single_waves, r.plan_ms, r.apply_ms, r.gbps, 100 * r.frac_d2d);
    os << std::flush;
    defrag.push_back(r);
  }
  fmt::print(os, "\n## commit: prefix 4096, 65-node tree, page size 64; CUDA graph replays, us\n");
  fmt::print(os, "{:>5} {:>4} {:>11} {:>11} {:>14}\n", "batch", "rows", "commit", "commit@100",
             "accept+commit");
  std::vector<CommitResult> commit;
  for (int64_t b : o.batches) {
    for (const CommitResult& r : bench_commit(int(b), o.commit_reps, s)) {
      fmt::print(os, "{:>5} {:>4} {:>11.2f} {:>11.2f} {:>14.2f}\n", r.batch, r.rows, r.commit_us,
                 r.commit_loop_us, r.accept_commit_us);
      commit.push_back(r);
    }
  }
  fmt::print(os,
             "# commit: one replay timed alone (launch included); commit@100: 100 replays back to "
             "back, per replay\n");
  TREEMLA_CUDA_CHECK(cudaStreamDestroy(s));
  if (json_file.is_open())
    write_json(json_file, prop, date, runtime, driver, d2d, o, defrag, commit);
  return 0;
}

}  // namespace

#endif  // TREEMLA_WITH_CUDA

int cmd_bench_pool(int argc, char** argv) {
  PoolBenchOptions options;
  if (const auto rc = parse_options(argc, argv, options)) return *rc;
#ifdef TREEMLA_WITH_CUDA
  return run(options);
#else
  std::cerr << "treemla bench-pool: this build has no CUDA support\n";
  return 1;
#endif
}

}  // namespace treemla::tool
