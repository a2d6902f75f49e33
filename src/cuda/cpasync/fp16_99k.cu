// Explicit instantiation: cpasync family, fp16, CpAsyncTraits99K.
#include "cuda/cpasync/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cpasync_entry<CpAsyncTraits99K<__half>>() {
  return make_cpasync_entry<CpAsyncTraits99K<__half>>();
}
}  // namespace treemla::cuda
