// Explicit instantiation: cpasync family, fp16, CpAsyncTraitsLarge.
#include "cuda/cpasync/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cpasync_entry<CpAsyncTraitsLarge<__half>>() {
  return make_cpasync_entry<CpAsyncTraitsLarge<__half>>();
}
}  // namespace treemla::cuda
