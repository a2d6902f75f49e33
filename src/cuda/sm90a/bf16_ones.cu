// Explicit instantiation: sm90a family, one-S-group order (a measurement variant), bf16.
#include "cuda/sm90a/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry sm90a_entry<Sm90aTraits<__nv_bfloat16, 1>>() {
  return make_sm90a_entry<Sm90aTraits<__nv_bfloat16, 1>>();
}
}  // namespace treemla::cuda
