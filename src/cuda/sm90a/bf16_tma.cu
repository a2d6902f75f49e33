// Explicit instantiation: sm90a family, TMA kernel, bf16.
#include "cuda/sm90a/kernel_tma.cuh"

namespace treemla::cuda {
template <>
AltKernel sm90a_tma_kernel<Sm90aTmaTraits<__nv_bfloat16>>() {
  return make_sm90a_tma_kernel<Sm90aTmaTraits<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
