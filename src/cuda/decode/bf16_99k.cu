// Explicit instantiation: decode family, bf16, DecodeTraits99K.
#include "cuda/decode/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry decode_entry<DecodeTraits99K<__nv_bfloat16>>() {
  return make_decode_entry<DecodeTraits99K<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
