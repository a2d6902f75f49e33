// GPU KV pool: plans applied on the device against the host reference (kvpool::apply_plan on a
// host mirror of the cache) and a model of every live request's rows; device acceptance against
// tree::accept_path; the device-driven commit eagerly and replayed from a CUDA graph.
// The whole device cache is compared with the mirror after every data-moving operation, so a
// copy that touches anything outside its plan (free pages hold a poison pattern) fails at once.
//
// C++20 host code (treemla/kvpool.h and tree.h need it; .cu files build as C++17): the test
// drives the library's kernels only through the public API.
#include <cuda_runtime.h>  // the typed cudaMalloc(T**) that gpu_case.h uses
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_case.h"
#include "treemla/cuda/kvpool.h"
#include "treemla/kvpool.h"
#include "treemla/tree.h"

namespace treemla::test {
namespace {

using kvpool::CommitPlan;
using kvpool::DefragPlan;
using kvpool::FreePolicy;
using kvpool::KvPool;
using kvpool::PageMove;
using kvpool::PoolConfig;
using kvpool::RowMove;

constexpr int kRowWidth = 576, kElem = 2, kRowBytes = kRowWidth * kElem;

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// A row's 1152 bytes are a function of its tag: rows with different tags differ everywhere.
void fill_row(uint8_t* dst, uint64_t tag) {
  for (int i = 0; i < kRowBytes / 8; ++i) {
    const uint64_t w = mix(tag * 0x100000001b3ull + static_cast<uint64_t>(i));
    std::memcpy(dst + 8 * i, &w, 8);
  }
}
constexpr uint64_t kPoisonTag = 0xdead000000000000ull;  // + row index: every free row distinct

template <class T>
void upload(DeviceBuffer<T>& d, const std::vector<T>& v) {
  d.upload(v.data(), v.size() * sizeof(T));
}
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no treemla::Error (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << "message: " << e.message();
  }
}

// Applies plans on the device with its own zeroed workspace; checks the status word after each.
struct MoveRunner {
  DeviceBuffer<uint8_t> ws{cuda::kMoveWorkspaceBytes};
  MoveRunner() { TREEMLA_CUDA_CHECK(cudaMemset(ws.ptr, 0, cuda::kMoveWorkspaceBytes)); }
  template <class Move>
  void apply(const cuda::DeviceCache& c, const std::vector<Move>& moves,
             const std::vector<int32_t>& waves) {
    DeviceBuffer<Move> dm(moves.size());
    DeviceBuffer<int32_t> dw(waves.size());
    upload(dm, moves), upload(dw, waves);
    const int32_t n = int32_t(moves.size()), w = int32_t(waves.size()) - 1;
    if constexpr (std::is_same_v<Move, PageMove>)
      cuda::apply_page_moves({c, dm.ptr, dw.ptr, n, w}, ws.ptr, 0);
    else
      cuda::apply_row_moves({c, dm.ptr, dw.ptr, n, w}, ws.ptr, 0);
    cuda::check_move_status(ws.ptr, 0);
  }
};

// A device cache and its host mirror, both starting with the poison pattern.
struct CachePair {
  PoolConfig cfg;
  std::vector<uint8_t> mirror;
  DeviceBuffer<uint8_t> dev;
  explicit CachePair(const PoolConfig& c)
      : cfg(c), mirror(size_t(c.page_bytes()) * c.num_pages), dev(mirror.size()) {
    for (size_t r = 0; r < mirror.size() / kRowBytes; ++r)
      fill_row(&mirror[r * kRowBytes], kPoisonTag + r);
    upload(dev, mirror);
  }
  cuda::DeviceCache desc() { return cuda::device_cache(cfg, dev.ptr); }
  size_t offset(kvpool::RowSlot s) const {
    return (size_t(s.page) * cfg.page_size + s.slot) * kRowBytes;
  }
  void write_row(kvpool::RowSlot s, uint64_t tag) { fill_row(&mirror[offset(s)], tag); }
  void push_rows(size_t begin, size_t bytes) {  // mirror -> device
    TREEMLA_CUDA_CHECK(
        cudaMemcpy(dev.ptr + begin, mirror.data() + begin, bytes, cudaMemcpyHostToDevice));
  }
  ::testing::AssertionResult device_matches() const {
    const std::vector<uint8_t> got = dev.download();
    if (got == mirror) return ::testing::AssertionSuccess();
    size_t i = 0;
    while (got[i] == mirror[i]) ++i;
    const size_t row = i / kRowBytes;
    return ::testing::AssertionFailure()
           << "device cache differs from the host reference at byte " << i << " (page "
           << row / cfg.page_size << ", slot " << row % cfg.page_size << ", byte " << i % kRowBytes
           << ")";
  }
};

// ---- random trees -----------------------------------------------------------------------------

struct Tree {
  std::vector<int32_t> parents, tokens, targets;
};

// Random tree of n nodes; small vocabularies make siblings share tokens (the tie rule matters).
// Targets follow a random child's token with probability `follow`, so paths are often long.
Tree random_tree(int n, std::mt19937& rng) {
  Tree t;
  const int kind = int(rng() % 5);
  const int vocab = std::array<int, 4>{2, 3, 8, 1000}[rng() % 4];
  if (kind == 4 && n > 1) {  // a DDTree from a random drafter top-K
    const int depth = 1 + int(rng() % 15), k = 1 + int(rng() % 6);
    std::vector<int32_t> toks(size_t(depth) * k);
    std::vector<float> lp(toks.size());
    for (int d = 0; d < depth; ++d) {
      std::vector<int32_t> perm(std::max(vocab, k) + 4);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<float> l(k);
      for (float& x : l) x = -std::uniform_real_distribution<float>(0.f, 6.f)(rng);
      std::sort(l.rbegin(), l.rend());
      for (int r = 0; r < k; ++r) toks[size_t(d) * k + r] = perm[r], lp[size_t(d) * k + r] = l[r];
    }
    tree::DDTree dd =
        tree::build_ddtree({depth, k, toks, lp}, 7, std::min(n - 1, tree::kMaxBudget), depth);
    t.parents = dd.parents;
    t.tokens = dd.tokens;
    n = dd.size();
  } else {
    t.parents.assign(n, -1);
    t.tokens.resize(n);
    const int window = 1 + int(rng() % 40);
    for (int i = 1; i < n; ++i) {
      if (kind == 0)
        t.parents[i] = i - 1;  // chain
      else if (kind == 1)
        t.parents[i] = 0;  // star
      else if (kind == 2)
        t.parents[i] = int(rng() % i);  // uniform
      else
        t.parents[i] = std::max(0, i - 1 - int(rng() % window));  // local, deep
    }
    for (int i = 0; i < n; ++i) t.tokens[i] = int(rng() % vocab);
  }
  std::vector<std::vector<int32_t>> children(n);
  for (int i = 1; i < n; ++i) children[t.parents[i]].push_back(i);
  const double follow = std::uniform_real_distribution<double>(0.3, 1.0)(rng);
  t.targets.resize(n);
  for (int u = 0; u < n; ++u) {
    const bool f =
        !children[u].empty() && std::uniform_real_distribution<double>(0, 1)(rng) < follow;
    t.targets[u] = f ? t.tokens[children[u][rng() % children[u].size()]] : int(rng() % (vocab + 1));
  }
  return t;
}

// Device copies of a batch of trees, laid out as for verify (q_indptr, global node order), and
// the outputs of accept_paths.
struct DeviceTrees {
  int batch, max_accept;
  DeviceBuffer<int32_t> indptr, parents, tokens, targets, accepted, len, bonus, status;
  DeviceTrees(int batch_, int max_accept_, int total_cap)
      : batch(batch_),
        max_accept(max_accept_),
        indptr(batch_ + 1),
        parents(total_cap),
        tokens(total_cap),
        targets(total_cap),
        accepted(size_t(batch_) * max_accept_),
        len(batch_),
        bonus(batch_),
        status(batch_) {}
  void load(const std::vector<Tree>& trees) {
    std::vector<int32_t> ip{0}, pa, to, ta;
    for (const Tree& t : trees) {
      pa.insert(pa.end(), t.parents.begin(), t.parents.end());
      to.insert(to.end(), t.tokens.begin(), t.tokens.end());
      ta.insert(ta.end(), t.targets.begin(), t.targets.end());
      ip.push_back(int32_t(pa.size()));
    }
    upload(indptr, ip);
    upload(parents, pa);
    upload(tokens, to);
    upload(targets, ta);
  }
  cuda::AcceptParams params() {
    return {batch,       max_accept,   indptr.ptr, parents.ptr, tokens.ptr,
            targets.ptr, accepted.ptr, len.ptr,    bonus.ptr,   status.ptr};
  }
  // Compares the device outputs with tree::accept_path cut to max_accept nodes.
  void expect_matches_host(const std::vector<Tree>& trees) const {
    const auto acc = accepted.download(), ln = len.download(), bo = bonus.download(),
               st = status.download();
    for (int b = 0; b < batch; ++b) {
      const Tree& t = trees[b];
      tree::Acceptance want = tree::accept_path(t.parents, t.tokens, t.targets);
      if (int(want.nodes.size()) > max_accept) {
        want.nodes.resize(max_accept);
        want.bonus_token = t.targets[want.nodes.back()];
      }
      std::vector<int32_t> row(want.nodes);
      row.resize(max_accept, -1);
      ASSERT_EQ(st[b], 0) << "request " << b;
      ASSERT_EQ(ln[b], int(want.nodes.size()))
          << "request " << b << " of " << t.parents.size() << " nodes";
      ASSERT_EQ(std::vector<int32_t>(acc.begin() + size_t(b) * max_accept,
                                     acc.begin() + size_t(b + 1) * max_accept),
                row)
          << "request " << b;
      ASSERT_EQ(bo[b], want.bonus_token) << "request " << b;
    }
  }
};

TEST(KvPoolGpu, AcceptMatchesHostOnRandomTrees) {
  REQUIRE_GPU();
  for (uint32_t seed = 0; seed < 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int batch = 1 + int(rng() % 9);
    std::vector<Tree> trees;
    int total = 0;
    for (int b = 0; b < batch; ++b) {
      const int r = int(rng() % 10);
      const int n = r == 0   ? 1
                    : r == 1 ? kMaxTreeNodes
                    : r < 5  ? 2 + int(rng() % 64)
                             : 2 + int(rng() % 1023);
      trees.push_back(random_tree(n, rng));
      total += int(trees.back().parents.size());
    }
    // max_accept = 1025 gives the exact host walk; small ones check the cut.
    for (int max_accept : {kMaxTreeNodes, 1 + int(rng() % 4)}) {
      DeviceTrees d(batch, max_accept, total);
      d.load(trees);
      TREEMLA_CUDA_CHECK(cudaMemset(d.accepted.ptr, 0x55, d.accepted.count * 4));
      cuda::accept_paths(d.params(), 0);
      TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
      d.expect_matches_host(trees);
    }
  }
}

TEST(KvPoolGpu, AcceptTieTakesLowestChild) {
  REQUIRE_GPU();
  // Root with children 1..40 all carrying token 5 (target of the root): child 1 wins; under
  // node 1, children 41 (token 4) and 42, 43 (token 9, the target): 42 wins. Node 44 carries
  // token 9 too but hangs under node 2.
  Tree t;
  t.parents.assign(45, 0);
  t.parents[0] = -1;
  t.tokens.assign(45, 5);
  t.parents[41] = t.parents[42] = t.parents[43] = 1;
  t.parents[44] = 2;
  t.tokens[41] = 4, t.tokens[42] = 9, t.tokens[43] = 9, t.tokens[44] = 9;
  t.targets.assign(45, 3);
  t.targets[0] = 5, t.targets[1] = 9, t.targets[42] = 11;
  DeviceTrees d(1, 8, 45);
  d.load({t});
  cuda::accept_paths(d.params(), 0);
  TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d.len.download()[0], 3);
  EXPECT_EQ(d.accepted.download(), (std::vector<int32_t>{0, 1, 42, -1, -1, -1, -1, -1}));
  EXPECT_EQ(d.bonus.download()[0], 11);
  d.expect_matches_host({t});
}

