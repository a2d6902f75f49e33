// treemla: the split-verify design on the CPU, structured the way the GPU kernels are.
//
// Prefix pass: every (node, head) pair of a request is one row of the M dimension, all rows
// stream the same KV tiles (non-causal: every node sees the whole prefix). The prefix is cut
// into flash-decoding splits; each split runs an online softmax over kBlockN-row tiles in the
// log2 domain (scores pre-multiplied by sm_scale * log2(e), exp2, as a kernel would) and writes
// a float partial state with a natural-log LSE. The splits are folded together with
// merge_state.
// Tail pass: the same online softmax over the request's own tree rows, masked by tree_mask.
// kAll merges the prefix and tail states with merge_state.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "treemla/attention.h"
#include "treemla/error.h"

namespace treemla::cpu {

namespace {

// Four dot products of one query row with key rows k[0..3]; each query element is loaded once
// for the four. Independent partial sums (two lanes x two per key row) keep the adds from
// forming one long dependency chain; the compiler may not reorder a single chain by itself.
#if defined(__GNUC__)  // GCC and Clang: a two-lane vector is one SSE2 or NEON register
typedef double Double2 __attribute__((vector_size(16)));
inline Double2 load2(const double* x) {
  Double2 v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}
inline void dot_qk4(const double* q, const double* const* k, double* out) {
  Double2 acc[4][2] = {};
  for (int c = 0; c < kHeadDimQK; c += 4) {
    const Double2 x0 = load2(q + c), x1 = load2(q + c + 2);
    for (int j = 0; j < 4; ++j) {
      acc[j][0] += x0 * load2(k[j] + c);
      acc[j][1] += x1 * load2(k[j] + c + 2);
    }
  }
  for (int j = 0; j < 4; ++j) {
    const Double2 s = acc[j][0] + acc[j][1];
    out[j] = s[0] + s[1];
  }
}
#else
inline void dot_qk4(const double* q, const double* const* k, double* out) {
  for (int j = 0; j < 4; ++j) {
    double a[4] = {0, 0, 0, 0};
    for (int c = 0; c < kHeadDimQK; c += 4)
      for (int u = 0; u < 4; ++u) a[u] += q[c + u] * k[j][c + u];
    out[j] = (a[0] + a[2]) + (a[1] + a[3]);
  }
}
#endif

// a += w[0] v[0] + ... + w[3] v[3] over the 512 value columns: one load and store of a per
// four rows.
inline void axpy4(const double* w, const double* const* v, double* a) {
  for (int c = 0; c < kHeadDimV; ++c)
    a[c] += (w[0] * v[0][c] + w[1] * v[1][c]) + (w[2] * v[2][c] + w[3] * v[3][c]);
}

constexpr int kBlockM = 32;      // query rows ((node, head) pairs) per tile
constexpr int kBlockN = 64;      // KV rows per tile
constexpr int kSplitLen = 1024;  // prefix rows per split (a multiple of kBlockN)
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Running softmax state of `rows` query rows: max score m (log2 units), sum l of exp2(s - m),
// and the unnormalized output acc.
struct OnlineState {
  int rows = 0;
  std::vector<double> m, l, acc;
  void reset(int r) {
    rows = r;
    m.assign(r, kNegInf);
    l.assign(r, 0.0);
    acc.assign(static_cast<size_t>(r) * kHeadDimV, 0.0);
  }
};

// Reads logical rows [t0, t0 + n) of request b into dst (n x 576 doubles).
void load_tile(const VerifyParams& p, int b, int64_t t0, int n, double* dst) {
  const int32_t* table = p.page_table + static_cast<int64_t>(b) * p.page_table_stride;
  for (int r = 0; r < n; ++r) {
    const int64_t t = t0 + r;
    const int64_t base =
        (static_cast<int64_t>(table[t / p.page_size]) * p.page_size + t % p.page_size) * kHeadDimQK;
    for (int c = 0; c < kHeadDimQK; ++c)
      dst[r * kHeadDimQK + c] = load_as_float(p.kv_cache, base + c, p.dtype);
  }
}

// One tile of n key rows against every query row of the state. visible(r, t) says whether row r
// sees tile row t; scale_log2 = sm_scale * log2(e).
template <class Visible>
void attend_tile(OnlineState& st, const double* q, const double* k, int n, double scale_log2,
                 Visible visible, std::vector<double>& s) {
  s.resize(n);
  for (int r = 0; r < st.rows; ++r) {
    const double* qr = q + static_cast<int64_t>(r) * kHeadDimQK;
    double tile_max = kNegInf;
    for (int t = 0; t < n; t += 4) {
      const double* k4[4];
      for (int u = 0; u < 4; ++u)
        k4[u] = k + std::min(t + u, n - 1) * kHeadDimQK;  // clamp the remainder
      double d[4];
      dot_qk4(qr, k4, d);
      for (int u = 0; u < 4 && t + u < n; ++u) {
        s[t + u] = visible(r, t + u) ? d[u] * scale_log2 : kNegInf;
        tile_max = std::max(tile_max, s[t + u]);
      }
    }
    // Nothing visible in this tile: leave the state alone (exp2(-inf - -inf) would be NaN).
    if (tile_max == kNegInf) continue;
    const double m_new = std::max(st.m[r], tile_max);
    const double alpha = std::exp2(st.m[r] - m_new);  // 0 while the row has seen nothing yet
    double* a = &st.acc[static_cast<size_t>(r) * kHeadDimV];
    double l = st.l[r] * alpha;
    for (int c = 0; c < kHeadDimV; ++c) a[c] *= alpha;
    for (int t = 0; t < n; t += 4) {
      const double* v4[4];  // V = the first 512 columns of each key row
      double pw[4] = {0, 0, 0, 0};
      for (int u = 0; u < 4; ++u) {
        v4[u] = k + std::min(t + u, n - 1) * kHeadDimQK;
        if (t + u < n && s[t + u] != kNegInf) pw[u] = std::exp2(s[t + u] - m_new);
        l += pw[u];
      }
      axpy4(pw, v4, a);
    }
    st.l[r] = l;
    st.m[r] = m_new;
  }
}

// Normalizes the state into float outputs (rows x 512) and natural-log LSEs.
void finalize(const OnlineState& st, float* o, float* lse) {
  for (int r = 0; r < st.rows; ++r) {
    float* orow = o + static_cast<int64_t>(r) * kHeadDimV;
    const double* a = &st.acc[static_cast<size_t>(r) * kHeadDimV];
    if (st.l[r] == 0.0) {  // the row saw nothing
      std::fill(orow, orow + kHeadDimV, 0.f);
      lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const double inv = 1.0 / st.l[r];
    for (int c = 0; c < kHeadDimV; ++c) orow[c] = static_cast<float>(a[c] * inv);
    lse[r] = static_cast<float>((st.m[r] + std::log2(st.l[r])) * kLn2);
  }
}

struct Scratch {
  OnlineState st;
  std::vector<double> q, tile, s;
  std::vector<float> part_o, part_lse;
};

// Prefix pass of request b into o/lse (q_len * H rows). Like a kernel grid: one job per
// (split, M tile of kBlockM rows), each streaming its split's KV tiles; the split states are
// then merged one after another.
void prefix_pass(const VerifyParams& p, int b, Scratch& w, float* o, float* lse) {
  const int q_len = p.q_indptr[b + 1] - p.q_indptr[b];
  const int rows = q_len * p.num_heads;
  const int64_t prefix = p.prefix_lens[b];
  const double scale_log2 = p.sm_scale * kLog2e;
  // Start empty (O = 0, LSE = -inf); an empty prefix leaves it so.
  std::fill(o, o + static_cast<int64_t>(rows) * kHeadDimV, 0.f);
  std::fill(lse, lse + rows, -std::numeric_limits<float>::infinity());
  w.part_o.resize(static_cast<size_t>(rows) * kHeadDimV);
  w.part_lse.resize(rows);
  w.tile.resize(static_cast<size_t>(kBlockN) * kHeadDimQK);
  for (int64_t split0 = 0; split0 < prefix; split0 += kSplitLen) {
    const int64_t split_end = std::min(prefix, split0 + kSplitLen);
    for (int m0 = 0; m0 < rows; m0 += kBlockM) {
      w.st.reset(std::min(kBlockM, rows - m0));
      for (int64_t t0 = split0; t0 < split_end; t0 += kBlockN) {
        const int n = static_cast<int>(std::min<int64_t>(kBlockN, split_end - t0));
        load_tile(p, b, t0, n, w.tile.data());
        attend_tile(
            w.st, &w.q[static_cast<size_t>(m0) * kHeadDimQK], w.tile.data(), n, scale_log2,
            [](int, int) { return true; }, w.s);
      }
      finalize(w.st, &w.part_o[static_cast<size_t>(m0) * kHeadDimV], &w.part_lse[m0]);
    }
    merge_state(o, lse, w.part_o.data(), w.part_lse.data(), o, lse, q_len, p.num_heads, kHeadDimV);
  }
}

// Tail pass of request b: the tree rows, visible per the ancestor mask.
void tail_pass(const VerifyParams& p, int b, Scratch& w, float* o, float* lse) {
  const int64_t q0 = p.q_indptr[b];
  const int q_len = p.q_indptr[b + 1] - p.q_indptr[b];
  const int H = p.num_heads;
  const int rows = q_len * H;
  const int64_t prefix = p.prefix_lens[b];
  w.tile.resize(static_cast<size_t>(kBlockN) * kHeadDimQK);
  for (int m0 = 0; m0 < rows; m0 += kBlockM) {
    w.st.reset(std::min(kBlockM, rows - m0));
    for (int j0 = 0; j0 < q_len; j0 += kBlockN) {
      const int n = std::min(kBlockN, q_len - j0);
      load_tile(p, b, prefix + j0, n, w.tile.data());
      const auto visible = [&](int r, int t) {
        const int node = (m0 + r) / H;  // row m0 + r is (node, head) = ((m0 + r) / H, (m0 + r) % H)
        const uint64_t* mask = p.tree_mask + (q0 + node) * p.mask_words;
        const int j = j0 + t;
        return ((mask[j / 64] >> (j % 64)) & 1u) != 0;
      };
      attend_tile(w.st, &w.q[static_cast<size_t>(m0) * kHeadDimQK], w.tile.data(), n,
                  p.sm_scale * kLog2e, visible, w.s);
    }
    finalize(w.st, o + static_cast<int64_t>(m0) * kHeadDimV, lse + m0);
  }
}

}  // namespace

void verify_split(const VerifyParams& p, float* o, float* lse) {
  validate(p);
  const bool has_rows = p.q_indptr[p.batch] != 0;  // o and lse have total_q rows
  TREEMLA_CHECK(o != nullptr || !has_rows, "o is null");
  TREEMLA_CHECK(lse != nullptr || !has_rows, "lse is null");
  const int H = p.num_heads;
  Scratch w;
  std::vector<float> tail_o, tail_lse;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.q_indptr[b];
    const int q_len = p.q_indptr[b + 1] - p.q_indptr[b];
    if (q_len == 0) continue;
    const int rows = q_len * H;
    // Rows are (node, head) pairs in the layout of q itself, so q needs no reordering.
    w.q.resize(static_cast<size_t>(rows) * kHeadDimQK);
    for (int64_t e = 0; e < static_cast<int64_t>(rows) * kHeadDimQK; ++e)
      w.q[e] = load_as_float(p.q, q0 * H * kHeadDimQK + e, p.dtype);
    float* o_req = o + q0 * H * kHeadDimV;
    float* lse_req = lse + q0 * H;
    switch (p.part) {
      case VerifyPart::kPrefix:
        prefix_pass(p, b, w, o_req, lse_req);
        break;
      case VerifyPart::kTail:
        tail_pass(p, b, w, o_req, lse_req);
        break;
      case VerifyPart::kAll:
        prefix_pass(p, b, w, o_req, lse_req);
        tail_o.resize(static_cast<size_t>(rows) * kHeadDimV);
        tail_lse.resize(rows);
        tail_pass(p, b, w, tail_o.data(), tail_lse.data());
        merge_state(o_req, lse_req, tail_o.data(), tail_lse.data(), o_req, lse_req, q_len, H,
                    kHeadDimV);
        break;
    }
  }
}

}  // namespace treemla::cpu
