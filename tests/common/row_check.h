// treemla tests: per-row comparison of a verify result against the double reference, with
// bounds derived from a same-precision baseline instead of picked tolerances.
//
// Metric. For each (node, head) row r of O [rows, 512] and LSE [rows]:
//   o_max_abs(r) = max_c |O[r, c] - O_ref[r, c]|
//   o_rel_l2(r)  = ||O[r] - O_ref[r]|| / ||O_ref[r]||        (over the 512 columns)
//   lse_abs(r)   = |LSE[r] - LSE_ref[r]|
// A global metric lets one bad row hide among many good ones (one dropped key out of 4,097
// moves its rows' LSE by 2.4e-4 and nothing else); a per-row one does not.
//
// Bounds. e_base(r) is the same metric for the same-precision baseline (same_precision.h: what
// a correct mma.sync kernel computes: bf16/fp16 inputs, fp32 S, fp32 online softmax over 32-key
// blocks, P rounded to the dtype, fp32 O rounded to the dtype) against the double reference.
// A correct kernel goes through the same roundings in another order, so its error is of the
// same size, not the same value. The bound for the result under test is
//   bound(r) = kBoundFactor * e_base(r) + floor(r),     kBoundFactor = 2,
// the factor covering a different order of the same roundings (two instances of a rounding
// error of at most u each differ by at most 2u), and the floor covering a baseline that is
// lucky in a row (an O that happens to round exactly). With u_d the unit roundoff of the input
// dtype (bf16 2^-8, fp16 2^-11), u = 2^-24 that of fp32, n = 576:
//   S term       s(r) = 2 sqrt(n) u A(r) V(r): the first-order change of O from logits that carry
//                fp32 accumulation errors of sqrt(n) u sm_scale sum_c |q_c k_c| (the usual
//                probabilistic bound for a sum of n rounded terms), A and V as in
//                same_precision.h; the 2 because dO = sum_t w_t (dS_t - sum_t' w_t' dS_t') v_t.
//   o_max_abs:   floor = u_d * max_c |O_ref[r, c]| + s(r)     (one rounding of O to the dtype)
//   o_rel_l2:    floor = u_d + sqrt(512) s(r) / ||O_ref[r]||
//   lse_abs:     floor = u (sqrt(n) A(r) + 8 (|LSE_ref[r]| + 2)): the S term, then the fp32
//                rounding of the LSE and its log2 scaling, and exp2 / log2 approximations of a few
//                ulp (ex2.approx and lg2.approx are within 2 ulp) on the row sum.
// Before any of this the inf/NaN positions of O and LSE must match exactly (an empty row has
// LSE -inf and O = 0, and its bound is 0: it must be exactly 0).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/same_precision.h"
#include "treemla/attention.h"

namespace treemla::test {

constexpr double kBoundFactor = 2.0;

inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::kBF16:
      return std::ldexp(1.0, -8);
    case DType::kFP16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -24);
  }
}

// Per-row errors (rows = (node, head) pairs). Non-finite entries are skipped here: their
// positions are checked separately.
struct RowErrors {
  std::vector<double> o_max_abs, o_rel_l2, lse_abs;
  std::vector<int> worst_col;  // column of the largest O error per row
};

inline RowErrors row_errors(const std::vector<float>& o, const std::vector<float>& lse,
                            const std::vector<float>& o_ref, const std::vector<float>& lse_ref) {
  const size_t rows = lse_ref.size();
  RowErrors e{std::vector<double>(rows, 0.0), std::vector<double>(rows, 0.0),
              std::vector<double>(rows, 0.0), std::vector<int>(rows, 0)};
  for (size_t r = 0; r < rows; ++r) {
    double num = 0, den = 0;
    for (int c = 0; c < kHeadDimV; ++c) {
      const double got = o[r * kHeadDimV + c], want = o_ref[r * kHeadDimV + c];
      if (!std::isfinite(got) || !std::isfinite(want)) continue;
      const double d = std::fabs(got - want);
      if (d > e.o_max_abs[r]) {
        e.o_max_abs[r] = d;
        e.worst_col[r] = c;
      }
      num += d * d;
      den += want * want;
    }
    e.o_rel_l2[r] = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
    if (std::isfinite(lse[r]) && std::isfinite(lse_ref[r]))
      e.lse_abs[r] = std::fabs(double(lse[r]) - lse_ref[r]);
  }
  return e;
}

struct RowBounds {
  std::vector<double> o_max_abs, o_rel_l2, lse_abs;
};