TEST(KvPoolGpu, AcceptFlagsBadTrees) {
  REQUIRE_GPU();
  Tree good{{-1, 0, 1}, {0, 1, 2}, {1, 2, 3}};
  Tree root_has_parent{{0, 0}, {0, 1}, {1, 2}};
  Tree forward_parent{{-1, 2, 0}, {0, 1, 2}, {1, 2, 3}};
  Tree empty{{}, {}, {}};
  DeviceTrees d(4, 4, 8);
  d.load({good, root_has_parent, forward_parent, empty});
  cuda::accept_paths(d.params(), 0);
  TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d.status.download(), (std::vector<int32_t>{0, int(cuda::KvStatus::kBadParents),
                                                       int(cuda::KvStatus::kBadParents),
                                                       int(cuda::KvStatus::kBadTreeSize)}));
  EXPECT_EQ(d.len.download(), (std::vector<int32_t>{3, 0, 0, 0}));
  EXPECT_EQ(d.bonus.download(), (std::vector<int32_t>{3, -1, -1, -1}));
  const auto acc = d.accepted.download();
  EXPECT_EQ(std::vector<int32_t>(acc.begin(), acc.begin() + 4),
            (std::vector<int32_t>{0, 1, 2, -1}));
  EXPECT_TRUE(std::all_of(acc.begin() + 4, acc.end(), [](int32_t x) { return x == -1; }));
}

