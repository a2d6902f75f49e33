// Explicit instantiation: sm90a family, fp16.
#include "cuda/sm90a/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry sm90a_entry<Sm90aTraits<__half>>() {
  return make_sm90a_entry<Sm90aTraits<__half>>();
}
}  // namespace treemla::cuda
