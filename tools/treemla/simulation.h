// treemla simulate: a serving loop over a churning KV pool, on synthetic data.
//
// Every round, for every live request: build a DDTree from a synthetic drafter, append the tree's
// latent rows after the request's prefix, run verify attention for the whole batch, accept a path
// against a synthetic target, commit the accepted rows (KvPool plan applied to the cache) and
// check them. Requests arrive with random prompts and leave after a random number of tokens, so
// the pool fragments; when the fragmentation passes a threshold the pool is defragmented and every
// live request's bytes are checked to read back unchanged.
//
// Header-only so that the tool and its tests (which link only the library) share one copy.
// Two random streams, both seeded from the seed: `control` decides arrivals, lengths, drafts and
// target choices; `data` fills latent rows and queries. So the serving trajectory (acceptance,
// churn, defrags) does not change with --heads or the backend. Integers and uniforms are drawn
// from raw mt19937 outputs, not the standard distributions, so a seed means the same run on every
// standard library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "simulation_backend.h"
#include "treemla/attention.h"
#include "treemla/dtype.h"
#include "treemla/error.h"
#include "treemla/kvpool.h"
#include "treemla/tree.h"

namespace treemla::tool {

struct SimulationConfig {
  int64_t rounds = 60;
  uint32_t seed = 1;
  std::string device = "cpu";
  int heads = 2;            // query heads of the verify attention
  int budget = 15;          // DDTree nodes besides the root
  int depth = 7;            // DDTree depth limit (drafter block size - 1)
  int top_k = 4;            // drafter candidates per depth
  int page_size = 16;
  int num_pages = 0;        // 0: default_num_pages(config)
  int max_requests = 4;     // live requests at most
  int prompt_min = 32, prompt_max = 256;
  int gen_min = 16, gen_max = 96;  // tokens a request generates before it finishes
  kvpool::FreePolicy policy = kvpool::FreePolicy::kAsFreed;
  // Defragment when the live requests' pages form more than this many contiguous runs per
  // request on average (1 = every request contiguous). 0 turns defragmentation off.
  double defrag_threshold = 2.0;
  int64_t defrag_max_moves = 0;  // 0: full defrag; otherwise a partial defrag of at most this many moves
  double accept_prob = 0.7;      // chance that the target picks one of a node's drafted children
  int check_every = 10;          // every N rounds: split vs full attention, all live rows re-read; 0 = never
  int progress_every = 10;       // 0 = no progress lines
};

struct DefragEvent {
  int64_t round = 0;
  double runs_per_request_before = 0, runs_per_request_after = 0;
  double mean_run_before = 0, mean_run_after = 0;  // pages per contiguous run
  int64_t pages_relocated = 0;
  int64_t moves = 0;  // page copies, scratch hops of cycles included
};

struct SimulationReport {
  int64_t rounds = 0;
  int32_t num_pages = 0;
  int32_t tree_nodes = 0;  // 1 + budget, or the full tree when fewer paths exist
  int64_t requests_admitted = 0, requests_finished = 0, requests_cut_short = 0, requests_live_at_end = 0;
  int64_t admission_deferrals = 0;  // rounds in which the next request waited for free pages
  int64_t request_rounds = 0;       // (request, round) pairs verified and committed
  int64_t tokens_committed = 0;
  std::vector<int64_t> acceptance_histogram;  // index = acceptance length, 0..depth + 1
  double verify_seconds = 0;
  double verify_flops = 0;
  int64_t verify_calls = 0;
  int64_t cross_checks = 0, cross_check_failures = 0;
  double cross_check_max_diff = 0;
  int64_t nonfinite_outputs = 0;
  int64_t rows_checked = 0, row_mismatches = 0;
  int64_t commit_row_moves = 0, commit_pages_released = 0, commit_plan_mismatches = 0;
  std::vector<DefragEvent> defrags;
  int64_t defrags_skipped = 0;         // a full pool whose plan needed a scratch page
  int64_t defrags_without_moves = 0;   // partial defrags that found nothing within --defrag-max-moves
  int64_t pages_relocated = 0, defrag_moves = 0;
  int32_t peak_pages_used = 0;
  kvpool::PoolMetrics final_metrics;
  uint64_t trace = 0;  // hash of the whole trajectory and every attention output
  double wall_seconds = 0;

