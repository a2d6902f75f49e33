// Explicit instantiation: cluster family, bf16, ClusterTraitsLarge.
#include "cuda/cluster/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cluster_entry<ClusterTraitsLarge<__nv_bfloat16>>() {
  return make_cluster_entry<ClusterTraitsLarge<__nv_bfloat16>>();
}
}  // namespace treemla::cuda