// The bounds above for a call p whose double reference is (o_ref, lse_ref); `opt` picks the
// baseline's order (the default is the kernel's 32-key blocks without splits).
inline RowBounds derive_bounds(const VerifyParams& p, const std::vector<float>& o_ref,
                               const std::vector<float>& lse_ref, BaselineOptions opt = {}) {
  const BaselineResult base = same_precision_baseline(p, opt);
  const RowErrors e = row_errors(base.o, base.lse, o_ref, lse_ref);
  const double ud = unit_roundoff(p.dtype), u = std::ldexp(1.0, -24),
               sqrt_n = std::sqrt(double(kHeadDimQK));
  const size_t rows = lse_ref.size();
  RowBounds b{std::vector<double>(rows), std::vector<double>(rows), std::vector<double>(rows)};
  for (size_t r = 0; r < rows; ++r) {
    double max_ref = 0, norm_ref = 0;
    for (int c = 0; c < kHeadDimV; ++c) {
      const double x = std::fabs(double(o_ref[r * kHeadDimV + c]));
      if (!std::isfinite(x)) continue;
      max_ref = std::max(max_ref, x);
      norm_ref += x * x;
    }
    norm_ref = std::sqrt(norm_ref);
    const double s_term = 2 * sqrt_n * u * base.logit_mag[r] * base.value_mag[r];
    b.o_max_abs[r] = kBoundFactor * e.o_max_abs[r] + ud * max_ref + s_term;
    b.o_rel_l2[r] = kBoundFactor * e.o_rel_l2[r] + ud +
                    (norm_ref > 0 ? std::sqrt(double(kHeadDimV)) * s_term / norm_ref : 0.0);
    const double lse_mag = std::isfinite(lse_ref[r]) ? std::fabs(double(lse_ref[r])) : 0.0;
    b.lse_abs[r] =
        kBoundFactor * e.lse_abs[r] + u * (sqrt_n * base.logit_mag[r] + 8 * (lse_mag + 2));
  }
  return b;
}

// The double reference (cpu::verify_full) of a call with the bounds for results compared to it.
struct Reference {
  std::vector<float> o, lse;  // [rows, 512], [rows]
  RowBounds bounds;
};

// cpu::verify_full of p, without bounds.
inline Reference double_reference(const VerifyParams& p) {
  const int64_t rows = static_cast<int64_t>(p.q_indptr[p.batch]) * p.num_heads;
  Reference ref;
  ref.o.assign(static_cast<size_t>(rows) * kHeadDimV, 0.f);
  ref.lse.assign(static_cast<size_t>(rows), 0.f);
  cpu::verify_full(p, ref.o.data(), ref.lse.data());
  return ref;
}

inline Reference reference_with_bounds(const VerifyParams& p, BaselineOptions opt = {}) {
  Reference ref = double_reference(p);
  ref.bounds = derive_bounds(p, ref.o, ref.lse, opt);
  return ref;
}

// got (O [rows, 512] widened to float, LSE [rows]) against ref: inf/NaN positions first, then
// every row within its bounds. The message names the number of rows out of bounds and the worst
// row (largest error / bound of the three metrics) as (node, head), with its worst O element;
// on success it carries the largest ratio, to show the margin.
inline ::testing::AssertionResult rows_within_bounds(const std::vector<float>& o,
                                                     const std::vector<float>& lse,
                                                     const Reference& ref, int num_heads) {
  const int64_t rows = static_cast<int64_t>(ref.lse.size());
  if (o.size() != ref.o.size() || lse.size() != ref.lse.size())
    return ::testing::AssertionFailure()
           << "result sizes o " << o.size() << ", lse " << lse.size() << " != reference sizes "
           << ref.o.size() << ", " << ref.lse.size();
  if (rows == 0) return ::testing::AssertionSuccess() << "no rows";
  const std::vector<int64_t> lshape{rows / num_heads, num_heads},
      oshape{rows / num_heads, num_heads, kHeadDimV};
  if (auto r = nonfinite_positions_match(lse.data(), ref.lse.data(), rows, "lse", lshape); !r)
    return r;
  if (auto r = nonfinite_positions_match(o.data(), ref.o.data(), rows * kHeadDimV, "o", oshape); !r)
    return r;
  const RowErrors e = row_errors(o, lse, ref.o, ref.lse);
  const RowBounds& b = ref.bounds;
  auto ratio = [](double err, double bound) {
    return bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
  };
  int64_t failing = 0, worst = 0;
  double worst_ratio = -1;
  for (int64_t r = 0; r < rows; ++r) {
    const double q =
        std::max({ratio(e.o_max_abs[r], b.o_max_abs[r]), ratio(e.o_rel_l2[r], b.o_rel_l2[r]),
                  ratio(e.lse_abs[r], b.lse_abs[r])});
    failing += q > 1;
    if (q > worst_ratio) {
      worst_ratio = q;
      worst = r;
    }
  }
  std::ostringstream os;
  const int c = e.worst_col[worst];
  os << failing << " of " << rows << " rows out of bounds; worst row " << worst << " [node "
     << worst / num_heads << ", head " << worst % num_heads << "] at " << worst_ratio
     << " x its bound: lse err " << e.lse_abs[worst] << " (bound " << b.lse_abs[worst] << ", got "
     << lse[worst] << ", expected " << ref.lse[worst] << "), o max abs err " << e.o_max_abs[worst]
     << " (bound " << b.o_max_abs[worst] << ") at column " << c << ": got "
     << o[worst * kHeadDimV + c] << ", expected " << ref.o[worst * kHeadDimV + c] << ", o rel L2 "
     << e.o_rel_l2[worst] << " (bound " << b.o_rel_l2[worst] << ")";
  if (failing > 0) return ::testing::AssertionFailure() << os.str();
  return ::testing::AssertionSuccess() << os.str();
}

}  // namespace treemla::test
