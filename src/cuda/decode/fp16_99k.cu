// Explicit instantiation: decode family, fp16, DecodeTraits99K.
#include "cuda/decode/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry decode_entry<DecodeTraits99K<__half>>() {
  return make_decode_entry<DecodeTraits99K<__half>>();
}
}  // namespace treemla::cuda
