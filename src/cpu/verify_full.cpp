// treemla: the specification of verify attention, computed naively in double precision.
//
// For each request it writes down the [q_len x (prefix_len + q_len)] visibility matrix, then
// runs a plain (two-pass, not online) masked softmax per (node, head) row: every logit is one
// loop over the 576 columns, every output one loop over the visible keys. It is an independent
// oracle: it shares no code with verify_split or the kernels, not even the element loads (the
// bf16 / fp16 decoding below is written out here, from the formats' definitions), so a bug in
// a shared helper cannot hide in both. Only the argument checks (validate) are common.
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

// Element i of a q or kv_cache buffer as a double, decoded from its bit pattern.
//   bf16: the upper 16 bits of an IEEE binary32.
//   fp16: sign, 5 exponent bits (bias 15), 10 mantissa bits; exponent 0 is subnormal
//         (mantissa * 2^-24), exponent 31 is inf or NaN.
double element(const void* buffer, int64_t i, DType dtype) {
  if (dtype == DType::kFP32) return static_cast<const float*>(buffer)[i];
  const uint16_t h = static_cast<const uint16_t*>(buffer)[i];
  if (dtype == DType::kBF16) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
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

  std::vector<uint8_t>
      visible;  // [n_kv, q_len]: visible[t * q_len + i] = node i sees logical row t
  std::vector<double> q, key, weights, row_max, sum, acc;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.q_indptr[b];
    const int q_len = p.q_indptr[b + 1] - p.q_indptr[b];
    const int64_t prefix = p.prefix_lens[b];
    if (q_len == 0) continue;
    const int64_t n_kv =
        prefix + q_len;  // logical rows: the prefix, then tail node j at prefix + j
    const int64_t rows = static_cast<int64_t>(q_len) * H;  // (node, head) row r = node * H + head

    // The full visibility matrix: node i sees the whole prefix and the tail nodes of its mask row.
    visible.assign(static_cast<size_t>(n_kv * q_len), 0);
    for (int64_t t = 0; t < n_kv; ++t)
      for (int i = 0; i < q_len; ++i) {
        const uint64_t* mask = p.tree_mask + (q0 + i) * p.mask_words;
        const int64_t j = t - prefix;  // the tail node of row t, when t >= prefix
        const bool sees = t < prefix ? see_prefix : see_tail && ((mask[j / 64] >> (j % 64)) & 1u);
        visible[static_cast<size_t>(t * q_len + i)] = sees;
      }
    auto sees = [&](int64_t t, int64_t r) {
      return visible[static_cast<size_t>(t * q_len + r / H)] != 0;
    };
    auto anyone_sees = [&](int64_t t) {
      for (int i = 0; i < q_len; ++i)
        if (visible[static_cast<size_t>(t * q_len + i)]) return true;
      return false;
    };
    // Decodes the first n columns of logical row t into key; only rows someone sees are ever read
    // (a part must not touch the other part's pages).
    auto load_key = [&](int64_t t, int n) {
      const int64_t page =
          p.page_table[static_cast<int64_t>(b) * p.page_table_stride + t / p.page_size];
      const int64_t first = (page * p.page_size + t % p.page_size) * kHeadDimQK;
      for (int c = 0; c < n; ++c) key[c] = element(p.kv_cache, first + c, p.dtype);
    };

    q.resize(static_cast<size_t>(rows * kHeadDimQK));
    for (int64_t e = 0; e < rows * kHeadDimQK; ++e)
      q[static_cast<size_t>(e)] = element(p.q, q0 * H * kHeadDimQK + e, p.dtype);

    // Logits: weights[t * rows + r] = sm_scale * q_r . k_t for every visible (t, r).
    weights.assign(static_cast<size_t>(n_kv * rows), 0.0);
    key.resize(kHeadDimQK);
    for (int64_t t = 0; t < n_kv; ++t) {
      if (!anyone_sees(t)) continue;
      load_key(t, kHeadDimQK);
      for (int64_t r = 0; r < rows; ++r) {
        if (!sees(t, r)) continue;
        double dot = 0.0;
        for (int c = 0; c < kHeadDimQK; ++c)
          dot += q[static_cast<size_t>(r * kHeadDimQK + c)] * key[c];
        weights[static_cast<size_t>(t * rows + r)] = p.sm_scale * dot;
      }
    }

    // Softmax per row over its visible keys (two passes: the max, then the sum of exp(logit -
    // max)), turning the logits into weights in place; 0 where invisible.
    row_max.assign(static_cast<size_t>(rows), -INFINITY);
    sum.assign(static_cast<size_t>(rows), 0.0);
    for (int64_t t = 0; t < n_kv; ++t)
      for (int64_t r = 0; r < rows; ++r)
        if (sees(t, r))
          row_max[r] = std::max(row_max[r], weights[static_cast<size_t>(t * rows + r)]);
    for (int64_t t = 0; t < n_kv; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double& w = weights[static_cast<size_t>(t * rows + r)];
        w = sees(t, r) ? std::exp(w - row_max[r]) : 0.0;
        sum[r] += w;
      }
    for (int64_t t = 0; t < n_kv; ++t)
      for (int64_t r = 0; r < rows; ++r)
        if (sum[r] > 0) weights[static_cast<size_t>(t * rows + r)] /= sum[r];
    for (int64_t r = 0; r < rows; ++r)  // a row that sees nothing has LSE -inf (and O = 0 below)
      lse[q0 * H + r] = sum[r] > 0 ? static_cast<float>(row_max[r] + std::log(sum[r])) : -INFINITY;

    // O_r = sum_t w_t v_t, V being the first 512 columns of each key row.
    acc.assign(static_cast<size_t>(rows * kHeadDimV), 0.0);
    for (int64_t t = 0; t < n_kv; ++t) {
      if (!anyone_sees(t)) continue;
      load_key(t, kHeadDimV);
      for (int64_t r = 0; r < rows; ++r) {
        const double w = weights[static_cast<size_t>(t * rows + r)];
        for (int c = 0; c < kHeadDimV; ++c)
          acc[static_cast<size_t>(r * kHeadDimV + c)] += w * key[c];
      }
    }
    for (int64_t e = 0; e < rows * kHeadDimV; ++e)
      o[q0 * H * kHeadDimV + e] = static_cast<float>(acc[static_cast<size_t>(e)]);
  }
}

}  // namespace treemla::cpu
