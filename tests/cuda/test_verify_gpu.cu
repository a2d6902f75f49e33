// GPU verify attention against the CPU reference (cpu::verify_full, the specification), on
// random inputs with fixed seeds, poisoned unused cache slots and page-table entries, for every
// tile configuration the device can run (the 99 KB sm_120 configuration always). matches()
// checks every (node, head) row against bounds derived from a same-precision baseline
// (common/row_check.h); test_verify_oracle.cu adds peaked data aimed at the kernel's boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/env_switch.h"
#include "cuda/dispatch.h"
#include "gpu_case.h"

namespace treemla::test {
namespace {

// item_capacity > 0: the plan's work-item table that small (run_gpu).
void check_case(const CaseSpec& spec, uint32_t seed, VerifyPart part = VerifyPart::kAll,
                int item_capacity = 0) {
  VerifyCase c(spec, seed);
  const CpuResult ref = run_reference(c, part);
  DeviceCase d(c);
  for (const GpuConfig& cfg : configs_to_test(c)) {
    SCOPED_TRACE(cfg.name() + " part=" + part_name(part));
    const GpuResult g = run_gpu(d, c, cfg, part, item_capacity);
    EXPECT_TRUE(matches(g, ref, c));
  }
}

TEST(VerifyGpu, SmallPrefixLengths) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (int prefix : {0, 1, 31, 32, 33, 63, 64, 65, 100, 4097})
    check_case(make_spec(1, 8, 7, prefix, 16), seed++);
}

TEST(VerifyGpu, DecodeQLenOne) {
  REQUIRE_GPU();
  uint32_t seed = 200;
  for (int h : {1, 3, 8, 16, 128}) check_case(make_spec(3, h, 1, 777, 64), seed++);
}

// Requests of at most 16 rows: every family, the decode family included (q_len 0..16 with
// q_len * H <= 16, prefixes across block and split edges, trees in the tail, both dtypes, page
// sizes 1 and 128).
TEST(VerifyGpu, DecodeTiles) {
  REQUIRE_GPU();
  uint32_t seed = 250;
  for (int prefix : {0, 1, 31, 32, 33, 4097, 100000})
    check_case(make_spec(2, 16, 1, prefix, 64), seed++);
  check_case(make_spec(1, 1, 16, 5000, 16, DType::kBF16, TreeKind::kRandom), seed++);
  check_case(make_spec(3, 2, 8, 3000, 1, DType::kFP16, TreeKind::kStar), seed++);
  check_case(make_spec(2, 4, 4, 40000, 128, DType::kBF16, TreeKind::kDeep), seed++);
  CaseSpec s = make_spec(1, 8, 1, 0, 16, DType::kFP16, TreeKind::kChain);
  s.q_lens = {2, 1, 0, 2, 1, 1};
  s.prefix_lens = {3000, 0, 17, 65, 131072, 1};
  check_case(s, seed++);
  check_case(s, seed++, VerifyPart::kPrefix);
  check_case(s, seed++, VerifyPart::kTail);
}

TEST(VerifyGpu, PageSizeOneScattered) {
  REQUIRE_GPU();
  check_case(make_spec(2, 8, 65, 1000, 1), 300);
  check_case(make_spec(1, 3, 16, 333, 1, DType::kFP16), 301);
}

TEST(VerifyGpu, PageSizes) {
  REQUIRE_GPU();
  uint32_t seed = 350;
  for (int ps : {16, 32, 64, 128}) check_case(make_spec(2, 16, 16, 1500, ps), seed++);
}

TEST(VerifyGpu, Heads) {
  REQUIRE_GPU();
  uint32_t seed = 400;
  for (int h : {1, 3, 8, 16}) check_case(make_spec(2, h, 65, 300, 16), seed++);
  check_case(make_spec(1, 128, 16, 300, 64), seed++);
}

TEST(VerifyGpu, TreeShapes) {
  REQUIRE_GPU();
  uint32_t seed = 500;
  for (TreeKind k : {TreeKind::kChain, TreeKind::kStar, TreeKind::kRandom, TreeKind::kDeep})
    for (int q : {16, 65, 130}) check_case(make_spec(1, 8, q, 257, 16, DType::kBF16, k), seed++);
}

TEST(VerifyGpu, LargestTree) {
  REQUIRE_GPU();
  check_case(make_spec(1, 2, 1025, 100, 16, DType::kBF16, TreeKind::kRandom), 600);
  check_case(make_spec(1, 1, 1025, 0, 64, DType::kFP16, TreeKind::kDeep), 601);
}

TEST(VerifyGpu, Fp16) {
  REQUIRE_GPU();
  check_case(make_spec(2, 16, 65, 2049, 16, DType::kFP16), 700);
  check_case(make_spec(3, 8, 1, 5000, 64, DType::kFP16), 701);
}

TEST(VerifyGpu, RaggedBatch) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(1, 8, 1, 0, 16);
  s.q_lens = {65, 1, 16, 130, 7, 1};
  s.prefix_lens = {3000, 0, 17, 999, 40000, 1};
  check_case(s, 800);
  s.dtype = DType::kFP16;
  s.page_size = 1;
  check_case(s, 801);
}

