// Explicit instantiation: sm90a family, TMA kernel, fp16.
#include "cuda/sm90a/kernel_tma.cuh"

namespace treemla::cuda {
template <>
AltKernel sm90a_tma_kernel<Sm90aTmaTraits<__half>>() {
  return make_sm90a_tma_kernel<Sm90aTmaTraits<__half>>();
}
}  // namespace treemla::cuda
