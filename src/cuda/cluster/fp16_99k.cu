// Explicit instantiation: cluster family, fp16, ClusterTraits99K.
#include "cuda/cluster/kernel.cuh"

namespace treemla::cuda {
template <>
KernelEntry cluster_entry<ClusterTraits99K<__half>>() {
  return make_cluster_entry<ClusterTraits99K<__half>>();
}
}  // namespace treemla::cuda
