// The dispatch table (see dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cluster/traits.h"
#include "cuda/cpasync/traits.h"
#include "cuda/decode/traits.h"
#include "cuda/dispatch.h"
#include "cuda/sm90a/traits.h"
#include "cuda/warpspec/traits.h"
#include "treemla/error.h"

namespace treemla::cuda {

namespace {

template <typename T>
KernelEntry entry_for(KernelFamily family, TileConfig tile) {
  const bool large = tile == TileConfig::kSmemLarge;
  switch (family) {
    case KernelFamily::kCpAsync:
      return large ? cpasync_entry<CpAsyncTraitsLarge<T>>() : cpasync_entry<CpAsyncTraits99K<T>>();
    case KernelFamily::kCluster:
      return large ? cluster_entry<ClusterTraitsLarge<T>>() : cluster_entry<ClusterTraits99K<T>>();
    case KernelFamily::kSm90a:
      TREEMLA_CHECK(large,
                    "kernel family sm90a has only the smem-large tile configuration (its "
                    "Q and two 64-key KV blocks need "
                        << Sm90aTraits<T>::kSmemBytes << " B of shared memory)");
      {
        KernelEntry e = sm90a_entry<Sm90aTraits<T>>();
        e.alt = sm90a_tma_kernel<Sm90aTmaTraits<T>>();
        return e;
      }
    case KernelFamily::kDecode:
      TREEMLA_CHECK(!large,
                    "kernel family decode has only the smem99k tile configuration (two "
                    "CTAs of "
                        << DecodeTraits99K<T>::kSmemBytes
                        << " B share an SM where it has the shared memory)");
      return decode_entry<DecodeTraits99K<T>>();
    case KernelFamily::kWarpSpec:
      TREEMLA_CHECK(!large, "kernel family warpspec has only the smem99k tile configuration ("
                                << WarpSpecTraits99K<T>::kSmemBytes << " B, one CTA per SM)");
      return warpspec_entry<WarpSpecTraits99K<T>>();
    default:
      TREEMLA_FAIL("kernel family " << static_cast<int>(family) << " is not resolved");
  }
}

}  // namespace

KernelEntry kernel_entry(KernelFamily family, DType dtype, TileConfig tile) {
  TREEMLA_CHECK(tile == TileConfig::kSmem99K || tile == TileConfig::kSmemLarge,
                "tile configuration " << static_cast<int>(tile) << " is not resolved");
  switch (dtype) {
    case DType::kBF16:
      return entry_for<__nv_bfloat16>(family, tile);
    case DType::kFP16:
      return entry_for<__half>(family, tile);
    default:
      TREEMLA_FAIL("dtype must be bf16 or fp16 on the GPU (got " << dtype_name(dtype) << ")");
  }
}

}  // namespace treemla::cuda
