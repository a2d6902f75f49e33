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
// With spec.peaks the data has structure instead (plant_peaks): V columns carry per-column offsets
// and rows varied magnitudes, and chosen (request, key row) pairs get large logits from some of
// the request's query rows, so that one wrong key visibly moves those rows' output and LSE.
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
#include "treemla/error.h"

namespace treemla::test {

// kSingle: every request becomes a single node (q_len forced to 1, plain decode).
enum class TreeKind : int { kChain, kStar, kRandom, kDeep, kSingle };
enum class ValueDist : int { kUniform, kNormal };  // U(-1, 1) or N(0, 1)

inline const char* tree_kind_name(TreeKind k) {
  switch (k) {
    case TreeKind::kChain:
      return "chain";
    case TreeKind::kStar:
      return "star";
    case TreeKind::kRandom:
      return "random";
    case TreeKind::kDeep:
      return "deep";
    case TreeKind::kSingle:
      return "single";
  }
  return "?";
}

inline const char* part_name(VerifyPart p) {
  switch (p) {
    case VerifyPart::kAll:
      return "all";
    case VerifyPart::kPrefix:
      return "prefix";
    case VerifyPart::kTail:
      return "tail";
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
      case TreeKind::kChain:
        parent[i] = i - 1;
        break;
      case TreeKind::kStar:
        parent[i] = 0;
        break;
      case TreeKind::kDeep:  // mostly extends one of the last few nodes: long, slightly bushy paths
        parent[i] = std::max(0, i - 1 - (rand_unit(rng) < 0.8 ? 0 : rand_int(rng, 0, 3)));
        break;
      default:
        parent[i] = rand_int(rng, 0, i - 1);
        break;
    }
  }
  return parent;
}

