// treemla_sim: the serving loop over a churning KV pool, on synthetic data (simulation.h says
// what a round does).
//
// Two random streams, both seeded from the seed: `control` decides arrivals, lengths, drafts and
// target choices; `data` fills latent rows and queries. So the serving trajectory (acceptance,
// churn, defrags) does not change with --heads or the backend. Integers and uniforms are drawn
// from raw mt19937 outputs, not the standard distributions, so a seed means the same run on every
// standard library.
//
// With --device cuda the bytes live on the GPU (cuda_backend.cpp) and each round also accepts
// and commits on the device (SimBackend::device_commit), checked against the host's
// tree::accept_path; at the end a fragmentation report times the prefix pass on the churned
// pool, after a full defrag and in a fresh contiguous cache. The trajectory (acceptance, churn,
// defrags) is the CPU one for the same seed; attention outputs, and so the trace, differ.
//
// With a cost model (SimulationConfig::cost_model) every request-round is also costed from the
// cost table; with --budget auto each request's tree is built at the largest budget and cut to
// the budget the picker chooses (budget_model.h), its calibration measured online.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/backend.h"
#include "sim/budget_model.h"
#include "sim/simulation.h"
#include "sim/synthetic.h"
#include "treemla/attention.h"
#include "treemla/budget.h"
#include "treemla/dtype.h"
#include "treemla/error.h"
#include "treemla/kvpool.h"
#include "treemla/tree.h"

namespace treemla::tool {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  v *= 0x9e3779b97f4a7c15ull;
  v ^= v >> 32;
  return (h ^ v) * 0x100000001b3ull + 0x632be59bd9b4e019ull;
}

constexpr float kSmScale = 0.0625f;  // GLM-5's 1/sqrt(256)

struct LiveRequest {
  int64_t id = 0;
  int64_t to_generate = 0;
  int64_t generated = 0;
  int32_t bonus = 0;           // the next tree's root token
  std::vector<uint64_t> rows;  // hash of every committed row: what the cache must hold
  bool gone = false;           // finished or cut short this round; removed at the round's end
};

struct Pending {  // the next arrival, drawn once so that a deferred request keeps its lengths
  bool valid = false;
  int64_t prompt = 0, to_generate = 0;
  int32_t bonus = 0;
};

struct Work {                  // one request's share of a round
  size_t live = 0;             // index into the live list
  int64_t prefix = 0;          // committed rows before the tree
  Draft draft;                 // the drafter's top-K per depth
  tree::DDTree tree;           // the tree verified
  std::vector<uint64_t> tail;  // hashes of the tree rows as written
};

class Simulation {
 public:
  Simulation(const SimulationConfig& c, const SimulationHooks& hooks)
      : cfg_(validated(c)),
        hooks_(hooks),
        control_(c.seed),
        data_(c.seed ^ 0x5bd1e995u),
        nodes_(tree_nodes(c)),
        pool_(pool_config(c)),
        target_(parse_target(c.target)),
        calibration_(c.cost_model.calibration_window) {
    const BackendLimits limits{c.max_requests, int64_t{c.max_requests} * nodes_, c.heads};
    backend_ = hooks.backend ? hooks.backend(pool_.config(), limits)
                             : make_backend(c.device, pool_.config(), limits);
    report_.num_pages = pool_.config().num_pages;
    report_.tree_nodes = nodes_;
    report_.acceptance_histogram.assign(static_cast<size_t>(c.depth) + 2, 0);
  }

