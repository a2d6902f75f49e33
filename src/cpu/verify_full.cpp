// treemla: the specification of verify attention, computed naively in double precision.
//
// For each request it writes down the [q_len x (prefix_len + q_len)] visibility matrix, then
// runs a plain (two-pass, not online) masked softmax per query row and head. It shares only the
// dot-product inner loops (cpu/dot_kernels.h) with the split implementation, and the
// hand-computed tests pin those down, so the two can check each other.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/dot_kernels.h"
#include "treemla/attention.h"
#include "treemla/error.h"

namespace treemla::cpu {

namespace {

using detail::axpy4;
using detail::dot_qk4;

constexpr int64_t kTile = 32;  // rows per cache tile

void load_elements(const void* src, int64_t first, int n, DType dtype, double* dst) {
  for (int c = 0; c < n; ++c) dst[c] = load_as_float(src, first + c, dtype);
}

}  // namespace

void verify_full(const VerifyParams& p, float* o, float* lse) {
  validate(p);
  const bool has_rows = p.q_indptr[p.batch] != 0;  // o and lse have total_q rows
  TREEMLA_CHECK(o != nullptr || !has_rows, "o is null");
  TREEMLA_CHECK(lse != nullptr || !has_rows, "lse is null");
  const int H = p.num_heads;
  const bool see_prefix = p.part != VerifyPart::kTail;
  const bool see_tail = p.part != VerifyPart::kPrefix;
  const double ninf = -std::numeric_limits<double>::infinity();

  std::vector<uint8_t> vis, needed;
  std::vector<double> kv, q, s, acc;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.q_indptr[b];
    const int q_len = p.q_indptr[b + 1] - p.q_indptr[b];
    const int64_t prefix = p.prefix_lens[b];
    if (q_len == 0) continue;
    const int64_t n_kv = prefix + q_len;

    // vis[i * n_kv + t]: node i sees logical row t.
    vis.assign(static_cast<size_t>(q_len * n_kv), 0);
    for (int i = 0; i < q_len; ++i) {
      uint8_t* row = &vis[static_cast<size_t>(i * n_kv)];
      const uint64_t* mask = p.tree_mask + (q0 + i) * p.mask_words;
      for (int64_t t = 0; t < prefix; ++t) row[t] = see_prefix;
      for (int j = 0; j < q_len; ++j) row[prefix + j] = see_tail && ((mask[j / 64] >> (j % 64)) & 1u);
    }

    // Load only the rows someone sees: a part must never touch the other part's pages.
    needed.assign(static_cast<size_t>(n_kv), 0);
    for (int i = 0; i < q_len; ++i)
      for (int64_t t = 0; t < n_kv; ++t) needed[t] |= vis[i * n_kv + t];
    kv.assign(static_cast<size_t>(n_kv * kHeadDimQK), 0.0);
    for (int64_t t = 0; t < n_kv; ++t) {
      if (!needed[t]) continue;
      const int64_t page = p.page_table[static_cast<int64_t>(b) * p.page_table_stride + t / p.page_size];
      load_elements(p.kv_cache, (page * p.page_size + t % p.page_size) * kHeadDimQK, kHeadDimQK, p.dtype,
                    &kv[t * kHeadDimQK]);
    }
    q.resize(static_cast<size_t>(q_len) * H * kHeadDimQK);
    load_elements(p.q, q0 * H * kHeadDimQK, q_len * H * kHeadDimQK, p.dtype, q.data());

    // Logits of every (node, head) row r = i * H + h against every column; invisible entries
    // stay -inf. Tiled over rows and columns only so both tiles stay in cache.
    const int64_t R = static_cast<int64_t>(q_len) * H;
    s.assign(static_cast<size_t>(R * n_kv), ninf);
    for (int64_t r0 = 0; r0 < R; r0 += kTile)
      for (int64_t t0 = 0; t0 < n_kv; t0 += kTile) {
        const int64_t t1 = std::min(n_kv, t0 + kTile);
        for (int64_t r = r0; r < std::min(R, r0 + kTile); ++r) {
          const uint8_t* vrow = &vis[static_cast<size_t>(r / H * n_kv)];
          for (int64_t t = t0; t < t1; t += 4) {
            const double* k[4];
            for (int u = 0; u < 4; ++u) k[u] = &kv[std::min(t + u, t1 - 1) * kHeadDimQK];  // clamp the remainder
            double d[4];
            dot_qk4(&q[r * kHeadDimQK], k, d);
            for (int u = 0; u < 4 && t + u < t1; ++u)
              if (vrow[t + u]) s[r * n_kv + t + u] = p.sm_scale * d[u];
          }
        }
      }

    // Softmax over each row's visible columns; s becomes the weights (0 where invisible).
    for (int64_t r = 0; r < R; ++r) {
      const uint8_t* vrow = &vis[static_cast<size_t>(r / H * n_kv)];
      double* sr = &s[r * n_kv];
      double m = ninf;
      bool any = false;
      for (int64_t t = 0; t < n_kv; ++t)
        if (vrow[t]) {
          m = std::max(m, sr[t]);
          any = true;
        }
      if (!any) {  // the row sees nothing: O = 0 (weights all 0), LSE = -inf
        std::fill(sr, sr + n_kv, 0.0);
        lse[q0 * H + r] = -std::numeric_limits<float>::infinity();
        continue;
      }
      double sum = 0.0;
      for (int64_t t = 0; t < n_kv; ++t)
        if (vrow[t]) sum += std::exp(sr[t] - m);
      for (int64_t t = 0; t < n_kv; ++t) sr[t] = vrow[t] ? std::exp(sr[t] - m) / sum : 0.0;
      lse[q0 * H + r] = static_cast<float>(m + std::log(sum));
    }

    // O = P V, V being the first 512 columns of each latent row.
    acc.resize(static_cast<size_t>(kTile) * kHeadDimV);
    for (int64_t r0 = 0; r0 < R; r0 += kTile) {
      const int64_t r1 = std::min(R, r0 + kTile);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t t0 = 0; t0 < n_kv; t0 += kTile) {
        const int64_t t1 = std::min(n_kv, t0 + kTile);
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t t = t0; t < t1; t += 4) {
            const double* v[4];
            double w[4] = {0, 0, 0, 0};  // past the end, and where invisible, the weight is 0
            for (int u = 0; u < 4; ++u) {
              v[u] = &kv[std::min(t + u, t1 - 1) * kHeadDimQK];
              if (t + u < t1) w[u] = s[r * n_kv + t + u];
            }
            if (w[0] == 0.0 && w[1] == 0.0 && w[2] == 0.0 && w[3] == 0.0) continue;
            axpy4(w, v, &acc[static_cast<size_t>(r - r0) * kHeadDimV]);
          }
        }
      }
      for (int64_t r = r0; r < r1; ++r)
        for (int c = 0; c < kHeadDimV; ++c)
          o[(q0 * H + r) * kHeadDimV + c] = static_cast<float>(acc[static_cast<size_t>(r - r0) * kHeadDimV + c]);
    }
  }
}

}  // namespace treemla::cpu