// ---- ordered page and row moves on synthetic plans ----------------------------------------------

// Random waves: destinations distinct within a wave and never a source of the same wave, sources
// anywhere (so later waves read what earlier ones wrote). Mostly single moves, some large waves.
template <class Move, class MakeUnit>
void random_waves(int num_units, int num_waves, std::mt19937& rng, MakeUnit unit,
                  std::vector<Move>& moves, std::vector<int32_t>& offsets) {
  std::vector<int32_t> perm(num_units);
  std::iota(perm.begin(), perm.end(), 0);
  offsets = {0};
  for (int w = 0; w < num_waves; ++w) {
    const int r = int(rng() % 10);
    const int size = r < 6 ? 1 : r < 9 ? 1 + int(rng() % 40) : 1 + int(rng() % (num_units / 2));
    std::shuffle(perm.begin(), perm.end(),
                 rng);  // first `size`: destinations; sources from the rest
    for (int i = 0; i < size; ++i)
      moves.push_back({unit(perm[size + rng() % (num_units - size)]), unit(perm[i])});
    offsets.push_back(int32_t(moves.size()));
  }
}

TEST(KvPoolGpu, PageMovesRandomWavesMatchSequential) {
  REQUIRE_GPU();
  struct Shape {
    int page_size, num_pages, num_waves;
  };
  uint32_t seed = 10;
  for (Shape s : {Shape{1, 4096, 3000}, Shape{1, 2048, 60000}, Shape{16, 512, 800},
                  Shape{64, 256, 1500}, Shape{128, 96, 300}}) {
    SCOPED_TRACE("page_size " + std::to_string(s.page_size) + " waves " +
                 std::to_string(s.num_waves));
    std::mt19937 rng(seed++);
    CachePair c({s.num_pages, s.page_size, kRowWidth, kElem, FreePolicy::kAsFreed});
    std::vector<PageMove> moves;
    std::vector<int32_t> offsets;
    random_waves<PageMove>(
        s.num_pages, s.num_waves, rng, [](int32_t p) { return p; }, moves, offsets);
    kvpool::apply_page_moves(c.cfg, moves, c.mirror.data());
    MoveRunner().apply(c.desc(), moves, offsets);
    EXPECT_TRUE(c.device_matches());
  }
}

TEST(KvPoolGpu, PageMovesLongChainsAcrossCtas) {
  REQUIRE_GPU();
  // Shift by one: 1 -> 0, 2 -> 1, ... one wave per move; every move reads a page only after the
  // previous wave vacated its destination. With 64-row pages every move is its own ticket (CTA).
  for (int ps : {1, 64}) {
    const int np = ps == 1 ? 20000 : 400;
    CachePair c({np, ps, kRowWidth, kElem, FreePolicy::kAsFreed});
    std::vector<PageMove> moves;
    std::vector<int32_t> offsets{0};
    for (int p = 1; p < np; ++p)
      moves.push_back({p, p - 1}), offsets.push_back(int32_t(moves.size()));
    // then one wide wave moving every other page back up
    for (int p = 0; p + 1 < np; p += 2) moves.push_back({p, p + 1});
    offsets.push_back(int32_t(moves.size()));
    kvpool::apply_page_moves(c.cfg, moves, c.mirror.data());
    MoveRunner().apply(c.desc(), moves, offsets);
    EXPECT_TRUE(c.device_matches()) << "page_size " << ps;
  }
}

