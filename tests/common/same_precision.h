// treemla tests: a same-precision baseline of verify attention (test-only, never in the library).
//
// What a correct mma.sync kernel computes, written out plainly on the CPU:
//   - Q and K/V as given (bf16 / fp16; an fp32 case stays fp32);
//   - S = q . k accumulated in fp32 (the products of two bf16 or fp16 values are exact in fp32);
//   - an online softmax in fp32 over blocks of `block` keys, in the log2 domain as the kernels
//     do it: p = exp2(s * scale_log2 - m * scale_log2), scale_log2 = sm_scale * log2(e);
//   - P rounded to the input dtype before P V; the row sum of each block's fp32 P added to the
//     rescaled running sum l (l = l * alpha + block sum);
//   - O accumulated in fp32, multiplied by 1 / l, rounded to the input dtype at the end; the LSE
//     in fp32, m * scale_log2 + log2(l), times ln 2.
// The prefix blocks are cut into `splits` near-equal ranges (split s takes blocks
// [s * blocks / splits, (s + 1) * blocks / splits)) whose fp32 partial states (O normalized,
// log2 LSE) are merged by LSE, and the tree tail rides with the last split: the kernels' split
// and combine. A different block size or split count is a different, equally correct order.
// Splits hold at most max_split_blocks blocks (8,192 keys by default): every design cuts a
// prefix that long across SMs, and one fp32 running sum over 262,144 keys drifts by about 1e-3
// in the LSE, as much as losing one key in 1,024 would change it.
//
// Its per-row error against the double reference (cpu::verify_full) is the yardstick for the
// GPU's (row_check.h). It also reports, per (node, head) row, two magnitudes that scale the
// rounding error of S: A = sm_scale * sum_t w_t sum_c |q_c k_tc| and V = sum_t w_t max_c |v_tc|,
// with w the softmax weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "treemla/attention.h"
#include "treemla/dtype.h"
#include "treemla/error.h"

namespace treemla::test {

struct BaselineOptions {
  int block = 32;              // keys per online-softmax block
  int splits = 1;              // prefix splits merged by LSE at the end, at least
  int max_split_blocks = 256;  // and as many more as keep each split within this many blocks
};

struct BaselineResult {
  std::vector<float> o, lse;  // [rows, 512] (the dtype's values, widened) and [rows], natural log
  std::vector<double> logit_mag;  // A per row (0 for a row that sees nothing)
  std::vector<double> value_mag;  // V per row
};

namespace same_precision_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

inline float round_to(DType t, float x) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(x));
    case DType::kFP16:
      return fp16_to_float(float_to_fp16(x));
    default:
      return x;
  }
}

// Online softmax state of one (node, head) row. m is the running max of the raw scores.
struct RowState {
  float m = -INFINITY, l = 0.f;
  std::vector<float> acc = std::vector<float>(kHeadDimV, 0.f);
  double a = 0, v = 0;  // sum_t p_t A_t and sum_t p_t V_t, scaled like l
};

// Partial result of one split: O normalized, log2-domain LSE.
struct Partial {
  std::vector<float> o = std::vector<float>(kHeadDimV, 0.f);
  float lse2 = -INFINITY;
  double a = 0, v = 0;
};

}  // namespace same_precision_detail

