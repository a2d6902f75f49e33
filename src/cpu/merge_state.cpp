// treemla: merging two partial attention states by their log-sum-exp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "treemla/attention.h"
#include "treemla/error.h"

namespace treemla::cpu {

void merge_state(const float* v_a, const float* s_a, const float* v_b, const float* s_b, float* v,
                 float* s, int64_t tokens, int heads, int dim) {
  TREEMLA_CHECK(tokens >= 0, "tokens = " << tokens << " must be >= 0");
  TREEMLA_CHECK(heads >= 0, "heads = " << heads << " must be >= 0");
  TREEMLA_CHECK(dim >= 0, "dim = " << dim << " must be >= 0");
  const int64_t n = tokens * heads;
  if (n == 0) return;
  TREEMLA_CHECK(s_a != nullptr && s_b != nullptr && s != nullptr,
                "s_a, s_b and s must not be null");
  TREEMLA_CHECK(dim == 0 || (v_a != nullptr && v_b != nullptr && v != nullptr),
                "v_a, v_b and v must not be null");
  for (int64_t k = 0; k < n; ++k) {
    // Both LSEs are read before s[k] is written: s may alias s_a or s_b.
    const double sa = s_a[k], sb = s_b[k];
    const bool empty_a = !std::isfinite(sa), empty_b = !std::isfinite(sb);
    const float* va = v_a + k * dim;
    const float* vb = v_b + k * dim;
    float* vo = v + k * dim;
    // Element-wise loops below read va[c] and vb[c] before writing vo[c], which is what makes
    // v == v_a or v == v_b safe.
    if (empty_a && empty_b) {
      std::fill(vo, vo + dim, 0.f);
      s[k] = -std::numeric_limits<float>::infinity();
    } else if (empty_b) {
      for (int c = 0; c < dim; ++c) vo[c] = va[c];
      s[k] = static_cast<float>(sa);
    } else if (empty_a) {
      for (int c = 0; c < dim; ++c) vo[c] = vb[c];
      s[k] = static_cast<float>(sb);
    } else {
      const double m = std::max(sa, sb);
      const double wa = std::exp(sa - m), wb = std::exp(sb - m);  // the larger is exactly 1
      const double sum = wa + wb;
      const double fa = wa / sum, fb = wb / sum;
      for (int c = 0; c < dim; ++c) vo[c] = static_cast<float>(fa * va[c] + fb * vb[c]);
      s[k] = static_cast<float>(m + std::log(sum));
    }
  }
}

}  // namespace treemla::cpu
