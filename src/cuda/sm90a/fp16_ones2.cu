// Explicit instantiation: sm90a family, one-S-group order with S issued a block ahead (a
// measurement variant), fp16.
#include "cuda/sm90a/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry sm90a_entry<Sm90aTraits<__half, 2>>() {
  return make_sm90a_entry<Sm90aTraits<__half, 2>>();
}
}  // namespace treemla::cuda