inline BaselineResult same_precision_baseline(const VerifyParams& p, BaselineOptions opt = {}) {
  using namespace same_precision_detail;
  cpu::validate(p);
  TREEMLA_CHECK(opt.block >= 1 && opt.splits >= 1 && opt.max_split_blocks >= 1,
                "baseline: block, splits and max_split_blocks must be >= 1, got "
                    << opt.block << ", " << opt.splits << ", " << opt.max_split_blocks);
  const int H = p.num_heads;
  const int64_t total_rows = static_cast<int64_t>(p.q_indptr[p.batch]) * H;
  const float sc = p.sm_scale * kLog2e;
  const bool see_prefix = p.part != VerifyPart::kTail, see_tail = p.part != VerifyPart::kPrefix;
  BaselineResult out;
  out.o.assign(static_cast<size_t>(total_rows) * kHeadDimV, 0.f);
  out.lse.assign(static_cast<size_t>(total_rows), -INFINITY);
  out.logit_mag.assign(static_cast<size_t>(total_rows), 0.0);
  out.value_mag.assign(static_cast<size_t>(total_rows), 0.0);

  std::vector<float> q, keys, s, pw, pv(kHeadDimV);
  std::vector<double> absdot, vmax;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.q_indptr[b];
    const int q_len = p.q_indptr[b + 1] - p.q_indptr[b];
    const int64_t prefix = p.prefix_lens[b];
    const int rows = q_len * H;
    if (rows == 0) continue;
    q.resize(static_cast<size_t>(rows) * kHeadDimQK);
    for (int64_t e = 0; e < static_cast<int64_t>(q.size()); ++e)
      q[e] = load_as_float(p.q, q0 * H * kHeadDimQK + e, p.dtype);
    auto sees_tail = [&](int r, int64_t j) {
      const uint64_t* mask = p.tree_mask + (q0 + r / H) * p.mask_words;
      return see_tail && ((mask[j / 64] >> (j % 64)) & 1u) != 0;
    };
    // Keys [t0, t1) of this request, t >= prefix being tail node t - prefix, into `states`.
    auto attend = [&](std::vector<RowState>& states, int64_t t0, int64_t t1) {
      const int n = static_cast<int>(t1 - t0);
      keys.resize(static_cast<size_t>(n) * kHeadDimQK);
      vmax.assign(n, 0.0);
      for (int k = 0; k < n; ++k) {
        const int64_t t = t0 + k;
        const int64_t page =
            p.page_table[static_cast<int64_t>(b) * p.page_table_stride + t / p.page_size];
        const int64_t first = (page * p.page_size + t % p.page_size) * kHeadDimQK;
        bool anyone = t < prefix;
        for (int r = 0; r < rows && !anyone; r += H) anyone = sees_tail(r, t - prefix);
        if (!anyone) continue;  // never read a row nobody sees
        for (int c = 0; c < kHeadDimQK; ++c)
          keys[k * kHeadDimQK + c] = load_as_float(p.kv_cache, first + c, p.dtype);
        for (int c = 0; c < kHeadDimV; ++c)
          vmax[k] = std::max(vmax[k], std::fabs(double(keys[k * kHeadDimQK + c])));
      }
      s.resize(n);
      pw.resize(n);
      absdot.resize(n);
      for (int r = 0; r < rows; ++r) {
        RowState& st = states[r];
        const float* qr = &q[static_cast<size_t>(r) * kHeadDimQK];
        float block_max = -INFINITY;
        for (int k = 0; k < n; ++k) {
          const int64_t t = t0 + k;
          if (t >= prefix && !sees_tail(r, t - prefix)) {
            s[k] = -INFINITY;
            continue;
          }
          float dot = 0.f;
          double mag = 0;
          for (int c = 0; c < kHeadDimQK; ++c) {
            dot += qr[c] * keys[k * kHeadDimQK + c];
            mag += std::fabs(double(qr[c]) * keys[k * kHeadDimQK + c]);
          }
          s[k] = dot;
          absdot[k] = mag * p.sm_scale;
          block_max = std::max(block_max, dot);
        }
        if (block_max == -INFINITY) continue;  // nothing visible in this block
        const float m_new = std::max(st.m, block_max);
        const float mu = m_new * sc;
        const float alpha = st.m == -INFINITY ? 0.f : std::exp2(std::fma(st.m, sc, -mu));
        float block_sum = 0.f;  // the block's row sum first, then l = l * alpha + block_sum
        double a = st.a * alpha, v = st.v * alpha;
        for (int k = 0; k < n; ++k) {
          pw[k] = s[k] == -INFINITY ? 0.f : std::exp2(std::fma(s[k], sc, -mu));
          block_sum += pw[k];
          a += pw[k] * absdot[k];
          v += pw[k] * vmax[k];
        }
        const float l = st.l * alpha + block_sum;
        // One block of P V with P in the input dtype, summed over the block's keys in fp32.
        std::fill(pv.begin(), pv.end(), 0.f);
        for (int k = 0; k < n; ++k) {
          if (pw[k] == 0.f) continue;
          const float pk = round_to(p.dtype, pw[k]);
          for (int c = 0; c < kHeadDimV; ++c) pv[c] += pk * keys[k * kHeadDimQK + c];
        }
        for (int c = 0; c < kHeadDimV; ++c) st.acc[c] = st.acc[c] * alpha + pv[c];
        st.m = m_new;
        st.l = l;
        st.a = a;
        st.v = v;
      }
    };
    auto finish = [&](const RowState& st, Partial& part) {
      if (st.l == 0.f) return;  // the split saw nothing: O = 0, LSE = -inf
      const float inv = 1.f / st.l;
      for (int c = 0; c < kHeadDimV; ++c) part.o[c] = st.acc[c] * inv;
      part.lse2 = st.m * sc + std::log2(st.l);
      part.a = st.a / st.l;
      part.v = st.v / st.l;
    };

    // Splits of the prefix blocks; the tail with the last split.
    const int64_t blocks = see_prefix ? (prefix + opt.block - 1) / opt.block : 0;
    const int64_t wanted =
        std::max<int64_t>(opt.splits, (blocks + opt.max_split_blocks - 1) / opt.max_split_blocks);
    const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, blocks)));
    std::vector<std::vector<Partial>> parts(splits, std::vector<Partial>(rows));
    std::vector<RowState> states;
    for (int sp = 0; sp < splits; ++sp) {
      states.assign(rows, RowState{});
      for (int64_t blk = sp * blocks / splits; blk < (sp + 1) * blocks / splits; ++blk)
        attend(states, blk * opt.block, std::min(prefix, (blk + 1) * opt.block));
      if (sp == splits - 1 && see_tail)
        for (int64_t t0 = prefix; t0 < prefix + q_len; t0 += opt.block)
          attend(states, t0, std::min(prefix + q_len, t0 + opt.block));
      for (int r = 0; r < rows; ++r) finish(states[r], parts[sp][r]);
    }
    // Combine by LSE in fp32 (the combine kernel), then round O to the dtype.
    for (int r = 0; r < rows; ++r) {
      const int64_t row = q0 * H + r;
      float mx = -INFINITY;
      for (int sp = 0; sp < splits; ++sp) mx = std::max(mx, parts[sp][r].lse2);
      if (mx == -INFINITY) continue;  // the row sees nothing
      float wsum = 0.f;
      std::vector<float> o(kHeadDimV, 0.f);
      double a = 0, v = 0;
      for (int sp = 0; sp < splits; ++sp) {
        const Partial& part = parts[sp][r];
        if (part.lse2 == -INFINITY) continue;
        const float w = splits == 1 ? 1.f : std::exp2(part.lse2 - mx);
        wsum += w;
        for (int c = 0; c < kHeadDimV; ++c) o[c] += w * part.o[c];
        a += w * part.a;
        v += w * part.v;
      }
      for (int c = 0; c < kHeadDimV; ++c)
        out.o[row * kHeadDimV + c] = round_to(p.dtype, o[c] / wsum);
      out.lse[row] = (mx + std::log2(wsum)) * kLn2;
      out.logit_mag[row] = a / wsum;
      out.value_mag[row] = v / wsum;
    }
  }
  return out;
}

}  // namespace treemla::test