TEST(KvPoolGpu, RowMovesRandomWavesMatchSequential) {
  REQUIRE_GPU();
  uint32_t seed = 40;
  for (int ps : {1, 16, 64}) {
    std::mt19937 rng(seed++);
    const int np = 4096 / ps;
    CachePair c({np, ps, kRowWidth, kElem, FreePolicy::kAsFreed});
    std::vector<RowMove> moves;
    std::vector<int32_t> offsets;
    random_waves<RowMove>(
        np * ps, 2500, rng,
        [ps](int32_t r) {
          return kvpool::RowSlot{r / ps, r % ps};
        },
        moves, offsets);
    kvpool::apply_row_moves(c.cfg, moves, c.mirror.data());
    MoveRunner().apply(c.desc(), moves, offsets);
    EXPECT_TRUE(c.device_matches()) << "page_size " << ps;
  }
}

TEST(KvPoolGpu, BadMoveIsSkippedAndReported) {
  REQUIRE_GPU();
  CachePair c({8, 4, kRowWidth, kElem, FreePolicy::kAsFreed});
  MoveRunner run;
  const std::vector<PageMove> moves{{1, 0}, {2, 8}, {3, 2}};
  DeviceBuffer<PageMove> dm(3);
  DeviceBuffer<int32_t> dw(3);
  upload(dm, moves);
  upload(dw, std::vector<int32_t>{0, 2, 3});
  cuda::apply_page_moves({c.desc(), dm.ptr, dw.ptr, 3, 2}, run.ws.ptr, 0);
  expect_error([&] { cuda::check_move_status(run.ws.ptr, 0); }, "moves[1]");
  cuda::check_move_status(run.ws.ptr, 0);  // cleared
  kvpool::apply_page_moves(c.cfg, std::vector<PageMove>{{1, 0}, {3, 2}}, c.mirror.data());
  EXPECT_TRUE(c.device_matches());
  const std::vector<RowMove> rows{{{0, 1}, {0, 0}}, {{0, 4}, {1, 0}}};  // slot 4 of page_size 4
  DeviceBuffer<RowMove> dr(2);
  upload(dr, rows);
  cuda::apply_row_moves({c.desc(), dr.ptr, dw.ptr, 2, 1}, run.ws.ptr, 0);
  expect_error([&] { cuda::check_move_status(run.ws.ptr, 0); }, "moves[1]");
  kvpool::apply_row_moves(c.cfg, std::vector<RowMove>{rows[0]}, c.mirror.data());
  EXPECT_TRUE(c.device_matches());
}

TEST(KvPoolGpu, PageTableUpdates) {
  REQUIRE_GPU();
  const int rows = 5, stride = 6, np = 50;
  std::vector<int32_t> table(rows * stride, -7);
  DeviceBuffer<int32_t> dt(table.size());
  upload(dt, table);
  const std::vector<kvpool::PageTableUpdate> ups{
      {11, {4, 5, 6}}, {12, {}},  {13, {1, 2, 3, 4, 5, 6}},
      {14, {1, 50}},   {15, {9}}, {16, {1, 2, 3, 4, 5, 6, 7}}};
  const std::map<int64_t, int32_t> row_of{{11, 0}, {12, 1}, {13, 2}, {14, 3}, {15, 9}, {16, 4}};
  const cuda::PageTableUpdateImage img =
      cuda::flatten_page_table_updates(ups, [&](int64_t id) { return row_of.at(id); });
  DeviceBuffer<int32_t> r(img.rows.size()), o(img.offsets.size()), p(img.pages.size());
  upload(r, img.rows);
  upload(o, img.offsets);
  upload(p, img.pages);
  MoveRunner run;
  cuda::update_page_tables({dt.ptr, rows, stride, np, r.ptr, o.ptr, p.ptr, img.num_updates()},
                           run.ws.ptr, 0);
  // Update 3 holds page 50 (= num_pages), 4 targets row 9, 5 is longer than the stride: skipped.
  expect_error([&] { cuda::check_move_status(run.ws.ptr, 0); },
               "update_page_tables skipped update");
  std::copy_n(std::vector<int32_t>{4, 5, 6}.begin(), 3, table.begin());
  std::copy_n(std::vector<int32_t>{1, 2, 3, 4, 5, 6}.begin(), 6, table.begin() + 2 * stride);
  EXPECT_EQ(dt.download(), table);
}

TEST(KvPoolGpu, BadScalarArgumentsThrow) {
  REQUIRE_GPU();
  DeviceBuffer<uint8_t> buf(1 << 16), ws(cuda::kMoveWorkspaceBytes);
  DeviceBuffer<int32_t> i32(64);
  cuda::DeviceCache c{buf.ptr, 4, 8, kRowWidth, kElem};
  auto moves = reinterpret_cast<const PageMove*>(i32.ptr);
  expect_error([&] { cuda::apply_page_moves({c, moves, i32.ptr, 3, 0}, ws.ptr, 0); }, "num_waves");
  expect_error([&] { cuda::apply_page_moves({c, moves, i32.ptr, -1, 0}, ws.ptr, 0); }, "num_moves");
  cuda::DeviceCache bad = c;
  bad.page_size = 3;
  expect_error(
      [&] {
        cuda::apply_page_moves({bad, moves, i32.ptr, 1, 1}, ws.ptr, 0);
      },
      "page_size");
  bad = c;
  bad.row_width = 575;
  expect_error(
      [&] {
        cuda::apply_page_moves({bad, moves, i32.ptr, 1, 1}, ws.ptr, 0);
      },
      "multiple of 16");
  bad = c;
  bad.num_pages = 0;
  expect_error(
      [&] {
        cuda::apply_page_moves({bad, moves, i32.ptr, 1, 1}, ws.ptr, 0);
      },
      "num_pages");
  cuda::AcceptParams ap{1,       0,       i32.ptr, i32.ptr, i32.ptr,
                        i32.ptr, i32.ptr, i32.ptr, i32.ptr, nullptr};
  expect_error([&] { cuda::accept_paths(ap, 0); }, "max_accept");
  ap.max_accept = kMaxTreeNodes + 1;
  expect_error([&] { cuda::accept_paths(ap, 0); }, "max_accept");
  ap.max_accept = 4;
  ap.batch = 0;
  expect_error([&] { cuda::accept_paths(ap, 0); }, "batch");
  cuda::CommitParams cp{c,       1,       4,       -1,      i32.ptr,
                        i32.ptr, i32.ptr, i32.ptr, i32.ptr, nullptr};  // 0 is valid
  expect_error([&] { cuda::commit_accepted(cp, 0); }, "page_table_stride");
  cp.page_table_stride = 2;
  cp.new_seq_lens = nullptr;
  expect_error([&] { cuda::commit_accepted(cp, 0); }, "new_seq_lens");
  cuda::PageTableUpdateParams tp{i32.ptr, 1, -1, 4, i32.ptr, i32.ptr, i32.ptr, 1};  // 0 is valid
  expect_error([&] { cuda::update_page_tables(tp, ws.ptr, 0); }, "stride");
}

