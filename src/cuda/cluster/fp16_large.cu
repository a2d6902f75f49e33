// Explicit instantiation: cluster family, fp16, ClusterTraitsLarge.
#include "cuda/cluster/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cluster_entry<ClusterTraitsLarge<__half>>() {
  return make_cluster_entry<ClusterTraitsLarge<__half>>();
}
}  // namespace treemla::cuda