// Row i = row parent[i] plus bit i: each node sees itself and its ancestors. Appends n rows of
// mask_words words to `mask`.
inline void append_tree_mask(const std::vector<int>& parent, int mask_words,
                             std::vector<uint64_t>& mask) {
  const size_t base = mask.size();
  mask.resize(base + parent.size() * static_cast<size_t>(mask_words), 0);
  for (size_t i = 0; i < parent.size(); ++i) {
    uint64_t* row = &mask[base + i * mask_words];
    if (parent[i] >= 0)
      std::memcpy(row, &mask[base + parent[i] * static_cast<size_t>(mask_words)], mask_words * 8);
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
  // Structured values for peaked attention (see VerifyCase::plant_peaks): column c < 512 of every
  // live row is v_offset[c] + m_t * noise with v_offset[c] in (-2, 2) per case and m_t one of
  // 1/4, 1/2, 1, 2 per row; the rope columns and Q are plain noise until peaks are planted.
  bool peaks = false;
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

// ---- where to aim peaks ------------------------------------------------------------------
// Both sides (row - 1, row) of each boundary row, kept inside [0, prefix); sorted, unique.
inline std::vector<int64_t> rows_around(const std::vector<int64_t>& boundaries, int64_t prefix) {
  std::vector<int64_t> rows;
  for (int64_t x : boundaries)
    for (int64_t t : {x - 1, x})
      if (t >= 0 && t < prefix) rows.push_back(t);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Rows 0 and prefix - 1 and both sides (k * block - 1, k * block) of at most max_boundaries of
// the block boundaries inside the prefix, spread evenly, the first and the last among them.
inline std::vector<int64_t> block_edge_rows(int64_t prefix, int block = 32,
                                            int max_boundaries = 8) {
  const int64_t count =
      prefix > 0 ? (prefix - 1) / block : 0;   // boundaries k * block, 1 <= k <= count
  std::vector<int64_t> boundaries{0, prefix};  // rows 0 and prefix - 1
  for (int64_t i = 0; i < std::min<int64_t>(count, max_boundaries); ++i) {
    const int64_t k =
        count <= max_boundaries ? 1 + i : 1 + i * (count - 1) / std::max(1, max_boundaries - 1);
    boundaries.push_back(k * block);
  }
  return rows_around(boundaries, prefix);
}

struct VerifyCase {
  CaseSpec spec;
  uint32_t seed = 0;
  int batch = 0, num_heads = 0, page_size = 0, num_pages = 0, page_table_stride = 0, mask_words = 0;
  int total_q = 0;
  std::vector<uint8_t> q;         // [total_q, H, 576] elements of spec.dtype
  std::vector<uint8_t> kv_cache;  // [num_pages, page_size, 576] elements of spec.dtype
  std::vector<int32_t> page_table, prefix_lens, q_indptr;
  std::vector<uint64_t> tree_mask;        // [total_q, mask_words]
  std::vector<std::vector<int>> parents;  // per request
  std::vector<uint8_t> slot_used;         // [num_pages * page_size]: 1 if a logical row lives there
  std::vector<double> v_offset;           // [512] per-column value offsets (spec.peaks), else empty
  std::vector<std::vector<int64_t>> peak_rows;  // per request: the key rows plant_peaks aimed at

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
    os << "] num_pages=" << num_pages << " stride=" << page_table_stride
       << " mask_words=" << mask_words;
    if (spec.peaks) {
      os << " peaks=[";
      for (size_t b = 0; b < peak_rows.size(); ++b) os << (b ? "," : "") << peak_rows[b].size();
      os << "]";
    }
    return os.str();
  }

  // Aims peaked attention at key rows: key_rows[b] lists logical rows of request b, prefix rows
  // (< prefix_len) and tail rows (prefix_len + j: tree node j). Needs spec.peaks; call it once.
  //  - Peak k of a request (its rows sorted) gets code k % 64, a row of the 64 x 64
  //    Sylvester-Hadamard matrix times 2, in its rope columns (the codes are orthogonal), and the
  //    value row -v_offset + noise / 2: far from every output, so losing it moves O, and with a
  //    small spread, so that its logit barely depends on the query's own noise.
  //  - Query rows r = node * H + head with r % 4 != 3 are peaked (all of them when a request has
  //    fewer than 4); the others keep plain attention, so errors on ordinary keys stay visible.
  //    Prefix peaks are dealt out over G = clamp(ceil(peaks / 2), 1, peaked rows) groups:
  //    peaked row i gets the peaks k with k % G == i % G (about two each, more when rows are few;
  //    every peak reaches at least one row). A tail peak goes to every peaked row whose node sees
  //    it (its mask bit is set).
  //  - A peaked row's rope part becomes sum_code g_code * code, one term per code among its
  //    peaks, g_code chosen so that the logit on its first peak with that code is the row's
  //    common shift (sm_scale * q . v_offset, shared by ordinary keys) plus `height`, before q is
  //    rounded to the dtype. Other keys with the same code (more than 64 peaks) rise as much
  //    and become peaks of the row too. height <= 0 means ln(prefix_len + q_len): one peak then
  //    weighs about as much as all ordinary keys together, so losing one of a row's few peaks
  //    moves its LSE by a few percent and its output by a visible fraction of |v_peak - o|.
  // Deterministic from (spec, seed, key_rows). Throws treemla::Error on a row out of range.
  void plant_peaks(const std::vector<std::vector<int64_t>>& key_rows, double height = 0) {
    TREEMLA_CHECK(spec.peaks, "plant_peaks needs a case built with spec.peaks = true");
    TREEMLA_CHECK(peak_rows.empty(), "plant_peaks may be called once per case");
    TREEMLA_CHECK(
        static_cast<int>(key_rows.size()) == batch,
        "plant_peaks: key_rows has " << key_rows.size() << " lists for a batch of " << batch);
    TREEMLA_CHECK(spec.sm_scale > 0, "plant_peaks needs sm_scale > 0, got " << spec.sm_scale);
    std::mt19937 rng(seed ^ 0x2545f491u);
    for (int b = 0; b < batch; ++b) {
      std::vector<int64_t> rows = key_rows[b];
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      const int64_t n_kv = static_cast<int64_t>(prefix_lens[b]) + q_len(b);
      for (int64_t t : rows)
        TREEMLA_CHECK(t >= 0 && t < n_kv, "plant_peaks: key row " << t << " of request " << b
                                                                  << " is outside [0, " << n_kv
                                                                  << ")");
      peak_rows.push_back(rows);
      plant_request_peaks(b, rows, height > 0 ? height : std::log(static_cast<double>(n_kv)), rng);
    }
  }

 private:
  void store(std::vector<uint8_t>& buf, int64_t i, float v) {
    store_from_float(buf.data(), i, spec.dtype, v);
  }

  void poison_element(int64_t i) {  // quiet NaN with a payload, so it survives any conversion
    switch (spec.dtype) {
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(kv_cache.data())[i] = 0x7fc1;
        break;
      case DType::kFP16:
        reinterpret_cast<uint16_t*>(kv_cache.data())[i] = 0x7e01;
        break;
      default:
        reinterpret_cast<uint32_t*>(kv_cache.data())[i] = 0x7fc00001u;
        break;
    }
  }

  // Row `code` of the 64 x 64 Sylvester-Hadamard matrix, entry j: +1 or -1.
  static double hadamard(int code, int j) {
    int parity = 0;  // of the bits code and j share
    for (unsigned x = static_cast<unsigned>(code & j); x != 0; x &= x - 1) parity ^= 1;
    return parity ? -1.0 : 1.0;
  }

  float load(const std::vector<uint8_t>& buf, int64_t i) const {
    return load_as_float(buf.data(), i, spec.dtype);
  }

  void plant_request_peaks(int b, const std::vector<int64_t>& rows, double height,
                           std::mt19937& rng) {
    const int64_t prefix = prefix_lens[b];
    int P = 0;  // rows is sorted: the prefix peaks come first, peak k has code k % 64
    while (P < static_cast<int>(rows.size()) && rows[P] < prefix) ++P;
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t base = kv_index(b, rows[k]);
      for (int c = 0; c < kHeadDimV; ++c)
        store(kv_cache, base + c,
              static_cast<float>(-v_offset[c] + 0.5 * rand_value(rng, ValueDist::kUniform)));
      for (int j = 0; j < 64; ++j)
        store(kv_cache, base + kHeadDimV + j, static_cast<float>(2 * hadamard(k % 64, j)));
    }
    const int H = num_heads, R = q_len(b) * H;
    std::vector<int> peaked;  // query rows r of the request that get peaks
    for (int r = 0; r < R; ++r)
      if (R < 4 || r % 4 != 3) peaked.push_back(r);
    const int G = std::clamp((P + 1) / 2, 1, std::max(1, static_cast<int>(peaked.size())));
    const double scale = spec.sm_scale;
    for (size_t i = 0; i < peaked.size(); ++i) {
      const int r = peaked[i];
      const int64_t qbase = (static_cast<int64_t>(q_indptr[b]) * H + r) * kHeadDimQK;
      const uint64_t* mask = &tree_mask[static_cast<size_t>(q_indptr[b] + r / H) * mask_words];
      std::vector<int64_t> held(64, -1);  // code -> the first of this row's peaks with that code
      for (int k = 0; k < static_cast<int>(rows.size()); ++k) {
        const int64_t j = rows[k] - prefix;  // tail node of a tail peak
        const bool mine =
            k < P ? k % G == static_cast<int>(i) % G : ((mask[j / 64] >> (j % 64)) & 1u) != 0;
        if (mine && held[k % 64] < 0) held[k % 64] = rows[k];
      }
      if (std::count(held.begin(), held.end(), -1) == 64) continue;
      // The rope part of q becomes a sum of codes: g_code raises the logit of every key with that
      // code by 128 g_code sm_scale and leaves the other codes' keys alone.
      for (int j = 0; j < 64; ++j) store(q, qbase + kHeadDimV + j, 0.f);
      double common = 0;  // the row's logit shift shared by ordinary keys: sm_scale * q . v_offset
      for (int c = 0; c < kHeadDimV; ++c) common += load(q, qbase + c) * v_offset[c];
      common *= scale;
      std::vector<double> rope(64, 0.0);
      for (int code = 0; code < 64; ++code) {
        if (held[code] < 0) continue;
        const int64_t kbase = kv_index(b, held[code]);
        double logit = 0;  // on the peak key, with no code in q yet
        for (int c = 0; c < kHeadDimV; ++c) logit += load(q, qbase + c) * load(kv_cache, kbase + c);
        const double g = (common + height - logit * scale) / (128.0 * scale);
        for (int j = 0; j < 64; ++j) rope[j] += g * hadamard(code, j);
      }
      for (int j = 0; j < 64; ++j) store(q, qbase + kHeadDimV + j, static_cast<float>(rope[j]));
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
    peak_rows.clear();
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
      for (int j = 0; j < pages_needed[b]; ++j)
        page_table[static_cast<size_t>(b) * page_table_stride + j] = perm[next++];

    const double q_gain = spec.q_scale;
    q.assign(static_cast<size_t>(total_q) * num_heads * kHeadDimQK * esize, 0);
    for (int64_t i = 0; i < static_cast<int64_t>(total_q) * num_heads * kHeadDimQK; ++i)
      store(q, i, static_cast<float>(q_gain * rand_value(rng, spec.dist)));

    const int64_t slots = static_cast<int64_t>(num_pages) * page_size;
    kv_cache.assign(static_cast<size_t>(slots) * kHeadDimQK * esize, 0);
    slot_used.assign(static_cast<size_t>(slots), 0);
    v_offset.clear();
    if (spec.peaks)
      for (int c = 0; c < kHeadDimV; ++c)
        v_offset.push_back(2 * rand_value(rng, ValueDist::kUniform));
    static const double kMagnitudes[4] = {0.25, 0.5, 1.0, 2.0};
    for (int b = 0; b < batch; ++b) {
      const int64_t rows = static_cast<int64_t>(prefix_lens[b]) + qlens[b];
      for (int64_t t = 0; t < rows; ++t) {
        const int64_t base = kv_index(b, t);
        slot_used[base / kHeadDimQK] = 1;
        if (spec.peaks) {
          const double m = kMagnitudes[rng() % 4];
          for (int c = 0; c < kHeadDimQK; ++c) {
            const double noise = rand_value(rng, spec.dist);
            store(kv_cache, base + c,
                  static_cast<float>(c < kHeadDimV ? v_offset[c] + m * noise : noise));
          }
        } else {
          for (int c = 0; c < kHeadDimQK; ++c)
            store(kv_cache, base + c, static_cast<float>(rand_value(rng, spec.dist)));
        }
      }
    }
    // The filler draws from its own generator so the live data never depends on spec.poison.
    std::mt19937 filler_rng(seed ^ 0x5bd1e995u);
    for (int64_t slot = 0; slot < slots; ++slot) {
      if (slot_used[slot]) continue;
      for (int c = 0; c < kHeadDimQK; ++c) {
        const int64_t i = slot * kHeadDimQK + c;
        if (spec.poison)
          poison_element(i);
        else
          store(kv_cache, i, static_cast<float>(rand_value(filler_rng, spec.dist)));
      }
    }
  }
};

}  // namespace treemla::test
