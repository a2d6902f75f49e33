// Explicit instantiation: verify main kernel, bf16, TraitsSmemLarge.
#include "cuda/sm80/verify_launch.h"
#include "cuda/sm80/verify_kernel.cuh"

namespace treemla::cuda {
template <>
const void* verify_main_kernel_ptr<__nv_bfloat16, TraitsSmemLarge>() {
  return reinterpret_cast<const void*>(&verify_main_kernel<__nv_bfloat16, TraitsSmemLarge>);
}
}  // namespace treemla::cuda
