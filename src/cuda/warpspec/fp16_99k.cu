// Explicit instantiation: warpspec family, fp16, WarpSpecTraits99K.
#include "cuda/warpspec/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry warpspec_entry<WarpSpecTraits99K<__half>>() {
  return make_warpspec_entry<WarpSpecTraits99K<__half>>();
}
}  // namespace treemla::cuda