// Work items past the schedule's item table (VerifyPlan::item_capacity) are looked up from the
// schedule's entries, item by item (fetch_item). A table of one item sends every other item of
// every family that way: a ragged batch with split prefixes and the tree tail, and q_len = 1
// requests whose split prefixes the decode family runs.
TEST(VerifyGpu, ItemsPastTheItemTable) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(1, 8, 1, 0, 16);
  s.q_lens = {65, 1, 16, 130, 7, 1};
  s.prefix_lens = {3000, 0, 17, 999, 40000, 1};
  check_case(s, 850, VerifyPart::kAll, 1);
  check_case(make_spec(4, 16, 1, 30000, 64), 851, VerifyPart::kAll, 1);
}

// The decode and warpspec families leave out the second 16-key half of a tree tail's last 32-key
// block when the tail ends in its first half (half_item), so such an item has an odd number of
// 16-key blocks and the CTA's next item starts at an odd ring position. More requests than the
// largest persistent grid (every CTA runs two items or more), tails ending in either half of
// their last block (q_len 1..4 at 4 heads, the decode family included; 1, 9, 17, 20, 32, 33 at 2
// heads), prefixes ending in either half of theirs or on a block edge.
TEST(VerifyGpu, OddBlockCountItemsInSequence) {
  REQUIRE_GPU();
  const int grid = largest_persistent_grid();
  if (grid == 0) return;  // TREEMLA_TEST_FAMILY left no configuration
  const int n = 2 * grid + 3;
  CaseSpec s = make_spec(n, 4, 4, 0, 16);
  for (int b = 0; b < n; ++b) {
    s.q_lens[b] = 1 + b % 4;
    s.prefix_lens[b] = 7 * (b % 13) + 16 * (b % 3);
  }
  check_case(s, 1100);
  const int q_lens[] = {1, 20, 33, 9, 17, 32};
  CaseSpec t = make_spec(n, 2, 33, 0, 16, DType::kFP16, TreeKind::kRandom);
  for (int b = 0; b < n; ++b) {
    t.q_lens[b] = q_lens[b % 6];
    t.prefix_lens[b] = 40 * (b % 5) + b % 3;
  }
  check_case(t, 1101);
}

TEST(VerifyGpu, LongPrefixSplitsAcrossManyCtas) {
  REQUIRE_GPU();
  check_case(make_spec(1, 1, 1, 262144, 64), 900);
  check_case(make_spec(1, 8, 9, 100000, 128), 901);
}

TEST(VerifyGpu, LargeLogits) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(2, 8, 33, 2000, 16);
  s.q_scale = 60.f;
  s.dist = ValueDist::kNormal;
  check_case(s, 1000);
}

TEST(VerifyGpu, PrefixOnlyAndTailOnly) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(3, 8, 65, 1234, 16);
  s.prefix_lens = {1234, 0, 77};
  check_case(s, 1100, VerifyPart::kPrefix);
  check_case(s, 1101, VerifyPart::kTail);
}

