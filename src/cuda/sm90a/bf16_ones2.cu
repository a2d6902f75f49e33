// Explicit instantiation: sm90a family, one-S-group order with S issued a block ahead (a
// measurement variant), bf16.
#include "cuda/sm90a/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry sm90a_entry<Sm90aTraits<__nv_bfloat16, 2>>() {
  return make_sm90a_entry<Sm90aTraits<__nv_bfloat16, 2>>();
}
}  // namespace treemla::cuda
