// treemla tests: random verify-attention cases that own their host buffers.
//
// A VerifyCase holds Q, a paged latent pool, page table, lengths and tree masks for one ragged
// batch, built deterministically from (CaseSpec, seed) on every platform: the random numbers
// come straight from std::mt19937 bits, never from the implementation-defined std::
// distributions. Every pool slot that no request owns is filled with NaN bit patterns and every
// page_table entry past a request's pages holds 0x7fffffff, so an implementation that reads
// outside the rows it was given either produces NaN or faults. With spec.poison = false the same
// seed gives bit-identical live data with finite filler instead, to compare the two runs.
//
// Header-only, no dependency on the library's tree module: the GPU tests include it too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "treemla/attention.h"
#include "treemla/dtype.h"

namespace treemla::test {

// kSingle: every request becomes a single node (q_len forced to 1, plain decode).
enum class TreeKind : int { kChain, kStar, kRandom, kDeep, kSingle };
enum class ValueDist : int { kUniform, kNormal };  // U(-1, 1) or N(0, 1)

inline const char* tree_kind_name(TreeKind k) {
  switch (k) {
    case TreeKind::kChain: return "chain";
    case TreeKind::kStar: return "star";
    case TreeKind::kRandom: return "random";
    case TreeKind::kDeep: return "deep";
    case TreeKind::kSingle: return "single";
  }
  return "?";
}

inline const char* part_name(VerifyPart p) {
  switch (p) {
    case VerifyPart::kAll: return "all";
    case VerifyPart::kPrefix: return "prefix";
    case VerifyPart::kTail: return "tail";
  }
  return "?";
}

constexpr int32_t kPoisonPageIndex = 0x7fffffff;

// ---- deterministic random numbers -------------------------------------------------------
inline double rand_unit(std::mt19937& rng) {  // [0, 1), 32 random bits
  return static_cast<double>(rng()) * (1.0 / 4294967296.0);
}
inline int rand_int(std::mt19937& rng, int lo, int hi) {  // inclusive; modulo bias is harmless here
  return lo + static_cast<int>(rng() % static_cast<uint32_t>(hi - lo + 1));
}
inline double rand_normal(std::mt19937& rng) {  // Box-Muller; 1 - u keeps log away from 0
  const double u1 = 1.0 - rand_unit(rng), u2 = rand_unit(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
inline double rand_value(std::mt19937& rng, ValueDist d) {
  return d == ValueDist::kNormal ? rand_normal(rng) : 2.0 * rand_unit(rng) - 1.0;
}
template <class T>
void rand_shuffle(std::vector<T>& v, std::mt19937& rng) {  // Fisher-Yates, same on every libc++
  for (int i = static_cast<int>(v.size()) - 1; i > 0; --i) std::swap(v[i], v[rand_int(rng, 0, i)]);
}

// ---- trees ------------------------------------------------------------------------------
// parent[0] = -1 and 0 <= parent[i] < i; node order is arbitrary, as DDTree emits it.
inline std::vector<int> random_parents(TreeKind kind, int n, std::mt19937& rng) {
  std::vector<int> parent(n, -1);
  for (int i = 1; i < n; ++i) {
    switch (kind) {
      case TreeKind::kChain: parent[i] = i - 1; break;
      case TreeKind::kStar: parent[i] = 0; break;
      case TreeKind::kDeep:  // mostly extends one of the last few nodes: long, slightly bushy paths
        parent[i] = std::max(0, i - 1 - (rand_unit(rng) < 0.8 ? 0 : rand_int(rng, 0, 3)));
        break;
      default: parent[i] = rand_int(rng, 0, i - 1); break;
    }
  }
  return parent;
}

// Row i = row parent[i] plus bit i: each node sees itself and its ancestors. Appends n rows of
// mask_words words to `mask`.
inline void append_tree_mask(const std::vector<int>& parent, int mask_words, std::vector<uint64_t>& mask) {
  const size_t base = mask.size();
  mask.resize(base + parent.size() * static_cast<size_t>(mask_words), 0);
  for (size_t i = 0; i < parent.size(); ++i) {
    uint64_t* row = &mask[base + i * mask_words];
    if (parent[i] >= 0) std::memcpy(row, &mask[base + parent[i] * static_cast<size_t>(mask_words)], mask_words * 8);
    row[i / 64] |= uint64_t{1} << (i % 64);
  }
}

inline int node_depth(const std::vector<int>& parent, int i) {
  int d = 0;
  for (; parent[i] >= 0; i = parent[i]) ++d;
  return d;
}

// ---- the case -----------------------------------------------------------------------------
struct CaseSpec {
  std::vector<int> q_lens;       // per request; the batch is q_lens.size()
  std::vector<int> prefix_lens;  // per request, same size
  int num_heads = 8;
  int page_size = 16;
  DType dtype = DType::kBF16;
  TreeKind tree = TreeKind::kRandom;
  ValueDist dist = ValueDist::kUniform;
  // Q values are multiplied by q_scale. With the default sm_scale, q_scale = 1 gives logits with
  // a standard deviation of about 0.6 (uniform) or 1.7 (normal); 5 gives O(10); 50 or more
  // gives large-magnitude logits (hundreds) whose softmax is nearly one-hot.
  float q_scale = 1.0f;
  float sm_scale = 0.07216878364870322f;  // 1 / sqrt(192)
  VerifyPart part = VerifyPart::kAll;
  bool poison = true;     // NaN in unused slots, 0x7fffffff in unused page_table entries
  int extra_pages = -1;   // unused pool pages; -1: random, 1 .. 1 + used / 4
  int stride_slack = -1;  // page_table entries per row past the longest request; -1: random 0..3
  int mask_words = 0;     // 0: max(1, ceil(max q_len / 64))
};

// Same q_len and prefix_len for every request.
inline CaseSpec make_spec(int batch, int num_heads, int q_len, int prefix_len, int page_size = 16,
                          DType dtype = DType::kBF16, TreeKind tree = TreeKind::kRandom) {
  CaseSpec s;
  s.q_lens.assign(batch, q_len);
  s.prefix_lens.assign(batch, prefix_len);
  s.num_heads = num_heads;
  s.page_size = page_size;
  s.dtype = dtype;
  s.tree = tree;
  return s;
}

struct VerifyCase {
  CaseSpec spec;
  uint32_t seed = 0;
  int batch = 0, num_heads = 0, page_size = 0, num_pages = 0, page_table_stride = 0, mask_words = 0;
  int total_q = 0;
  std::vector<uint8_t> q;         // [total_q, H, 576] elements of spec.dtype
  std::vector<uint8_t> kv_cache;  // [num_pages, page_size, 576] elements of spec.dtype
  std::vector<int32_t> page_table, prefix_lens, q_indptr;
  std::vector<uint64_t> tree_mask;         // [total_q, mask_words]
  std::vector<std::vector<int>> parents;   // per request
  std::vector<uint8_t> slot_used;          // [num_pages * page_size]: 1 if a logical row lives there

  VerifyCase(const CaseSpec& s, uint32_t seed_) : spec(s), seed(seed_) { build(); }

  // Pointers into this object's buffers; call again after copying or moving the case.
  VerifyParams params() const { return params(spec.part); }
  VerifyParams params(VerifyPart part) const {
    VerifyParams p;
    p.dtype = spec.dtype;
    p.batch = batch;
    p.num_heads = num_heads;
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.page_table_stride = page_table_stride;
    p.mask_words = mask_words;
    p.sm_scale = spec.sm_scale;
    p.part = part;
    p.q = q.data();
    p.kv_cache = kv_cache.data();
    p.page_table = page_table.data();
    p.prefix_lens = prefix_lens.data();
    p.q_indptr = q_indptr.data();
    p.tree_mask = tree_mask.data();
    return p;
  }

  size_t o_elems() const { return static_cast<size_t>(total_q) * num_heads * kHeadDimV; }
  size_t lse_elems() const { return static_cast<size_t>(total_q) * num_heads; }
  int q_len(int b) const { return q_indptr[b + 1] - q_indptr[b]; }
  // Element index of logical row t, column c of request b in kv_cache.
  int64_t kv_index(int b, int64_t t, int c = 0) const {
    const int64_t page = page_table[static_cast<int64_t>(b) * page_table_stride + t / page_size];
    return (page * page_size + t % page_size) * kHeadDimQK + c;
  }

  std::string describe() const {
    std::ostringstream os;
    os << "seed=" << seed << " batch=" << batch << " H=" << num_heads << " page_size=" << page_size
       << " dtype=" << dtype_name(spec.dtype) << " tree=" << tree_kind_name(spec.tree)
       << " part=" << part_name(spec.part) << " q_scale=" << spec.q_scale << " q_lens=[";
    for (int b = 0; b < batch; ++b) os << (b ? "," : "") << q_len(b);
    os << "] prefix_lens=[";
    for (int b = 0; b < batch; ++b) os << (b ? "," : "") << prefix_lens[b];
    os << "] num_pages=" << num_pages << " stride=" << page_table_stride << " mask_words=" << mask_words;
    return os.str();
  }

 private:
  void store(std::vector<uint8_t>& buf, int64_t i, float v) { store_from_float(buf.data(), i, spec.dtype, v); }

  void poison_element(int64_t i) {  // quiet NaN with a payload, so it survives any conversion
    switch (spec.dtype) {
      case DType::kBF16: reinterpret_cast<uint16_t*>(kv_cache.data())[i] = 0x7fc1; break;
      case DType::kFP16: reinterpret_cast<uint16_t*>(kv_cache.data())[i] = 0x7e01; break;
      default: reinterpret_cast<uint32_t*>(kv_cache.data())[i] = 0x7fc00001u; break;
    }
  }

  void build() {
    batch = static_cast<int>(spec.q_lens.size());
    num_heads = spec.num_heads;
    page_size = spec.page_size;
    std::mt19937 rng(seed);
    const int esize = dtype_size(spec.dtype);

    std::vector<int> qlens = spec.q_lens;
    if (spec.tree == TreeKind::kSingle) qlens.assign(batch, 1);
    q_indptr.assign(batch + 1, 0);
    int max_q = 0;
    for (int b = 0; b < batch; ++b) {
      q_indptr[b + 1] = q_indptr[b] + qlens[b];
      max_q = std::max(max_q, qlens[b]);
    }
    total_q = q_indptr[batch];
    prefix_lens.assign(spec.prefix_lens.begin(), spec.prefix_lens.end());
    mask_words = spec.mask_words > 0 ? spec.mask_words : std::max(1, (max_q + 63) / 64);

    parents.clear();
    tree_mask.clear();
    for (int b = 0; b < batch; ++b) {
      parents.push_back(random_parents(spec.tree, qlens[b], rng));
      append_tree_mask(parents.back(), mask_words, tree_mask);
    }

    // Pages: each request owns ceil((prefix + q_len) / page_size) pages, drawn from a random
    // permutation of a pool that also has unused pages.
    std::vector<int> pages_needed(batch);
    int used = 0, max_pages = 0;
    for (int b = 0; b < batch; ++b) {
      const int64_t rows = static_cast<int64_t>(prefix_lens[b]) + qlens[b];
      pages_needed[b] = static_cast<int>((rows + page_size - 1) / page_size);
      used += pages_needed[b];
      max_pages = std::max(max_pages, pages_needed[b]);
    }
    const int extra = spec.extra_pages >= 0 ? spec.extra_pages : rand_int(rng, 1, 1 + used / 4);
    const int slack = spec.stride_slack >= 0 ? spec.stride_slack : rand_int(rng, 0, 3);
    num_pages = std::max(1, used + extra);
    page_table_stride = std::max(1, max_pages + slack);
    std::vector<int> perm(num_pages);
    for (int i = 0; i < num_pages; ++i) perm[i] = i;
    rand_shuffle(perm, rng);

    const int32_t filler_page = spec.poison ? kPoisonPageIndex : 0;
    page_table.assign(static_cast<size_t>(batch) * page_table_stride, filler_page);
    for (int b = 0, next = 0; b < batch; ++b)
      for (int j = 0; j < pages_needed[b]; ++j) page_table[static_cast<size_t>(b) * page_table_stride + j] = perm[next++];

    const double q_gain = spec.q_scale;
    q.assign(static_cast<size_t>(total_q) * num_heads * kHeadDimQK * esize, 0);
    for (int64_t i = 0; i < static_cast<int64_t>(total_q) * num_heads * kHeadDimQK; ++i)
      store(q, i, static_cast<float>(q_gain * rand_value(rng, spec.dist)));

    const int64_t slots = static_cast<int64_t>(num_pages) * page_size;
    kv_cache.assign(static_cast<size_t>(slots) * kHeadDimQK * esize, 0);
    slot_used.assign(static_cast<size_t>(slots), 0);
    for (int b = 0; b < batch; ++b) {
      const int64_t rows = static_cast<int64_t>(prefix_lens[b]) + qlens[b];
      for (int64_t t = 0; t < rows; ++t) {
        const int64_t base = kv_index(b, t);
        slot_used[base / kHeadDimQK] = 1;
        for (int c = 0; c < kHeadDimQK; ++c) store(kv_cache, base + c, static_cast<float>(rand_value(rng, spec.dist)));
      }
    }
    // The filler draws from its own generator so the live data never depends on spec.poison.
    std::mt19937 filler_rng(seed ^ 0x5bd1e995u);
    for (int64_t slot = 0; slot < slots; ++slot) {
      if (slot_used[slot]) continue;
      for (int c = 0; c < kHeadDimQK; ++c) {
        const int64_t i = slot * kHeadDimQK + c;
        if (spec.poison) poison_element(i);
        else store(kv_cache, i, static_cast<float>(rand_value(filler_rng, spec.dist)));
      }
    }
  }
};

}  // namespace treemla::test
