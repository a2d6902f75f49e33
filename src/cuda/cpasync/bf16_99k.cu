// Explicit instantiation: cpasync family, bf16, CpAsyncTraits99K.
#include "cuda/cpasync/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cpasync_entry<CpAsyncTraits99K<__nv_bfloat16>>() {
  return make_cpasync_entry<CpAsyncTraits99K<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
