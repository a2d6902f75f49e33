// Explicit instantiation: verify main kernel, fp16, TraitsSmem99K.
#include "cuda/sm80/verify_launch.h"
#include "cuda/sm80/verify_kernel.cuh"

namespace treemla::cuda {
template <>
const void* verify_main_kernel_ptr<__half, TraitsSmem99K>() {
  return reinterpret_cast<const void*>(&verify_main_kernel<__half, TraitsSmem99K>);
}
}  // namespace treemla::cuda
