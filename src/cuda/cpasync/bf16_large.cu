// Explicit instantiation: cpasync family, bf16, CpAsyncTraitsLarge.
#include "cuda/cpasync/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cpasync_entry<CpAsyncTraitsLarge<__nv_bfloat16>>() {
  return make_cpasync_entry<CpAsyncTraitsLarge<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