// prefix part (+) tail part with the GPU merge_state equals the whole verify on the CPU.
TEST(VerifyGpu, MergeOfPartsEqualsWhole) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(2, 16, 65, 3000, 64);
  s.prefix_lens = {3000, 0};
  VerifyCase c(s, 1200);
  const CpuResult ref = run_reference(c, VerifyPart::kAll);
  DeviceCase d(c);
  const GpuConfig cfg{cuda::KernelFamily::kAuto, cuda::TileConfig::kSmem99K};
  const GpuResult pre = run_gpu(d, c, cfg, VerifyPart::kPrefix);
  const GpuResult tail = run_gpu(d, c, cfg, VerifyPart::kTail);
  const int64_t pairs = int64_t(c.total_q) * c.num_heads;
  DeviceBuffer<float> va(pre.o.size()), vb(tail.o.size()), sa(pairs), sb(pairs);
  va.upload(pre.o.data(), pre.o.size() * 4);
  vb.upload(tail.o.data(), tail.o.size() * 4);
  sa.upload(pre.lse.data(), pairs * 4);
  sb.upload(tail.lse.data(), pairs * 4);
  // In place: v = va, s = sa (aliasing is part of the contract).
  cuda::merge_state(DType::kFP32, va.ptr, sa.ptr, vb.ptr, sb.ptr, va.ptr, sa.ptr, c.total_q,
                    c.num_heads, kHeadDimV, 0);
  TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
  GpuResult merged{va.download(), sa.download()};
  EXPECT_TRUE(matches(merged, ref, c));
  // Request 1 has no prefix: its prefix part is empty (O = 0, LSE = -inf).
  const int64_t r1 = int64_t(c.q_indptr[1]) * c.num_heads;
  EXPECT_EQ(pre.lse[r1], -INFINITY);
  EXPECT_EQ(pre.o[r1 * kHeadDimV], 0.f);
}

TEST(VerifyGpu, MergeStateMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(1300);
  const int tokens = 37, heads = 5, dim = 512;
  const int64_t n = int64_t(tokens) * heads;
  std::vector<float> va(n * dim), vb(n * dim), sa(n), sb(n);
  for (auto& x : va) x = float(rand_value(rng, ValueDist::kUniform));
  for (auto& x : vb) x = float(rand_value(rng, ValueDist::kUniform));
  for (int64_t i = 0; i < n; ++i) {
    sa[i] = float(10 * rand_value(rng, ValueDist::kUniform));
    sb[i] = float(10 * rand_value(rng, ValueDist::kUniform));
  }
  // Empty parts: -inf, +inf, NaN, and both empty.
  sa[0] = -INFINITY;
  sb[1] = INFINITY;
  sa[2] = NAN;
  sa[3] = -INFINITY;
  sb[3] = -INFINITY;
  sa[4] = INFINITY;
  sb[4] = NAN;
  for (DType dt : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int es = dtype_size(dt);
    std::vector<uint8_t> ha(n * dim * es), hb(n * dim * es);
    std::vector<float> qa(n * dim), qb(n * dim);  // the inputs as the GPU sees them
    for (int64_t i = 0; i < n * dim; ++i) {
      store_from_float(ha.data(), i, dt, va[i]);
      store_from_float(hb.data(), i, dt, vb[i]);
      qa[i] = load_as_float(ha.data(), i, dt);
      qb[i] = load_as_float(hb.data(), i, dt);
    }
    std::vector<float> ro(n * dim), rs(n);
    cpu::merge_state(qa.data(), sa.data(), qb.data(), sb.data(), ro.data(), rs.data(), tokens,
                     heads, dim);
    DeviceBuffer<uint8_t> da(ha.size()), db(hb.size()), dout(ha.size());
    DeviceBuffer<float> dsa(n), dsb(n), ds(n);
    da.upload(ha.data(), ha.size());
    db.upload(hb.data(), hb.size());
    dsa.upload(sa.data(), n * 4);
    dsb.upload(sb.data(), n * 4);
    cuda::merge_state(dt, da.ptr, dsa.ptr, db.ptr, dsb.ptr, dout.ptr, ds.ptr, tokens, heads, dim,
                      0);
    TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> raw = dout.download();
    std::vector<float> go(n * dim);
    for (int64_t i = 0; i < n * dim; ++i) go[i] = load_as_float(raw.data(), i, dt);
    EXPECT_TRUE(all_close(ds.download(), rs, Tolerance{1e-5, 1e-5}, "s"));
    const double eps = dt == DType::kFP32 ? 1e-6 : dt == DType::kBF16 ? 8e-3 : 1e-3;
    EXPECT_TRUE(all_close(go, ro, Tolerance{eps, eps}, "v"));
    EXPECT_EQ(ds.download()[3], -INFINITY);
    EXPECT_EQ(go[3 * dim], 0.f);
  }
}