// ---- device-driven commit ----------------------------------------------------------------------

// Rows [prefix + accepted[k]] -> [prefix + k] in increasing k on the host mirror (the spec).
void host_commit(CachePair& c, const std::vector<int32_t>& table_row, int64_t prefix,
                 std::span<const int32_t> acc) {
  auto slot = [&](int64_t row) {
    return kvpool::RowSlot{table_row[row / c.cfg.page_size], int32_t(row % c.cfg.page_size)};
  };
  for (size_t k = 1; k < acc.size(); ++k) {
    if (acc[k] == int32_t(k)) continue;
    std::memcpy(&c.mirror[c.offset(slot(prefix + int64_t(k)))],
                &c.mirror[c.offset(slot(prefix + acc[k]))], kRowBytes);
  }
}

TEST(KvPoolGpu, CommitRejectsBadInputsAndMovesNothing) {
  REQUIRE_GPU();
  const int B = 8, ps = 4, np = 40, stride = 4, MA = 6;
  CachePair c({np, ps, kRowWidth, kElem, FreePolicy::kAsFreed});
  std::vector<int32_t> table(B * stride), prefix(B, 3), len(B), acc(B * MA, -1);
  for (int i = 0; i < B * stride; ++i) table[i] = (i * 7 + 3) % np;  // 32 distinct scattered pages
  table[7 * stride + 2] = np;                                        // request 7: a bad page
  const std::vector<std::vector<int32_t>> paths{
      {0, 2, 5}, {0}, {0, 1, 2, 3, 4, 5, 6}, {1, 2}, {0, 3, 3}, {0, 1}, {0, 20}, {0, 5}};
  const std::vector<int32_t> lens{3, 0, 7, 2, 3, 2, 2, 2};
  prefix[5] = -1;
  for (int b = 0; b < B; ++b) {
    len[b] = lens[b];
    for (size_t k = 0; k < paths[b].size() && int(k) < MA; ++k) acc[b * MA + k] = paths[b][k];
  }
  DeviceBuffer<int32_t> dt(table.size()), dp(B), dl(B), da(acc.size()), dn(B), ds(B);
  upload(dt, table), upload(dp, prefix), upload(dl, len), upload(da, acc);
  cuda::commit_accepted({c.desc(), B, MA, stride, dt.ptr, dp.ptr, da.ptr, dl.ptr, dn.ptr, ds.ptr},
                        0);
  TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
  using S = cuda::KvStatus;
  const std::vector<S> want{S::kOk,      S::kBadAcceptLen, S::kBadAcceptLen, S::kBadPath,
                            S::kBadPath, S::kBadPrefixLen, S::kBadPage,      S::kBadPage};
  const auto st = ds.download();
  for (int b = 0; b < B; ++b)
    EXPECT_EQ(st[b], int(want[b])) << "request " << b << ": " << cuda::kv_status_name(S(st[b]));
  EXPECT_EQ(dn.download(), (std::vector<int32_t>{6, 3, 3, 3, 3, -1, 3, 3}));
  host_commit(c, std::vector<int32_t>(table.begin(), table.begin() + stride), 3, paths[0]);
  EXPECT_TRUE(c.device_matches());
}