  double mean_acceptance() const { return request_rounds ? double(tokens_committed) / request_rounds : 0.0; }
  bool checks_passed() const {
    return row_mismatches == 0 && nonfinite_outputs == 0 && cross_check_failures == 0 && commit_plan_mismatches == 0;
  }
};

// Runs per live request (1 = every request contiguous); 1 for an empty pool.
inline double runs_per_request(const kvpool::PoolMetrics& m) {
  return m.num_requests ? double(m.total_runs) / m.num_requests : 1.0;
}

// Rows of one request's tree: 1 + budget, unless the budget exceeds all K + K^2 + .. + K^D paths.
inline int32_t tree_nodes(const SimulationConfig& c) {
  int64_t paths = 0, level = 1;
  for (int d = 1; d <= c.depth && paths < c.budget; ++d) {
    level = std::min<int64_t>(level * c.top_k, int64_t{c.budget} + 1);  // only "reaches the budget" matters
    paths += level;
  }
  return static_cast<int32_t>(1 + std::min<int64_t>(paths, c.budget));
}

inline int64_t pages_for_rows(int64_t rows, int page_size) { return (rows + page_size - 1) / page_size; }

// Room for every live request at its largest (prompt_max + gen_max + one tree), plus one free page
// so that a defrag can always break a cycle.
inline int64_t default_num_pages(const SimulationConfig& c) {
  return int64_t{c.max_requests} *
             pages_for_rows(int64_t{c.prompt_max} + c.gen_max + tree_nodes(c), c.page_size) + 1;
}

// Throws std::invalid_argument naming the option ("--name = 'value' must be ...").
inline void validate_config(const SimulationConfig& c) {
  auto bad = [](const std::string& name, const std::string& value, const std::string& want) {
    throw std::invalid_argument("--" + name + " = '" + value + "' must be " + want);
  };
  auto real = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  auto range = [&](const char* name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) bad(name, std::to_string(v), "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  check_device(c.device);
  range("rounds", c.rounds, 1, 10000000);
  range("heads", c.heads, 1, kMaxHeads);
  range("budget", c.budget, 1, tree::kMaxBudget);
  range("depth", c.depth, 1, tree::kMaxBudget);
  range("topk", c.top_k, 1, 256);
  range("page-size", c.page_size, 1, 1024);
  if (c.page_size & (c.page_size - 1)) bad("page-size", std::to_string(c.page_size), "a power of two");
  range("max-requests", c.max_requests, 1, 256);
  range("prompt-min", c.prompt_min, 1, 262144);
  range("prompt-max", c.prompt_max, 1, 262144);
  if (c.prompt_max < c.prompt_min)
    bad("prompt-max", std::to_string(c.prompt_max), ">= --prompt-min (" + std::to_string(c.prompt_min) + ")");
  range("gen-min", c.gen_min, 1, 262144);
  range("gen-max", c.gen_max, 1, 262144);
  if (c.gen_max < c.gen_min) bad("gen-max", std::to_string(c.gen_max), ">= --gen-min (" + std::to_string(c.gen_min) + ")");
  range("defrag-max-moves", c.defrag_max_moves, 0, int64_t{1} << 30);
  range("check-every", c.check_every, 0, 10000000);
  range("progress-every", c.progress_every, 0, 10000000);
  if (!(c.accept_prob >= 0.0 && c.accept_prob <= 1.0)) bad("accept-prob", real(c.accept_prob), "a number in [0, 1]");
  if (!(c.defrag_threshold == 0.0 || (c.defrag_threshold >= 1.0 && c.defrag_threshold <= 1e9)))
    bad("defrag-threshold", real(c.defrag_threshold), "0 (off) or a number of runs per request in [1, 1e9]");
  range("num-pages", c.num_pages, 0, 1 << 24);
  if (c.num_pages > 0) {
    // A request must fit alone, or it would wait for admission forever.
    const int64_t need = pages_for_rows(int64_t{c.prompt_max} + tree_nodes(c), c.page_size);
    if (c.num_pages < need)
      bad("num-pages", std::to_string(c.num_pages),
          "at least " + std::to_string(need) + " (one --prompt-max prompt plus one tree of " +
              std::to_string(tree_nodes(c)) + " rows), or 0 for the default");
  }
  const int64_t pages = c.num_pages > 0 ? c.num_pages : default_num_pages(c);
  const int64_t bytes = pages * c.page_size * int64_t{kHeadDimQK} * 2;
  if (bytes > (int64_t{4} << 30))
    bad("num-pages", std::to_string(pages), "small enough for a cache of at most 4 GiB (--num-pages x --page-size x 1152 B)");
}

namespace sim_detail {

class Rng {
 public:
  explicit Rng(uint32_t seed) : eng_(seed) {}
  // Inclusive [lo, hi] from 64 raw bits; the modulo bias is far below anything a run can see.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t x = (uint64_t{eng_()} << 32) | eng_();
    return lo + static_cast<int64_t>(x % (static_cast<uint64_t>(hi - lo) + 1));
  }
  double uniform01() { return (eng_() >> 8) * (1.0 / 16777216.0); }  // [0, 1), 24 bits
  float symmetric() { return static_cast<float>(uniform01() * 2.0 - 1.0); }

 private:
  std::mt19937 eng_;
};

inline uint64_t mix(uint64_t h, uint64_t v) {
  v *= 0x9e3779b97f4a7c15ull;
  v ^= v >> 32;
  return (h ^ v) * 0x100000001b3ull + 0x632be59bd9b4e019ull;
}

constexpr int32_t kVocab = 32000;
constexpr float kSmScale = 0.0625f;  // GLM-5's 1/sqrt(256)

struct LiveRequest {
  int64_t id = 0;
  int64_t to_generate = 0;
  int64_t generated = 0;
  int32_t bonus = 0;             // the next tree's root token
  std::vector<uint64_t> rows;    // hash of every committed row: what the cache must hold
  bool gone = false;             // finished or cut short this round; removed at the round's end
};

struct Pending {  // the next arrival, drawn once so that a deferred request keeps its lengths
  bool valid = false;
  int64_t prompt = 0, to_generate = 0;
  int32_t bonus = 0;
};

struct Work {  // one request's share of a round
  size_t live = 0;               // index into the live list
  int64_t prefix = 0;            // committed rows before the tree
  tree::DDTree tree;
  std::vector<float> log_probs;  // the drafter's [depth, top_k]
  std::vector<uint64_t> tail;    // hashes of the tree rows as written
};

class Simulation {
 public:
  Simulation(const SimulationConfig& c, std::ostream* progress)
      : cfg_(validated(c)), progress_(progress), control_(c.seed), data_(c.seed ^ 0x5bd1e995u),
        nodes_(tree_nodes(c)), pool_(pool_config(c)), backend_(make_backend(c.device, pool_.config())) {
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
    report_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    admit();
    std::vector<Work> work = grow_trees();
    if (!work.empty()) verify_batch(work, r);
    for (Work& w : work) accept_and_commit(w);
    std::erase_if(live_, [](const LiveRequest& q) { return q.gone; });
    maybe_defrag(r);
    if (cfg_.check_every > 0 && r % cfg_.check_every == 0) check_all_rows();
    if (progress_ && cfg_.progress_every > 0 && r % cfg_.progress_every == 0) print_progress(r);
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
  // model's KV) and returns their hashes.
  std::vector<uint64_t> write_random_rows(int64_t id, int64_t first, int64_t count) {
    const size_t w = kHeadDimQK;
    std::vector<uint16_t> data(static_cast<size_t>(count) * w);
    for (uint16_t& x : data) x = float_to_bf16(data_.symmetric());
    std::vector<kvpool::RowSlot> slots(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) slots[static_cast<size_t>(i)] = pool_.locate(id, first + i);
    backend_->write_rows(slots, data);
    std::vector<uint64_t> hashes(static_cast<size_t>(count));
    for (size_t i = 0; i < hashes.size(); ++i) hashes[i] = hash_row(data.data() + i * w, kHeadDimQK);
    return hashes;
  }

  // The drafter: per depth, top_k distinct tokens and a random softmax over them plus one
  // "everything else" bucket, so that the log-probs are sorted, negative and vary round to round.
  void draft(Work& w, int32_t bonus) {
    const int D = cfg_.depth, K = cfg_.top_k;
    std::vector<int32_t> tokens(static_cast<size_t>(D) * K);
    w.log_probs.assign(tokens.size(), 0.f);
    std::vector<double> logits(static_cast<size_t>(K));
    for (int d = 0; d < D; ++d) {
      int32_t* tok = tokens.data() + static_cast<size_t>(d) * K;
      for (int k = 0; k < K; ++k) {
        do {
          tok[k] = static_cast<int32_t>(control_.uniform_int(0, kVocab - 1));
        } while (std::find(tok, tok + k, tok[k]) != tok + k);
      }
      for (double& l : logits) l = 4.0 * control_.uniform01();
      std::sort(logits.begin(), logits.end(), std::greater<>());
      double z = std::exp(1.0);  // the rest of the vocabulary
      for (double l : logits) z += std::exp(l);
      for (int k = 0; k < K; ++k) w.log_probs[static_cast<size_t>(d) * K + k] = static_cast<float>(logits[k] - std::log(z));
    }
    tree::DraftTopK dt{D, K, tokens, w.log_probs};
    w.tree = tree::build_ddtree(dt, bonus, cfg_.budget, D);
  }

  // Drafts a tree for every live request and appends its rows; a request whose tree does not fit
  // in the pool is finished early, which frees its pages for the others.
  std::vector<Work> grow_trees() {
    std::vector<Work> work;
    for (size_t i = 0; i < live_.size(); ++i) {
      LiveRequest& q = live_[i];
      const int64_t len = pool_.num_tokens(q.id);
      const int64_t extra = pool_.pages_for(len + nodes_) - static_cast<int64_t>(pool_.pages(q.id).size());
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

  void verify_batch(std::vector<Work>& work, int64_t r) {
    const int batch = static_cast<int>(work.size());
    const int H = cfg_.heads;
    std::vector<std::vector<int32_t>> trees;
    std::vector<int32_t> prefix;
    int64_t stride = 0;
    for (const Work& w : work) {
      trees.push_back(w.tree.parents);
      prefix.push_back(static_cast<int32_t>(w.prefix));
      stride = std::max<int64_t>(stride, static_cast<int64_t>(pool_.pages(live_[w.live].id).size()));
    }
    const tree::BatchLayout layout = tree::build_batch_layout(trees, prefix);
    std::vector<int32_t> page_table(static_cast<size_t>(batch * stride));
    for (int b = 0; b < batch; ++b)
      pool_.page_table_row(live_[work[b].live].id, page_table.data() + b * stride, stride, 0);
    const size_t rows = static_cast<size_t>(layout.total_q) * H;
    std::vector<uint16_t> q(rows * kHeadDimQK);
    for (uint16_t& x : q) x = float_to_bf16(data_.symmetric());

    VerifyParams p;
    p.dtype = DType::kBF16;
    p.batch = batch;
    p.num_heads = H;
    p.page_size = cfg_.page_size;
    p.num_pages = pool_.config().num_pages;
    p.page_table_stride = static_cast<int>(stride);
    p.mask_words = layout.mask_words;
    p.sm_scale = kSmScale;
    p.q = q.data();
    p.page_table = page_table.data();
    p.prefix_lens = layout.prefix_lens.data();
    p.q_indptr = layout.q_indptr.data();
    p.tree_mask = layout.tree_mask.data();
    std::vector<float> o(rows * kHeadDimV), lse(rows);
    const auto t0 = std::chrono::steady_clock::now();
    backend_->verify(p, o.data(), lse.data());
    report_.verify_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++report_.verify_calls;

    // Every row sees its prefix and itself, so every output and LSE must be finite.
    for (float x : o) report_.nonfinite_outputs += !std::isfinite(x);
    for (float x : lse) report_.nonfinite_outputs += !std::isfinite(x);
    for (float x : lse) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      trace_ = mix(trace_, u);
    }
    // FLOPs: QK^T and PV over every visible key (prefix + the node's ancestors and itself).
    for (const Work& w : work) {
      int64_t keys = 0;
      for (int32_t d : w.tree.depths) keys += w.prefix + d + 1;
      report_.verify_flops += 2.0 * H * double(keys) * (kHeadDimQK + kHeadDimV);
    }
    if (cfg_.check_every > 0 && r % cfg_.check_every == 0) cross_check(p, o, lse);
  }

  // The split design against the specification on the same inputs. Both accumulate in double
  // and round once to float, so they agree to float rounding.
  void cross_check(const VerifyParams& p, const std::vector<float>& o, const std::vector<float>& lse) {
    std::vector<float> o_ref(o.size()), lse_ref(lse.size());
    backend_->verify_reference(p, o_ref.data(), lse_ref.data());
    double diff = 0;
    for (size_t i = 0; i < o.size(); ++i) diff = std::max(diff, double(std::fabs(o[i] - o_ref[i])));
    for (size_t i = 0; i < lse.size(); ++i) diff = std::max(diff, double(std::fabs(lse[i] - lse_ref[i])));
    if (!(diff <= 1e-3)) ++report_.cross_check_failures;  // NaN counts as a failure
    report_.cross_check_max_diff = std::max(report_.cross_check_max_diff, diff);
    ++report_.cross_checks;
  }

  // The synthetic target: at a node with children it picks one of them with probability
  // accept_prob (weighted by the drafter's probabilities, so the target mostly agrees with the
  // drafter's favourites), otherwise a token no child carries.
  std::vector<int32_t> target_tokens(const Work& w) {
    const tree::DDTree& t = w.tree;
    const int n = t.size();
    std::vector<std::vector<int32_t>> children(static_cast<size_t>(n));
    for (int i = 1; i < n; ++i) children[static_cast<size_t>(t.parents[i])].push_back(i);
    std::vector<int32_t> target(static_cast<size_t>(n));
    for (int u = 0; u < n; ++u) {
      const auto& ch = children[static_cast<size_t>(u)];
      if (!ch.empty() && control_.uniform01() < cfg_.accept_prob) {
        double total = 0;
        for (int32_t c : ch) total += std::exp(w.log_probs[static_cast<size_t>(t.depths[c] - 1) * cfg_.top_k + t.ranks[c]]);
        double x = control_.uniform01() * total;
        int32_t pick = ch.back();
        for (int32_t c : ch) {
          x -= std::exp(w.log_probs[static_cast<size_t>(t.depths[c] - 1) * cfg_.top_k + t.ranks[c]]);
          if (x < 0) {
            pick = c;
            break;
          }
        }
        target[static_cast<size_t>(u)] = t.tokens[static_cast<size_t>(pick)];
      } else {
        int32_t tok;
        do {
          tok = static_cast<int32_t>(control_.uniform_int(0, kVocab - 1));
        } while (std::any_of(ch.begin(), ch.end(), [&](int32_t c) { return t.tokens[static_cast<size_t>(c)] == tok; }));
        target[static_cast<size_t>(u)] = tok;
      }
    }
    return target;
  }

  void accept_and_commit(Work& w) {
    LiveRequest& q = live_[w.live];
    const std::vector<int32_t> target = target_tokens(w);
    const tree::Acceptance acc = tree::accept_path(w.tree.parents, w.tree.tokens, target);
    const int64_t n = acc.length;

    // The tree library's logical plan and the pool's physical one must describe the same commit.
    const tree::CommitPlan logical = tree::plan_commit(w.tree.parents, acc.nodes, static_cast<int32_t>(w.prefix));
    const kvpool::CommitPlan plan = pool_.commit_accepted(q.id, w.prefix, acc.nodes);
    backend_->apply_commit(plan);
    if (logical.new_len != plan.num_tokens || logical.copies.size() != plan.moves.size()) ++report_.commit_plan_mismatches;
    report_.commit_row_moves += static_cast<int64_t>(plan.moves.size());
    report_.commit_pages_released += static_cast<int64_t>(plan.released_pages.size());

    // The committed rows must now hold exactly the accepted nodes' rows, in path order.
    std::vector<kvpool::RowSlot> slots(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) slots[static_cast<size_t>(k)] = pool_.locate(q.id, w.prefix + k);
    const std::vector<uint64_t> got = backend_->hash_rows(slots);
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t want = w.tail[static_cast<size_t>(acc.nodes[static_cast<size_t>(k)])];
      report_.row_mismatches += got[static_cast<size_t>(k)] != want;
      q.rows.push_back(want);
    }
    report_.rows_checked += n;

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
      plan = cfg_.defrag_max_moves > 0 ? pool_.partial_defrag(cfg_.defrag_max_moves) : pool_.defrag();
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

  void print_progress(int64_t r) {
    const kvpool::PoolMetrics m = pool_.metrics();
    char line[320];
    std::snprintf(line, sizeof line,
                  "round %4lld | live %3d | committed %7lld tok | accept %5.2f | pages used %6d free %6d | "
                  "frag %6.2f pages/run %5.2f runs/req | defrags %lld\n",
                  static_cast<long long>(r), static_cast<int>(live_.size()),
                  static_cast<long long>(report_.tokens_committed), report_.mean_acceptance(), m.pages_used,
                  m.pages_free, m.mean_run_length, runs_per_request(m), static_cast<long long>(report_.defrags.size()));
    *progress_ << line << std::flush;
  }

  SimulationConfig cfg_;
  std::ostream* progress_;
  Rng control_, data_;
  int32_t nodes_;
  kvpool::KvPool pool_;
  std::unique_ptr<SimBackend> backend_;
  std::vector<LiveRequest> live_;
  Pending pending_;
  int64_t next_id_ = 1;
  uint64_t trace_ = 0x243f6a8885a308d3ull;
  SimulationReport report_;
};

}  // namespace sim_detail

// Runs the whole simulation. Throws std::invalid_argument for a bad config (naming the option),
// treemla::Error if a library call fails. progress: where progress lines go (nullptr: none).
inline SimulationReport run_simulation(const SimulationConfig& config, std::ostream* progress = nullptr) {
  sim_detail::Simulation sim(config, progress);
  return sim.run();
}

}  // namespace treemla::tool