// The whole call captured once in a CUDA graph; replays after the lengths, tree and data in the
// same device buffers changed give the same results as eager calls.
void check_graph_replay(CaseSpec big, CaseSpec small, uint32_t seed) {
  big.mask_words = small.mask_words = 2;
  big.extra_pages = small.extra_pages = 4;
  big.stride_slack = small.stride_slack = 0;
  VerifyCase a(big, seed);
  VerifyCase b(small, seed + 1);
  const int total_cap = std::max(a.total_q, b.total_q);
  const int max_q = std::max(case_max_q_len(a), case_max_q_len(b));
  DeviceCase d(a, std::max(a.q.size(), b.q.size()), std::max(a.kv_cache.size(), b.kv_cache.size()),
               std::max(a.num_pages, b.num_pages),
               std::max(a.page_table_stride, b.page_table_stride), total_cap);
  for (const GpuConfig& cfg : configs_to_test(int64_t{max_q} * a.num_heads)) {
    SCOPED_TRACE(cfg.name());
    d.load(a);
    cuda::VerifyLimits lim{a.batch, total_cap, a.num_heads, max_q};
    const cuda::VerifyPlan plan = cuda::make_verify_plan(lim, -1, cfg.tile, cfg.family);
    DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
    cuda::init_workspace(plan, ws.ptr, 0);
    cudaStream_t stream;
    TREEMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TREEMLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::verify_attention(d.p, plan, ws.ptr, d.o.ptr, d.lse.ptr, stream);
    TREEMLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    TREEMLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (const VerifyCase* c : {&a, &b, &a}) {
      d.load(*c);
      d.poison_outputs();
      TREEMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
      cuda::check_status(plan, ws.ptr, stream);
      const int64_t rh = int64_t(c->total_q) * c->num_heads;
      GpuResult replay{d.o_float(rh), d.lse_float(rh)};
      const GpuResult eager = run_gpu(d, *c, cfg, VerifyPart::kAll);
      EXPECT_EQ(replay.o, eager.o) << c->describe();
      EXPECT_TRUE(all_close(replay.lse, eager.lse, Tolerance{0, 0}, "lse"));
      EXPECT_TRUE(matches(replay, run_reference(*c, VerifyPart::kAll), *c));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(VerifyGpu, GraphReplayWithNewLengths) {
  REQUIRE_GPU();
  CaseSpec big = make_spec(3, 8, 1, 0, 16);
  big.q_lens = {65, 16, 1};
  big.prefix_lens = {5000, 3000, 9000};
  CaseSpec small = big;
  small.q_lens = {7, 65, 33};
  small.prefix_lens = {100, 4000, 1};
  check_graph_replay(big, small, 1400);
}

// The same for requests of at most 16 rows (the decode family among the configurations).
TEST(VerifyGpu, GraphReplayWithNewLengthsDecode) {
  REQUIRE_GPU();
  CaseSpec big = make_spec(3, 8, 1, 0, 16);
  big.q_lens = {2, 1, 1};
  big.prefix_lens = {5000, 30000, 9000};
  CaseSpec small = big;
  small.q_lens = {1, 2, 0};
  small.prefix_lens = {100, 4000, 1};
  check_graph_replay(big, small, 1410);
}

// Runs the whole call with a plan for `lim` under every configuration and returns each one's
// check_status message ("" when the device recorded nothing); a second check_status must find
// the record cleared.
std::vector<std::string> status_after_run(DeviceCase& d, const cuda::VerifyLimits& lim) {
  std::vector<std::string> out;
  for (const GpuConfig& cfg : configs_to_test(int64_t{lim.max_q_len} * lim.num_heads)) {
    const cuda::VerifyPlan plan = cuda::make_verify_plan(lim, -1, cfg.tile, cfg.family);
    DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
    cuda::init_workspace(plan, ws.ptr, 0);
    cuda::verify_attention(d.p, plan, ws.ptr, d.o.ptr, d.lse.ptr, 0);
    std::string message;
    try {
      cuda::check_status(plan, ws.ptr, 0);
    } catch (const Error& e) {
      message = e.message();
    }
    cuda::check_status(plan, ws.ptr, 0);  // cleared: must not throw
    out.push_back(cfg.name() + ": " + message);
  }
  return out;
}

// A page index out of range is recorded, not read, and reported by check_status.
TEST(VerifyGpu, BadPageIndexIsReported) {
  REQUIRE_GPU();
  VerifyCase c(make_spec(1, 8, 5, 100, 16), 1500);
  c.page_table[2] = c.num_pages + 5;
  DeviceCase d(c);
  for (const std::string& msg : status_after_run(d, {1, c.total_q, 8})) {
    EXPECT_NE(msg.find("page_table"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(c.num_pages + 5)), std::string::npos) << msg;
  }
}

// The same with requests of one row per head (the decode family among the configurations).
TEST(VerifyGpu, BadPageIndexIsReportedDecode) {
  REQUIRE_GPU();
  VerifyCase c(make_spec(2, 16, 1, 3000, 16), 1510);
  c.page_table[c.page_table_stride + 7] = c.num_pages + 9;  // request 1, rows 112..127
  DeviceCase d(c);
  for (const std::string& msg : status_after_run(d, {2, c.total_q, 16, 1})) {
    EXPECT_NE(msg.find("page_table"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(c.num_pages + 9)), std::string::npos) << msg;
  }
}

// A request longer than the plan's max_q_len is rejected by the schedule and reported.
TEST(VerifyGpu, QLenOverThePlansBoundIsReported) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(3, 8, 1, 500, 16);
  s.q_lens = {1, 2, 1};
  VerifyCase c(s, 1520);
  DeviceCase d(c);
  for (const std::string& msg : status_after_run(d, {3, c.total_q, 8, 1})) {
    EXPECT_NE(msg.find("request 1 has q_len = 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_q_len"), std::string::npos) << msg;
  }
}

// A page-table row too short for the request's rows: reported, never read past the row.
TEST(VerifyGpu, PageTableRowTooShortIsReported) {
  REQUIRE_GPU();
  CaseSpec s = make_spec(2, 4, 9, 100, 16);
  s.stride_slack = 0;
  VerifyCase c(s, 1550);
  DeviceCase d(c);
  d.p.page_table_stride = c.page_table_stride - 1;  // the last page of each request is unmapped
  for (const std::string& msg : status_after_run(d, {2, c.total_q, 4}))
    EXPECT_NE(msg.find("page_table_stride"), std::string::npos) << msg;
}

// A page index of -1 in a row the call reads is an error too (not "no page").
TEST(VerifyGpu, NegativePageIndexIsReported) {
  REQUIRE_GPU();
  VerifyCase c(make_spec(1, 8, 5, 100, 16), 1560);
  c.page_table[1] = -1;
  DeviceCase d(c);
  for (const std::string& msg : status_after_run(d, {1, c.total_q, 8}))
    EXPECT_NE(msg.find("-1"), std::string::npos) << msg;
}

TEST(VerifyGpu, LengthsOverThePlanAreReported) {
  REQUIRE_GPU();
  VerifyCase c(make_spec(2, 4, 9, 50, 16), 1600);
  DeviceCase d(c);
  for (const std::string& msg : status_after_run(d, {2, c.total_q - 1, 4}))  // one row too few
    EXPECT_NE(msg.find("max_total_q"), std::string::npos) << msg;
}

TEST(VerifyGpu, HostChecksNameTheArgument) {
  REQUIRE_GPU();
  VerifyCase c(make_spec(1, 4, 3, 10, 16), 1700);
  DeviceCase d(c);
  const cuda::VerifyPlan plan = cuda::make_verify_plan({1, c.total_q, 4});
  VerifyParams p = d.p;
  p.page_size = 24;
  try {
    cuda::check_params(p, plan);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("page_size"), std::string::npos);
  }
  p = d.p;
  p.num_heads = 5;
  EXPECT_THROW(cuda::check_params(p, plan), Error);
  EXPECT_THROW(cuda::make_verify_plan({1, 1, 129}), Error);
  try {
    cuda::make_verify_plan({1, 1, 4, kMaxTreeNodes + 1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("max_q_len"), std::string::npos);
  }
  // A misaligned workspace is refused on the host, before anything is enqueued.
  char* misaligned = reinterpret_cast<char*>(uintptr_t{256} + 4);
  try {
    cuda::verify_schedule(d.p, plan, misaligned, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("workspace must be 16-byte aligned"), std::string::npos)
        << e.message();
  }
  EXPECT_THROW(cuda::init_workspace(plan, misaligned, 0), Error);
}

// What the plan picks by default and what it refuses, per device: kAuto is sm90a on sm_90 with
// sm_90a code (cpasync when the 99 KB configuration is forced), cpasync elsewhere; sm90a has no
// 99 KB configuration and runs on compute capability 9.0 alone.
TEST(VerifyGpu, FamilyChoiceAndRefusals) {
  REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const bool sm90a = cuda::sm90a_available(major, minor);
  const cuda::VerifyLimits lim{2, 130, 8};
  const cuda::VerifyPlan automatic = cuda::make_verify_plan(lim);
  EXPECT_EQ(automatic.family, sm90a ? cuda::KernelFamily::kSm90a : cuda::KernelFamily::kCpAsync);
  const cuda::VerifyPlan small = cuda::make_verify_plan(lim, -1, cuda::TileConfig::kSmem99K);
  EXPECT_EQ(small.family, cuda::KernelFamily::kCpAsync);  // no max_q_len: cpasync
  EXPECT_EQ(small.tile, cuda::TileConfig::kSmem99K);
  // A bound whose full-length requests fill a 64-row tile (a tree verify): warpspec where it
  // runs (sm_90 and newer) and sm90a does not (or the 99 KB configuration is asked for); below
  // 64 rows, cpasync.
  const cuda::KernelFamily tree99k =
      major >= 9 ? cuda::KernelFamily::kWarpSpec : cuda::KernelFamily::kCpAsync;
  EXPECT_EQ(cuda::make_verify_plan({2, 130, 8, 65}, -1, cuda::TileConfig::kSmem99K).family,
            tree99k);
  EXPECT_EQ(cuda::make_verify_plan({2, 130, 8, 8}, -1, cuda::TileConfig::kSmem99K).family,
            tree99k);  // 8 x 8 = 64 rows
  EXPECT_EQ(cuda::make_verify_plan({2, 130, 8, 7}, -1, cuda::TileConfig::kSmem99K).family,
            cuda::KernelFamily::kCpAsync);  // 56 rows
  EXPECT_EQ(cuda::make_verify_plan({2, 130, 8, 65}).family,
            sm90a ? cuda::KernelFamily::kSm90a : tree99k);
  EXPECT_NE(cuda::make_verify_plan({2, 130, 8, 65}, -1, cuda::TileConfig::kSmemLarge).family,
            cuda::KernelFamily::kWarpSpec);  // warpspec has no large configuration
  auto message = [&](cuda::TileConfig tile) {
    try {
      cuda::make_verify_plan(lim, -1, tile, cuda::KernelFamily::kSm90a);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  EXPECT_NE(message(cuda::TileConfig::kSmem99K).find("sm90a"), std::string::npos);
  if (sm90a) {
    EXPECT_NE(message(cuda::TileConfig::kSmem99K).find("only the smem-large"), std::string::npos);
    const cuda::VerifyPlan p =
        cuda::make_verify_plan(lim, -1, cuda::TileConfig::kAuto, cuda::KernelFamily::kSm90a);
    EXPECT_EQ(p.tile, cuda::TileConfig::kSmemLarge);
    EXPECT_EQ(p.threads, 384);
  } else {
    EXPECT_NE(message(cuda::TileConfig::kAuto).find("sm90a"), std::string::npos);
  }
  // A bound of at most 16 rows a request: the decode family on every device (sm_90 with sm90a
  // code included), unless the large configuration is asked for (then sm90a where it runs);
  // decode has no large configuration and refuses a plan without such a bound, naming it.
  EXPECT_EQ(cuda::make_verify_plan({8, 8, 16, 1}).family, cuda::KernelFamily::kDecode);
  EXPECT_EQ(cuda::make_verify_plan({8, 16, 8, 2}).family, cuda::KernelFamily::kDecode);
  if (sm90a)
    EXPECT_EQ(cuda::make_verify_plan({8, 8, 16, 1}, -1, cuda::TileConfig::kSmemLarge).family,
              cuda::KernelFamily::kSm90a);
  const cuda::VerifyPlan dec =
      cuda::make_verify_plan({8, 8, 16, 1}, -1, cuda::TileConfig::kSmem99K);
  EXPECT_EQ(dec.family, cuda::KernelFamily::kDecode);
  EXPECT_EQ(dec.tile, cuda::TileConfig::kSmem99K);
  EXPECT_EQ(dec.threads, 192);  // 4 compute warps and the 2 producer warps
  EXPECT_NE(cuda::make_verify_plan({8, 8, 32, 1}, -1, cuda::TileConfig::kSmem99K).family,
            cuda::KernelFamily::kDecode);
  EXPECT_EQ(cuda::make_verify_plan({8, 8, 16, 1}, -1, cuda::TileConfig::kAuto,
                                   cuda::KernelFamily::kDecode)
                .tile,
            cuda::TileConfig::kSmem99K);
  try {
    cuda::make_verify_plan({8, 8, 16, 1}, -1, cuda::TileConfig::kSmemLarge,
                           cuda::KernelFamily::kDecode);
    ADD_FAILURE() << "decode family accepted smem-large";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("only the smem99k"), std::string::npos) << e.message();
  }
  for (const cuda::VerifyLimits& l :
       {cuda::VerifyLimits{8, 8, 16, 0}, cuda::VerifyLimits{8, 16, 16, 2}}) {
    try {
      cuda::make_verify_plan(l, -1, cuda::TileConfig::kAuto, cuda::KernelFamily::kDecode);
      ADD_FAILURE() << "decode family accepted max_q_len = " << l.max_q_len;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("max_q_len * num_heads must be <= 16"), std::string::npos)
          << e.message();
    }
  }
}

// The host model of the schedule (cuda/common/schedule_model.h, behind `treemla schedule`)
// against the schedule kernel: every request's splits, the work items and the refined last wave,
// at shapes of each kind (one wave with idle CTAs, several waves, a refined last wave, decode
// tiles, nothing to attend), for every family the device runs but the cluster family (its CTA
// pairs are not modeled). Only the schedule kernel runs: q, kv_cache, page_table and tree_mask
// point at a small buffer it never reads.
TEST(VerifyGpu, ScheduleMatchesHostModel) {
  REQUIRE_GPU();
  if (detail::env_set("TREEMLA_REFINE_PCT"))
    GTEST_SKIP() << "TREEMLA_REFINE_PCT overrides the threshold the model takes";
  struct Shape {
    int batch, heads, q_len, prefix;
    VerifyPart part;
  };
  const VerifyPart all = VerifyPart::kAll;
  const std::vector<Shape> shapes{
      {1, 8, 65, 185000, all},
      {1, 8, 65, 131072, all},
      {1, 16, 16, 131072, all},
      {1, 16, 65, 131072, all},
      {8, 16, 65, 32768, all},
      {1, 128, 64, 131072, all},
      {8, 128, 1, 32768, all},
      {8, 16, 1, 131072, all},
      {32, 16, 1, 32768, all},
      {4, 8, 65, 65536, all},
      {8, 8, 33, 49152, all},
      {2, 16, 65, 185000, all},
      {3, 64, 16, 131072, all},
      {1, 8, 1, 0, all},
      {5, 8, 7, 100, all},
      {300, 4, 3, 4000, all},
      // Prefix-only calls: the same splits, no tree tail, so no tail weight in the table.
      {1, 8, 65, 185000, VerifyPart::kPrefix},
      {1, 16, 16, 131072, VerifyPart::kPrefix}};
  DeviceBuffer<uint8_t> unread(4096);
  for (const Shape& s : shapes) {
    std::vector<int32_t> indptr(s.batch + 1, 0), prefix(s.batch, s.prefix);
    for (int b = 0; b < s.batch; ++b) indptr[b + 1] = indptr[b] + s.q_len;
    DeviceBuffer<int32_t> d_indptr(indptr.size()), d_prefix(prefix.size());
    d_indptr.upload(indptr.data(), indptr.size() * 4);
    d_prefix.upload(prefix.data(), prefix.size() * 4);
    VerifyParams p;
    p.batch = s.batch;
    p.num_heads = s.heads;
    p.page_size = 64;
    p.num_pages = 1;
    p.page_table_stride = 1;
    p.mask_words = 1;
    p.sm_scale = 0.04f;
    p.q = p.kv_cache = unread.ptr;
    p.page_table = reinterpret_cast<const int32_t*>(unread.ptr);
    p.tree_mask = reinterpret_cast<const uint64_t*>(unread.ptr);
    p.prefix_lens = d_prefix.ptr;
    p.q_indptr = d_indptr.ptr;
    p.part = s.part;
    std::vector<cuda::ModelRequest> reqs(static_cast<size_t>(s.batch), {s.q_len, s.prefix});
    for (const GpuConfig& cfg : configs_to_test(int64_t{s.q_len} * s.heads)) {
      if (cfg.family == cuda::KernelFamily::kCluster) continue;
      SCOPED_TRACE(cfg.name() + " case " + std::to_string(s.batch) + ":" + std::to_string(s.heads) +
                   ":" + std::to_string(s.q_len) + ":" + std::to_string(s.prefix) +
                   (s.part == VerifyPart::kPrefix ? " prefix only" : ""));
      const cuda::VerifyPlan plan = cuda::make_verify_plan(
          {s.batch, int64_t{s.batch} * s.q_len, s.heads, s.q_len}, -1, cfg.tile, cfg.family);
      DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
      cuda::init_workspace(plan, ws.ptr, 0);
      cuda::verify_schedule(p, plan, ws.ptr, 0);
      cuda::check_status(plan, ws.ptr, 0);
      const cuda::WorkspaceLayout layout =
          cuda::workspace_layout(plan.limits.max_batch, plan.partial_slots, plan.item_capacity);
      std::vector<cuda::RequestSched> sched(static_cast<size_t>(s.batch));
      cuda::WorkspaceHeader hdr{};
      cuda::WorkRefine rf{};
      TREEMLA_CUDA_CHECK(cudaMemcpy(sched.data(), ws.ptr + layout.sched,
                                    sched.size() * sizeof(cuda::RequestSched),
                                    cudaMemcpyDeviceToHost));
      TREEMLA_CUDA_CHECK(
          cudaMemcpy(&hdr, ws.ptr + layout.header, sizeof(hdr), cudaMemcpyDeviceToHost));
      TREEMLA_CUDA_CHECK(
          cudaMemcpy(&rf, ws.ptr + layout.refine, sizeof(rf), cudaMemcpyDeviceToHost));
      // The launch code's wave bound and threshold (verify_api.cu, kernel_params).
      const int max_waves = std::max(1, plan.partial_slots / plan.target_items);
      const int pct = cuda::refine_pct_for(plan.family == cuda::KernelFamily::kSm90a);
      const cuda::ScheduleModel m = cuda::model_schedule(reqs, s.heads, plan.target_items,
                                                         plan.partial_slots, max_waves, pct);
      for (int b = 0; b < s.batch; ++b) EXPECT_EQ(sched[b].splits, m.splits[b]) << "request " << b;
      EXPECT_EQ(hdr.num_items, m.items);
      EXPECT_EQ(hdr.num_groups, m.groups);
      EXPECT_EQ(rf.count, m.refine_count);
      if (m.refine_count > 0) {
        EXPECT_EQ(rf.first, m.refine_first);
        EXPECT_EQ(rf.q, m.refine_q);
      }
      // The tree tail's weights the schedule cut the item table with: the family's (dispatch.h),
      // unless the call has no tree tail (a prefix-only part) or items spill past the table (then
      // none: the main kernels' lookups cut unweighted). The cluster family's pairs, which also
      // get none, are not run here.
      if (!detail::env_set("TREEMLA_TAIL_WEIGHT")) {
        const cuda::TailWeights tw = cuda::tail_weights_for(plan.family);
        const bool fits = p.part != VerifyPart::kPrefix && hdr.num_items <= plan.item_capacity;
        EXPECT_EQ(rf.tail_one, fits ? tw.one : 0);
        EXPECT_EQ(rf.tail_tree, fits ? tw.tree : 0);
      }
      expect_groups_cover_partials(ws.ptr, layout, hdr, rf, sched);
      expect_item_table(ws.ptr, layout, hdr, rf, sched, plan.item_capacity,
                        p.part != VerifyPart::kPrefix);
    }
  }
}

}  // namespace
}  // namespace treemla::test