// accept_paths + commit_accepted captured once; every round writes new trees, prefixes, page
// tables and cache contents into the same buffers and replays. A second graph commits paths the
// host writes (random prefixes of the accepted paths: every accepted length). Both must match
// the host reference, and eager calls (with new_seq_lens aliasing prefix_lens) must match too.
TEST(KvPoolGpu, CommitGraphReplayMatchesEagerAndHost) {
  REQUIRE_GPU();
  const int B = 6, ps = 16, MA = 24, max_q = 40, np = 160, stride = 32, max_prefix = 300;
  CachePair c({np, ps, kRowWidth, kElem, FreePolicy::kAsFreed});
  DeviceTrees d(B, MA, B * max_q);
  DeviceBuffer<int32_t> dprefix(B), dnew(B), dstatus(B), dtable(B * stride), dacc(B * MA), dlen(B),
      dnew2(B), dstatus2(B);
  cudaStream_t s;
  // A blocking stream: the synchronous uploads below (legacy default stream) are ordered before it.
  TREEMLA_CUDA_CHECK(cudaStreamCreate(&s));
  const cuda::CommitParams cp{
      c.desc(),       B,         MA,       stride,     dtable.ptr, dprefix.ptr,
      d.accepted.ptr, d.len.ptr, dnew.ptr, dstatus.ptr};
  const cuda::CommitParams cp2{c.desc(),    B,        MA,       stride,    dtable.ptr,
                               dprefix.ptr, dacc.ptr, dlen.ptr, dnew2.ptr, dstatus2.ptr};
  cudaGraph_t g1, g2;
  cudaGraphExec_t e1, e2;
  TREEMLA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cuda::accept_paths(d.params(), s);
  cuda::commit_accepted(cp, s);
  TREEMLA_CUDA_CHECK(cudaStreamEndCapture(s, &g1));
  TREEMLA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cuda::commit_accepted(cp2, s);
  TREEMLA_CUDA_CHECK(cudaStreamEndCapture(s, &g2));
  TREEMLA_CUDA_CHECK(cudaGraphInstantiate(&e1, g1, 0));
  TREEMLA_CUDA_CHECK(cudaGraphInstantiate(&e2, g2, 0));
  std::mt19937 rng(77);
  for (int round = 0; round < 16; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<Tree> trees;
    std::vector<int32_t> prefix(B), table(B * stride, np + 5);  // unused entries: invalid pages
    std::vector<int32_t> perm(np);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int used = 0;
    for (int b = 0; b < B; ++b) {
      trees.push_back(random_tree(1 + int(rng() % max_q), rng));
      if (round % 4 == 0) {  // a chain accepted whole (cut at MA): identity rows only
        Tree& t = trees[b];
        for (size_t i = 1; i < t.parents.size(); ++i)
          t.parents[i] = int32_t(i) - 1, t.targets[i - 1] = t.tokens[i];
      }
      prefix[b] = int32_t(rng() % max_prefix);
      const int pages = (prefix[b] + int(trees[b].parents.size()) + ps - 1) / ps;
      for (int k = 0; k < pages; ++k) table[b * stride + k] = perm[used++];
    }
    for (size_t r = 0; r < c.mirror.size() / kRowBytes; ++r)
      fill_row(&c.mirror[r * kRowBytes], mix(round) + r);
    const std::vector<uint8_t> base = c.mirror;
    // Host reference for the graph with device acceptance, and random cuts for the second graph.
    std::vector<int32_t> want_len(B), acc(B * MA, -1), cut_len(B);
    for (int b = 0; b < B; ++b) {
      std::vector<int32_t> nodes =
          tree::accept_path(trees[b].parents, trees[b].tokens, trees[b].targets).nodes;
      if (int(nodes.size()) > MA) nodes.resize(MA);
      want_len[b] = int32_t(nodes.size());
      cut_len[b] = 1 + int32_t(rng() % nodes.size());
      std::copy(nodes.begin(), nodes.end(), acc.begin() + b * MA);
      host_commit(
          c, std::vector<int32_t>(table.begin() + b * stride, table.begin() + (b + 1) * stride),
          prefix[b], nodes);
    }
    const std::vector<uint8_t> want_full = c.mirror;
    d.load(trees);
    upload(dprefix, prefix), upload(dtable, table), upload(dacc, acc), upload(dlen, cut_len);
    upload(c.dev, base);
    TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable upload may still be in flight
    TREEMLA_CUDA_CHECK(cudaGraphLaunch(e1, s));
    TREEMLA_CUDA_CHECK(cudaStreamSynchronize(s));
    d.expect_matches_host(trees);
    EXPECT_TRUE(c.device_matches());
    std::vector<int32_t> want_new(B);
    for (int b = 0; b < B; ++b) want_new[b] = prefix[b] + want_len[b];
    EXPECT_EQ(dnew.download(), want_new);
    EXPECT_EQ(dstatus.download(), std::vector<int32_t>(B, 0));
    // Eager, in place: new_seq_lens aliases prefix_lens.
    upload(c.dev, base);
    TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
    cuda::accept_paths(d.params(), s);
    cuda::CommitParams eager = cp;
    eager.new_seq_lens = dprefix.ptr;
    cuda::commit_accepted(eager, s);
    TREEMLA_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_TRUE(c.device_matches());
    EXPECT_EQ(dprefix.download(), want_new);
    upload(dprefix, prefix);
    TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
    // Second graph: host-written accepted paths of every length.
    c.mirror = base;
    for (int b = 0; b < B; ++b) {
      host_commit(
          c, std::vector<int32_t>(table.begin() + b * stride, table.begin() + (b + 1) * stride),
          prefix[b], std::span<const int32_t>(acc.data() + b * MA, size_t(cut_len[b])));
      want_new[b] = prefix[b] + cut_len[b];
    }
    upload(c.dev, base);
    TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
    TREEMLA_CUDA_CHECK(cudaGraphLaunch(e2, s));
    TREEMLA_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_TRUE(c.device_matches());
    EXPECT_EQ(dnew2.download(), want_new);
    EXPECT_EQ(dstatus2.download(), std::vector<int32_t>(B, 0));
    c.mirror = want_full;
  }
  cudaGraphExecDestroy(e1), cudaGraphExecDestroy(e2), cudaGraphDestroy(g1), cudaGraphDestroy(g2);
  cudaStreamDestroy(s);
}

// ---- random operation sequences driven by the host pool
// ------------------------------------------

// alloc / extend / free / truncate / commit rounds / defrag on a KvPool; every data-moving plan
// runs on the GPU. Commit rounds take one of three routes: host plans (merged, apply_row_moves),
// device commit of host-computed paths, or device acceptance + device commit. The model: each
// live request's row tags, rows written by the "engine" get fresh tags.
struct PoolSim {
  KvPool pool;
  CachePair cache;
  std::mt19937 rng;
  int max_slots, stride, max_tokens, max_q;
  std::map<int64_t, std::vector<uint64_t>> tags;
  std::map<int64_t, int> slot;
  std::vector<int> free_slots;
  DeviceBuffer<int32_t> table;  // [max_slots, stride], the requests' page-table rows on the device
  MoveRunner run;
  uint64_t next_tag = 1;
  int64_t next_id = 1;
  std::array<int, 3> commit_routes{};
  int defrags = 0, moves = 0;