  SimulationReport run() {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 1; r <= cfg_.rounds; ++r) round(r);
    report_.rounds = cfg_.rounds;
    report_.requests_live_at_end = static_cast<int64_t>(live_.size());
    report_.final_metrics = pool_.metrics();
    report_.trace = mix(trace_, static_cast<uint64_t>(report_.final_metrics.total_runs));
    report_.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // After the trace and the wall time: the report changes the pool (a full defrag) but not
    // what the run did.
    if (cfg_.frag_report == 1 || (cfg_.frag_report == -1 && cfg_.device == "cuda"))
      fragmentation_report();
    return report_;
  }

 private:
  static const SimulationConfig& validated(const SimulationConfig& c) {
    validate_config(c);
    return c;
  }

  static kvpool::PoolConfig pool_config(const SimulationConfig& c) {
    kvpool::PoolConfig p;
    p.num_pages = static_cast<int32_t>(c.num_pages > 0 ? c.num_pages : default_num_pages(c));
    p.page_size = c.page_size;
    p.row_width = kHeadDimQK;
    p.elem_size = 2;  // bf16
    p.policy = c.policy;
    return p;
  }

  void round(int64_t r) {
    report_progress(r, "drafting", 0.0);
    admit();
    std::vector<Work> work = grow_trees();
    if (!work.empty()) verify_batch(work, r);
    commit_batch(work);
    std::erase_if(live_, [](const LiveRequest& q) { return q.gone; });
    maybe_defrag(r);
    if (cfg_.check_every > 0 && r % cfg_.check_every == 0) check_all_rows();
    if (hooks_.lines && cfg_.progress_every > 0 && r % cfg_.progress_every == 0) {
      report_progress(r, "", 1.0, true);
      print_progress(r);
    }
  }

  void report_progress(int64_t r, const char* activity, double round_fraction,
                       bool line_follows = false) {
    if (!hooks_.progress) return;
    RunProgress p;
    p.round = r;
    p.rounds = cfg_.rounds;
    p.round_fraction = round_fraction;
    p.activity = activity;
    p.line_follows = line_follows;
    hooks_.progress(p);
  }

  // While the backend runs `call`, reports its work as the share [first, first + share) of round r.
  template <class Call>
  void with_progress(int64_t r, const char* activity, double first, double share, Call&& call) {
    if (hooks_.progress)
      backend_->set_work_callback(
          [=, this](double f) { report_progress(r, activity, first + share * f); });
    call();
    backend_->set_work_callback(nullptr);
  }

  // Admits arrivals while there is a free slot and room for the prompt and its first tree.
  void admit() {
    while (static_cast<int>(live_.size()) < cfg_.max_requests) {
      if (!pending_.valid) {
        pending_.prompt = control_.uniform_int(cfg_.prompt_min, cfg_.prompt_max);
        pending_.to_generate = control_.uniform_int(cfg_.gen_min, cfg_.gen_max);
        pending_.bonus = static_cast<int32_t>(control_.uniform_int(0, kVocab - 1));
        pending_.valid = true;
      }
      if (pool_.pages_for(pending_.prompt + nodes_) > pool_.num_free_pages()) {
        ++report_.admission_deferrals;
        return;
      }
      LiveRequest q;
      q.id = next_id_++;
      q.to_generate = pending_.to_generate;
      q.bonus = pending_.bonus;
      pool_.alloc(q.id, pending_.prompt);
      q.rows = write_random_rows(q.id, 0, pending_.prompt);
      live_.push_back(std::move(q));
      pending_.valid = false;
      ++report_.requests_admitted;
      trace_ = mix(trace_, static_cast<uint64_t>(pending_.prompt));
    }
  }

  // Fills logical rows [first, first + count) of a request with random latent rows (the target
  // model's KV) and returns their hashes. Written in chunks so that a 128k-token prompt never
  // sits whole in host memory; the random stream is drawn in the same order either way.
  std::vector<uint64_t> write_random_rows(int64_t id, int64_t first, int64_t count) {
    constexpr int64_t kChunk = 8192;
    const size_t w = kHeadDimQK;
    std::vector<uint64_t> hashes(static_cast<size_t>(count));
    std::vector<uint16_t> data;
    std::vector<kvpool::RowSlot> slots;
    for (int64_t c0 = 0; c0 < count; c0 += kChunk) {
      const int64_t n = std::min(kChunk, count - c0);
      data.resize(static_cast<size_t>(n) * w);
      for (uint16_t& x : data) x = float_to_bf16(data_.symmetric());
      slots.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        slots[static_cast<size_t>(i)] = pool_.locate(id, first + c0 + i);
      backend_->write_rows(slots, data);
      for (int64_t i = 0; i < n; ++i)
        hashes[static_cast<size_t>(c0 + i)] =
            hash_row(data.data() + static_cast<size_t>(i) * w, kHeadDimQK);
    }
    return hashes;
  }

  // The drafter (synthetic.h) and the tree: built at the configured budget, then with --budget
  // auto cut to the first 1 + B nodes, B picked from the tree's scores and the cost model.
  void draft(Work& w, int32_t bonus) {
    w.draft = draw_draft(control_, cfg_.depth, cfg_.top_k, cfg_.draft_logit_range);
    w.tree = tree::build_ddtree(w.draft.view(), bonus, cfg_.budget, cfg_.depth);
    if (cfg_.budget_auto) {
      const int32_t b = pick_auto_budget(cfg_.cost_model, w.tree, w.prefix, calibration_.value());
      w.tree = truncate_ddtree(w.tree, b);
    }
  }

  // Drafts a tree for every live request and appends its rows; a request whose tree does not fit
  // in the pool is finished early, which frees its pages for the others.
  std::vector<Work> grow_trees() {
    std::vector<Work> work;
    for (size_t i = 0; i < live_.size(); ++i) {
      LiveRequest& q = live_[i];
      const int64_t len = pool_.num_tokens(q.id);
      const int64_t extra =
          pool_.pages_for(len + nodes_) - static_cast<int64_t>(pool_.pages(q.id).size());
      if (extra > pool_.num_free_pages()) {
        pool_.free(q.id);
        q.gone = true;
        ++report_.requests_cut_short;
        trace_ = mix(trace_, 0xc0ffee ^ static_cast<uint64_t>(q.id));
        continue;
      }
      Work w;
      w.live = i;
      w.prefix = len;
      draft(w, q.bonus);
      pool_.extend(q.id, w.tree.size());
      w.tail = write_random_rows(q.id, len, w.tree.size());
      work.push_back(std::move(w));
    }
    report_.peak_pages_used = std::max(report_.peak_pages_used, pool_.num_used_pages());
    return work;
  }

  // The host arrays of one verify call over the requests `ids` with the given trees and prefixes,
  // and random queries. Page-table rows cover prefix + tree rows; entries past a request's pages
  // are page 0 (never read).
  struct Batch {
    tree::BatchLayout layout;
    std::vector<int64_t> ids;
    std::vector<int32_t> table;
    std::vector<uint16_t> q;
    int64_t stride = 1;
  };
  Batch make_batch(std::vector<int64_t> ids, const std::vector<std::vector<int32_t>>& trees,
                   const std::vector<int32_t>& prefix) {
    Batch bt;
    bt.ids = std::move(ids);
    for (size_t b = 0; b < bt.ids.size(); ++b) {
      bt.stride =
          std::max({bt.stride, static_cast<int64_t>(pool_.pages(bt.ids[b]).size()),
                    pool_.pages_for(int64_t{prefix[b]} + static_cast<int64_t>(trees[b].size()))});
    }
    bt.layout = tree::build_batch_layout(trees, prefix);
    bt.table.resize(bt.ids.size() * static_cast<size_t>(bt.stride));
    refresh_table(bt);
    bt.q.resize(static_cast<size_t>(bt.layout.total_q) * cfg_.heads * kHeadDimQK);
    for (uint16_t& x : bt.q) x = float_to_bf16(data_.symmetric());
    return bt;
  }
  void refresh_table(Batch& bt) const {  // after the pool moved pages
    for (size_t b = 0; b < bt.ids.size(); ++b)
      pool_.page_table_row(bt.ids[b], bt.table.data() + b * bt.stride, bt.stride, 0);
  }
  VerifyParams params(const Batch& bt) const {
    VerifyParams p;
    p.dtype = DType::kBF16;
    p.batch = static_cast<int>(bt.ids.size());
    p.num_heads = cfg_.heads;
    p.page_size = cfg_.page_size;
    p.num_pages = pool_.config().num_pages;
    p.page_table_stride = static_cast<int>(bt.stride);
    p.mask_words = bt.layout.mask_words;
    p.sm_scale = kSmScale;
    p.q = bt.q.data();
    p.page_table = bt.table.data();
    p.prefix_lens = bt.layout.prefix_lens.data();
    p.q_indptr = bt.layout.q_indptr.data();
    p.tree_mask = bt.layout.tree_mask.data();
    return p;
  }

  void verify_batch(std::vector<Work>& work, int64_t r) {
    const int H = cfg_.heads;
    std::vector<int64_t> ids;
    std::vector<std::vector<int32_t>> trees;
    std::vector<int32_t> prefix;
    for (const Work& w : work) {
      ids.push_back(live_[w.live].id);
      trees.push_back(w.tree.parents);
      prefix.push_back(static_cast<int32_t>(w.prefix));
    }
    const Batch bt = make_batch(std::move(ids), trees, prefix);
    const VerifyParams p = params(bt);
    const size_t rows = static_cast<size_t>(bt.layout.total_q) * H;
    std::vector<float> o(rows * kHeadDimV), lse(rows);
    // The attention work of the round: verify, and on due rounds the cross-check (about as much).
    const bool check_due = cfg_.check_every > 0 && r % cfg_.check_every == 0;
    const double verify_share = check_due ? 0.5 : 1.0;
    const auto t0 = std::chrono::steady_clock::now();
    with_progress(r, "verify", 0.0, verify_share,
                  [&] { backend_->verify(p, o.data(), lse.data()); });
    report_.verify_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++report_.verify_calls;
    const double gpu_ms = backend_->last_gpu_ms();
    if (gpu_ms >= 0) report_.gpu.verify_ms.push_back(gpu_ms);

    // Every row sees its prefix and itself, so every output and LSE must be finite.
    for (float x : o) report_.nonfinite_outputs += !std::isfinite(x);
    for (float x : lse) report_.nonfinite_outputs += !std::isfinite(x);
    for (float x : lse) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      trace_ = mix(trace_, u);
    }
    // FLOPs: QK^T and PV over every visible key (prefix + the node's ancestors and itself).
    double flops = 0;
    int64_t longest = 0;
    for (const Work& w : work) {
      int64_t keys = 0;
      for (int32_t d : w.tree.depths) keys += w.prefix + d + 1;
      flops += 2.0 * H * double(keys) * (kHeadDimQK + kHeadDimV);
      longest = std::max(longest, w.prefix);
    }
    report_.verify_flops += flops;
    if (gpu_ms >= 0) report_.gpu.verify_flops += flops;
    if (check_due) {
      if (cfg_.check_max_context > 0 && longest > cfg_.check_max_context) {
        ++report_.cross_checks_skipped;
      } else {
        with_progress(r, "cross-check", verify_share, 1.0 - verify_share,
                      [&] { cross_check(p, o, lse); });
      }
    }
  }

  // Raises diff to the largest |got - ref| of o and lse; false if an element is outside the
  // backend's tolerance (NaN fails).
  bool agrees(const std::vector<float>& o, const std::vector<float>& o_ref,
              const std::vector<float>& lse, const std::vector<float>& lse_ref,
              double& diff) const {
    const VerifyTolerance tol = backend_->tolerance();
    bool ok = o.size() == o_ref.size() && lse.size() == lse_ref.size();
    auto compare = [&](const std::vector<float>& got, const std::vector<float>& ref, double atol,
                       double rtol) {
      for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
        const double d = std::fabs(got[i] - ref[i]);
        diff = std::max(diff, d);
        ok = ok && d <= atol + rtol * std::fabs(double(ref[i]));
      }
    };
    compare(o, o_ref, tol.o_atol, tol.o_rtol);
    compare(lse, lse_ref, tol.lse_atol, tol.lse_rtol);
    return ok;
  }

  // The backend's verify against the specification on the same inputs (the CPU split design
  // agrees to float rounding).
  void cross_check(const VerifyParams& p, const std::vector<float>& o,
                   const std::vector<float>& lse) {
    std::vector<float> o_ref(o.size()), lse_ref(lse.size());
    backend_->verify_reference(p, o_ref.data(), lse_ref.data());
    if (!agrees(o, o_ref, lse, lse_ref, report_.cross_check_max_diff))
      ++report_.cross_check_failures;
    ++report_.cross_checks;
  }

  // Target tokens for every request first, in batch order (the same draws as one request at a
  // time), then either the device accepts and commits the whole batch or the host does it
  // request by request. Either way the host bookkeeping changes in the same order.
  void commit_batch(std::vector<Work>& work) {
    if (work.empty()) return;
    std::vector<std::vector<int32_t>> targets;
    std::vector<int32_t> parents, tokens, flat_targets;
    for (const Work& w : work) {
      targets.push_back(draw_target(control_, target_, w.draft, w.tree, cfg_.accept_prob));
      parents.insert(parents.end(), w.tree.parents.begin(), w.tree.parents.end());
      tokens.insert(tokens.end(), w.tree.tokens.begin(), w.tree.tokens.end());
      flat_targets.insert(flat_targets.end(), targets.back().begin(), targets.back().end());
    }
    // A path holds one node per depth, so depth + 1 nodes bound it: nothing is ever cut.
    const int max_accept = std::min(cfg_.depth + 1, kMaxTreeNodes);
    DeviceCommitResult dev;
    const bool on_device = backend_->device_commit(parents, tokens, flat_targets, max_accept, dev);
    if (on_device) {
      report_.device_commit = true;
      report_.gpu.commit_ms.push_back(backend_->last_gpu_ms());
    }
    for (size_t i = 0; i < work.size(); ++i)
      accept_and_commit(work[i], targets[i], on_device ? &dev : nullptr, i);
  }

  // dev: the device's acceptance and commit of this request (index b of the batch), already
  // applied to the cache; null when the host commits.
  void accept_and_commit(Work& w, const std::vector<int32_t>& target, const DeviceCommitResult* dev,
                         size_t b) {
    LiveRequest& q = live_[w.live];
    tree::Acceptance acc = tree::accept_path(w.tree.parents, w.tree.tokens, target);
    if (dev) {
      // The host walk is the specification; the bookkeeping follows what the device moved.
      tree::Acceptance got;
      const int32_t len = dev->accept_len[b];
      const int32_t* row = dev->accepted.data() + b * static_cast<size_t>(dev->max_accept);
      got.nodes.assign(row, row + len);
      got.length = len;
      got.bonus_token = dev->bonus_tokens[b];
      if (got.nodes != acc.nodes || got.bonus_token != acc.bonus_token ||
          dev->new_seq_lens[b] != w.prefix + len)
        ++report_.accept_mismatches;
      acc = std::move(got);
    }
    const int64_t n = acc.length;

    // The tree library's logical plan and the pool's physical one must describe the same commit.
    const tree::CommitPlan logical =
        tree::plan_commit(w.tree.parents, acc.nodes, static_cast<int32_t>(w.prefix));
    const kvpool::CommitPlan plan = pool_.commit_accepted(q.id, w.prefix, acc.nodes);
    if (!dev) backend_->apply_commit(plan);  // the device commit already made these very moves
    if (logical.new_len != plan.num_tokens || logical.copies.size() != plan.moves.size())
      ++report_.commit_plan_mismatches;
    report_.commit_row_moves += static_cast<int64_t>(plan.moves.size());
    report_.commit_pages_released += static_cast<int64_t>(plan.released_pages.size());

    // The committed rows must now hold exactly the accepted nodes' rows, in path order.
    std::vector<kvpool::RowSlot> slots(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k)
      slots[static_cast<size_t>(k)] = pool_.locate(q.id, w.prefix + k);
    const std::vector<uint64_t> got = backend_->hash_rows(slots);
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t want = w.tail[static_cast<size_t>(acc.nodes[static_cast<size_t>(k)])];
      report_.row_mismatches += got[static_cast<size_t>(k)] != want;
      q.rows.push_back(want);
    }
    report_.rows_checked += n;
    if (cfg_.cost_model.on()) {
      report_.cost.add(cfg_.cost_model, w.tree, w.prefix, n);
      if (cfg_.budget_auto) {
        const auto scores = std::span(w.tree.scores).subspan(1);
        calibration_.add(double(n - 1), expected_tokens(scores, w.tree.size() - 1) - 1.0);
        report_.calibration = calibration_.value();
      }
    }

    ++report_.request_rounds;
    report_.tokens_committed += n;
    ++report_.acceptance_histogram[static_cast<size_t>(std::min<int64_t>(n, cfg_.depth + 1))];
    q.generated += n;
    q.bonus = acc.bonus_token;
    trace_ = mix(mix(trace_, static_cast<uint64_t>(n)), static_cast<uint64_t>(acc.bonus_token));
    if (q.generated >= q.to_generate) {
      pool_.free(q.id);
      q.gone = true;
      ++report_.requests_finished;
    }
  }

  void maybe_defrag(int64_t r) {
    const kvpool::PoolMetrics before = pool_.metrics();
    const double rpr = runs_per_request(before);
    if (cfg_.defrag_threshold <= 0.0 || rpr <= cfg_.defrag_threshold || rpr <= 1.0) return;
    kvpool::DefragPlan plan;
    try {
      plan =
          cfg_.defrag_max_moves > 0 ? pool_.partial_defrag(cfg_.defrag_max_moves) : pool_.defrag();
    } catch (const Error&) {
      // Only a full pool may refuse (a cycle needs one free page); the pool is left unchanged.
      if (pool_.num_free_pages() > 0) throw;
      ++report_.defrags_skipped;
      return;
    }
    if (plan.moves.empty()) {  // a partial defrag found no request it could fix within its budget
      ++report_.defrags_without_moves;
      return;
    }
    backend_->apply_defrag(plan);
    if (const double ms = backend_->last_gpu_ms(); ms >= 0) {
      report_.gpu.defrag_ms.push_back(ms);
      report_.gpu.defrag_bytes +=
          static_cast<int64_t>(plan.moves.size()) * pool_.config().page_bytes();
    }
    const kvpool::PoolMetrics after = pool_.metrics();
    DefragEvent e;
    e.round = r;
    e.runs_per_request_before = rpr;
    e.runs_per_request_after = runs_per_request(after);
    e.mean_run_before = before.mean_run_length;
    e.mean_run_after = after.mean_run_length;
    e.pages_relocated = plan.pages_relocated;
    e.moves = static_cast<int64_t>(plan.moves.size());
    report_.defrags.push_back(e);
    report_.pages_relocated += e.pages_relocated;
    report_.defrag_moves += e.moves;
    trace_ = mix(trace_, static_cast<uint64_t>(e.moves));
    check_all_rows();  // every byte of every live request must read back the same
  }

  void check_all_rows() {
    for (const LiveRequest& q : live_) {
      const int64_t len = pool_.num_tokens(q.id);
      if (len != static_cast<int64_t>(q.rows.size())) {
        report_.row_mismatches += std::abs(len - static_cast<int64_t>(q.rows.size()));
        continue;
      }
      std::vector<kvpool::RowSlot> slots(static_cast<size_t>(len));
      for (int64_t t = 0; t < len; ++t) slots[static_cast<size_t>(t)] = pool_.locate(q.id, t);
      const std::vector<uint64_t> got = backend_->hash_rows(slots);
      for (size_t t = 0; t < got.size(); ++t) report_.row_mismatches += got[t] != q.rows[t];
      report_.rows_checked += len;
    }
  }

  // The prefix pass of the live requests on three layouts of the same rows: the pool as the run
  // left it, after a full defrag, and a fresh page-size-64 cache with each request contiguous.
  // Each request keeps its current length as the prefix and gets a chain of nodes_ query rows
  // (the prefix pass reads no tail row). Outputs must agree across layouts.
  void fragmentation_report() {
    FragmentationReport& f = report_.frag;
    std::vector<int64_t> ids;
    std::vector<int32_t> prefix;
    for (const LiveRequest& q : live_) {
      ids.push_back(q.id);
      prefix.push_back(static_cast<int32_t>(pool_.num_tokens(q.id)));
      f.prefix_rows += prefix.back();
    }
    if (ids.empty()) {
      f.skipped = "no live requests at the end of the run";
      return;
    }
    std::vector<int32_t> chain(static_cast<size_t>(nodes_));
    for (int i = 0; i < nodes_; ++i) chain[static_cast<size_t>(i)] = i - 1;
    Batch bt = make_batch(ids, std::vector<std::vector<int32_t>>(ids.size(), chain), prefix);
    f.batch = static_cast<int>(ids.size());
    f.q_len = nodes_;
    f.heads = cfg_.heads;
    f.reps = cfg_.frag_reps;
    f.kv_bytes = double(f.prefix_rows) * kHeadDimQK * 2;
    f.flops = 2.0 * cfg_.heads * nodes_ * double(f.prefix_rows) * (kHeadDimQK + kHeadDimV);

    PrefixTiming base, t;
    if (!backend_->time_prefix_pass(params(bt), cfg_.frag_reps, base)) {
      f.skipped = std::string("the ") + backend_->name() + " backend does not time kernels";
      return;
    }
    f.measured = true;
    auto record = [&](FragLayout& l, const PrefixTiming& pt, int page_size, double runs,
                      double pages_per_run) {
      l = {true, page_size, runs, pages_per_run, pt.median_ms, pt.min_ms};
      double diff = 0;
      if (&pt != &base && !agrees(pt.o, base.o, pt.lse, base.lse, diff))
        ++report_.layout_mismatches;
      f.max_diff = std::max(f.max_diff, diff);
    };
    kvpool::PoolMetrics m = pool_.metrics();
    record(f.churned, base, cfg_.page_size, runs_per_request(m), m.mean_run_length);

    kvpool::DefragPlan plan;
    bool defragged = true;
    try {
      plan = pool_.defrag();
    } catch (const Error&) {
      if (pool_.num_free_pages() > 0) throw;  // only a full pool may refuse (as in maybe_defrag)
      defragged = false;
    }
    if (defragged) {
      backend_->apply_defrag(plan);
      f.final_defrag_moves = static_cast<int64_t>(plan.moves.size());
      f.final_defrag_bytes = f.final_defrag_moves * pool_.config().page_bytes();
      f.final_defrag_ms = std::max(0.0, backend_->last_gpu_ms());
      check_all_rows();
      refresh_table(bt);
      backend_->time_prefix_pass(params(bt), cfg_.frag_reps, t);
      m = pool_.metrics();
      record(f.defragged, t, cfg_.page_size, runs_per_request(m), m.mean_run_length);
    }

    constexpr int kFreshPageSize = 64;
    backend_->time_prefix_pass_contiguous(params(bt), kFreshPageSize, cfg_.frag_reps, t);
    int64_t fresh_pages = 0;
    for (int32_t len : prefix) fresh_pages += pages_for_rows(int64_t{len} + nodes_, kFreshPageSize);
    record(f.contiguous, t, kFreshPageSize, 1.0, double(fresh_pages) / f.batch);
  }

  void print_progress(int64_t r) {
    const kvpool::PoolMetrics m = pool_.metrics();
    char line[320];
    std::snprintf(
        line, sizeof line,
        "round %4lld | live %3d | committed %7lld tok | accept %5.2f | pages used %6d free %6d | "
        "frag %6.2f pages/run %5.2f runs/req | defrags %lld\n",
        static_cast<long long>(r), static_cast<int>(live_.size()),
        static_cast<long long>(report_.tokens_committed), report_.mean_acceptance(), m.pages_used,
        m.pages_free, m.mean_run_length, runs_per_request(m),
        static_cast<long long>(report_.defrags.size()));
    *hooks_.lines << line << std::flush;
  }

  SimulationConfig cfg_;
  SimulationHooks hooks_;
  Rng control_, data_;
  int32_t nodes_;
  kvpool::KvPool pool_;
  Target target_;
  OnlineCalibration calibration_;  // of the picker, with --budget auto
  std::unique_ptr<SimBackend> backend_;
  std::vector<LiveRequest> live_;
  Pending pending_;
  int64_t next_id_ = 1;
  uint64_t trace_ = 0x243f6a8885a308d3ull;
  SimulationReport report_;
};

}  // namespace

SimulationReport run_simulation(const SimulationConfig& config, const SimulationHooks& hooks) {
  Simulation sim(config, hooks);
  return sim.run();
}

}  // namespace treemla::tool
