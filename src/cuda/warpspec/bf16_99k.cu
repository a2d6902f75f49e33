// Explicit instantiation: warpspec family, bf16, WarpSpecTraits99K.
#include "cuda/warpspec/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry warpspec_entry<WarpSpecTraits99K<__nv_bfloat16>>() {
  return make_warpspec_entry<WarpSpecTraits99K<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