  PoolSim(const PoolConfig& cfg, uint32_t seed, int slots, int max_tokens_, int max_q_)
      : pool(cfg),
        cache(cfg),
        rng(seed),
        max_slots(slots),
        stride(cfg.num_pages),
        max_tokens(max_tokens_),
        max_q(max_q_),
        table(size_t(slots) * cfg.num_pages) {
    for (int s = slots - 1; s >= 0; --s) free_slots.push_back(s);
    TREEMLA_CUDA_CHECK(cudaMemset(table.ptr, 0xff, table.count * 4));
  }
  int64_t pick() {
    auto it = tags.begin();
    std::advance(it, rng() % tags.size());
    return it->first;
  }
  bool fits(int64_t id, int64_t extra) {
    return pool.pages_for(pool.num_tokens(id) + extra) - int64_t(pool.pages(id).size()) <=
           pool.num_free_pages();
  }
  void write_rows(int64_t id, int64_t from, int64_t count) {  // the engine writes new rows
    auto& tg = tags[id];
    tg.resize(size_t(from));
    size_t run_begin = 0, run_end = 0;
    for (int64_t t = from; t < from + count; ++t) {
      tg.push_back(next_tag);
      const size_t off = cache.offset(pool.locate(id, t));
      cache.write_row(pool.locate(id, t), next_tag++);
      if (off != run_end) {
        if (run_end > run_begin) cache.push_rows(run_begin, run_end - run_begin);
        run_begin = off;
      }
      run_end = off + kRowBytes;
    }
    if (run_end > run_begin) cache.push_rows(run_begin, run_end - run_begin);
  }
  void push_table(int64_t id) {
    const std::vector<int32_t> row = pool.page_table_row(id, stride, -1);
    TREEMLA_CUDA_CHECK(cudaMemcpy(table.ptr + size_t(slot.at(id)) * stride, row.data(),
                                  row.size() * 4, cudaMemcpyHostToDevice));
  }
  void alloc() {
    const int64_t n = rng() % max_tokens;
    if (free_slots.empty() || pool.pages_for(n) > pool.num_free_pages()) return;
    const int64_t id = next_id++;
    pool.alloc(id, n);
    slot[id] = free_slots.back();
    free_slots.pop_back();
    write_rows(id, 0, n);
    push_table(id);
  }
  void extend() {
    const int64_t id = pick(), n = rng() % (max_tokens / 4 + 1), old = pool.num_tokens(id);
    if (!fits(id, n)) return;
    pool.extend(id, n);
    write_rows(id, old, n);
    push_table(id);
  }
  void release() {
    const int64_t id = pick();
    pool.free(id);
    tags.erase(id);
    free_slots.push_back(slot.at(id));
    slot.erase(id);
  }
  void truncate() {
    const int64_t id = pick(), n = rng() % (pool.num_tokens(id) + 1);
    pool.truncate(id, n);
    tags[id].resize(size_t(n));
    push_table(id);
  }
  void commit() {
    struct Part {
      int64_t id, prefix;
      Tree tree;
      std::vector<int32_t> acc;
    };
    std::vector<Part> parts;
    for (int i = 0, m = 1 + int(rng() % 4); i < m; ++i) {
      const int64_t id = pick();
      Tree t = random_tree(1 + int(rng() % max_q), rng);
      const int64_t q = int64_t(t.parents.size());
      if (!fits(id, q) ||
          std::any_of(parts.begin(), parts.end(), [&](const Part& p) { return p.id == id; }))
        continue;
      const int64_t prefix = pool.num_tokens(id);
      pool.extend(id, q);
      write_rows(id, prefix, q);  // the tree tail, node j at row prefix + j
      push_table(id);
      std::vector<int32_t> acc = tree::accept_path(t.parents, t.tokens, t.targets).nodes;
      parts.push_back({id, prefix, std::move(t), std::move(acc)});
    }
    if (parts.empty()) return;
    const int route = int(rng() % 3);
    ++commit_routes[route];
    const PoolConfig& cfg = pool.config();
    if (route == 0) {
      std::vector<CommitPlan> plans;
      for (const Part& p : parts) plans.push_back(pool.commit_accepted(p.id, p.prefix, p.acc));
      for (const CommitPlan& plan : plans) kvpool::apply_plan(cfg, plan, cache.mirror.data());
      const cuda::RowMoveBatch batch = cuda::merge_commit_plans(plans);
      run.apply(cache.desc(), batch.moves, batch.wave_offsets);
      moves += int(batch.moves.size());
    } else {
      // The whole slot table is the batch; other slots commit a 1-node tree (no move).
      const int B = max_slots, MA = max_q;
      std::vector<Tree> trees(B, Tree{{-1}, {0}, {0}});
      std::vector<int32_t> prefix(B, 0), acc(B * MA, -1), len(B, 1), want_new(B, 1);
      for (int b = 0; b < B; ++b) acc[b * MA] = 0;
      int total = 0;
      for (const Part& p : parts) {
        const int s = slot.at(p.id);
        trees[s] = p.tree;
        prefix[s] = int32_t(p.prefix);
        std::copy(p.acc.begin(), p.acc.end(), acc.begin() + s * MA);
        len[s] = int32_t(p.acc.size());
        want_new[s] = int32_t(p.prefix + len[s]);
      }
      for (const Tree& t : trees) total += int(t.parents.size());
      DeviceTrees dtr(B, MA, total);
      DeviceBuffer<int32_t> dprefix(B), dacc(acc.size()), dlen(B), dnew(B), dstatus(B);
      upload(dprefix, prefix);
      cuda::CommitParams cp{cache.desc(), B,        MA,       stride,   table.ptr,
                            dprefix.ptr,  dacc.ptr, dlen.ptr, dnew.ptr, dstatus.ptr};
      if (route == 2) {
        dtr.load(trees);
        cuda::accept_paths(dtr.params(), 0);
        TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
        dtr.expect_matches_host(trees);
        cp.accepted = dtr.accepted.ptr;
        cp.accept_len = dtr.len.ptr;
      } else {
        upload(dacc, acc), upload(dlen, len);
      }
      cuda::commit_accepted(cp, 0);
      TREEMLA_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(dnew.download(), want_new);
      EXPECT_EQ(dstatus.download(), std::vector<int32_t>(B, 0));
      // Bookkeeping afterwards: the same moves, already made on the device (mirror only).
      for (const Part& p : parts) {
        const CommitPlan plan = pool.commit_accepted(p.id, p.prefix, p.acc);
        kvpool::apply_plan(cfg, plan, cache.mirror.data());
        moves += int(plan.moves.size());
      }
    }
    for (const Part& p : parts) {
      std::vector<uint64_t>& tg = tags[p.id];
      std::vector<uint64_t> next(tg.begin(), tg.begin() + p.prefix);
      for (int32_t a : p.acc) next.push_back(tg[size_t(p.prefix + a)]);
      tg = std::move(next);
      push_table(p.id);
    }
  }
  void defrag() {
    DefragPlan plan;
    try {
      plan = rng() % 2 ? pool.defrag()
                       : pool.partial_defrag(int64_t(rng() % (pool.num_used_pages() + 1)));
    } catch (const Error&) {
      return;  // a full pool whose plan needs a scratch page: unchanged
    }
    ++defrags;
    moves += int(plan.moves.size());
    kvpool::apply_plan(pool.config(), plan, cache.mirror.data());
    run.apply(cache.desc(), plan.moves, plan.wave_offsets);
    const cuda::PageTableUpdateImage img =
        cuda::flatten_page_table_updates(plan.tables, [&](int64_t id) { return slot.at(id); });
    if (img.num_updates() == 0) return;
    DeviceBuffer<int32_t> r(img.rows.size()), o(img.offsets.size()), p(img.pages.size());
    upload(r, img.rows), upload(o, img.offsets), upload(p, img.pages);
    cuda::update_page_tables({table.ptr, max_slots, stride, pool.config().num_pages, r.ptr, o.ptr,
                              p.ptr, img.num_updates()},
                             run.ws.ptr, 0);
    cuda::check_move_status(run.ws.ptr, 0);
  }
  // Every live row holds its tag's bytes (mirror; the device equals the mirror) and the device
  // page tables equal the host's.
  void check_model() {
    pool.check_invariants();
    ASSERT_TRUE(cache.device_matches());
    std::vector<uint8_t> row(kRowBytes);
    const std::vector<int32_t> dev_table = table.download();
    for (const auto& [id, tg] : tags) {
      ASSERT_EQ(pool.num_tokens(id), int64_t(tg.size()));
      for (size_t t = 0; t < tg.size(); ++t) {
        fill_row(row.data(), tg[t]);
        ASSERT_EQ(std::memcmp(row.data(), &cache.mirror[cache.offset(pool.locate(id, int64_t(t)))],
                              kRowBytes),
                  0)
            << "request " << id << " row " << t << " lost";
      }
      const std::vector<int32_t>& pages = pool.pages(id);
      ASSERT_TRUE(
          std::equal(pages.begin(), pages.end(), dev_table.begin() + size_t(slot.at(id)) * stride))
          << "device page table of request " << id;
    }
  }
};

