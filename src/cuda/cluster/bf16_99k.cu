// Explicit instantiation: cluster family, bf16, ClusterTraits99K.
#include "cuda/cluster/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cluster_entry<ClusterTraits99K<__nv_bfloat16>>() {
  return make_cluster_entry<ClusterTraits99K<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
