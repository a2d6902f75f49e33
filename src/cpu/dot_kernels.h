// treemla CPU reference: the inner loops shared by verify_full and verify_split (double
// precision dot products and weighted sums over the MLA widths).
#pragma once

#include <cstring>

#include "treemla/attention.h"

namespace treemla::cpu::detail {

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
  for (int c = 0; c < kHeadDimV; ++c) a[c] += (w[0] * v[0][c] + w[1] * v[1][c]) + (w[2] * v[2][c] + w[3] * v[3][c]);
}

}  // namespace treemla::cpu::detail