void run_sim(int page_size, int num_pages, int ops, uint32_t seed) {
  const FreePolicy policy = seed % 2 ? FreePolicy::kSorted : FreePolicy::kAsFreed;
  const int capacity = page_size * num_pages;
  PoolSim sim({num_pages, page_size, kRowWidth, kElem, policy}, seed, 24, capacity / 8, 48);
  for (int i = 0; i < ops; ++i) {
    const int r = int(sim.rng() % 100);
    bool moved = false;
    if (sim.tags.empty() || r < 20)
      sim.alloc();
    else if (r < 32)
      sim.extend();
    else if (r < 42)
      sim.release();
    else if (r < 46)
      sim.truncate();
    else if (r < 86)
      sim.commit(), moved = true;
    else
      sim.defrag(), moved = true;
    if (::testing::Test::HasFailure()) FAIL() << "at operation " << i;
    if (moved) ASSERT_TRUE(sim.cache.device_matches()) << "after operation " << i;
    if (i % 200 == 199) ASSERT_NO_FATAL_FAILURE(sim.check_model()) << "after operation " << i;
  }
  ASSERT_NO_FATAL_FAILURE(sim.check_model());
  // Every route ran and data really moved.
  EXPECT_GT(sim.commit_routes[0], 0);
  EXPECT_GT(sim.commit_routes[1], 0);
  EXPECT_GT(sim.commit_routes[2], 0);
  EXPECT_GT(sim.defrags, 0);
  EXPECT_GT(sim.moves, ops / 10);
}

TEST(KvPoolGpu, RandomOpsPageSize1) {
  REQUIRE_GPU();
  run_sim(1, 1500, 2500, 1);
  run_sim(1, 1500, 1500, 2);
}
TEST(KvPoolGpu, RandomOpsPageSize16) {
  REQUIRE_GPU();
  run_sim(16, 300, 2000, 3);
  run_sim(16, 300, 1500, 4);
}
TEST(KvPoolGpu, RandomOpsPageSize64) {
  REQUIRE_GPU();
  run_sim(64, 100, 1500, 5);
  run_sim(64, 100, 1500, 6);
}

}  // namespace
}  // namespace treemla::test
