// Tile configurations of the cpasync verify family (mma.sync + cp.async, sm_80 .. sm_120) and
// their shared-memory plans.
#pragma once

#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

template <typename T, int kBlockN_, int kStages_>
struct VerifyTraits {
  using Element = T;    // q, o
  using KvElement = T;  // kv_cache (an 8-bit KV cache would be a new traits type)
  static constexpr int kBlockN = kBlockN_;  // KV rows per block
  static constexpr int kStages = kStages_;  // cp.async pipeline depth
  static constexpr int kWarps = 8;          // 4 row groups of 16 rows x 2 halves
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per warp
  static constexpr int kRowStride = kHeadDimQK + 8;  // +16 B: ldmatrix rows hit distinct banks
  static constexpr int kSStride = kBlockN + 8;       // fp32 exchange rows, conflict-free float2
  static constexpr int kKVBytes = kStages * kBlockN * kRowStride * 2;
  static constexpr int kSBytes = 2 * kBlockM * kSStride * 4;
  static constexpr int kSmemBytes = kKVBytes + kSBytes;
  static_assert(kBlockN == 32, "the tail bitmap and mask extraction assume 32-row blocks");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(sizeof(T) == 2, "16-bit elements");
};

// 99 KB: two stages of 32 rows. Runs everywhere; the only configuration for sm_86/89/120.
template <typename T>
using CpAsyncTraits99K = VerifyTraits<T, 32, 2>;
// Larger parts (sm_80, sm_90, sm_100): a third stage hides more load latency.
template <typename T>
using CpAsyncTraitsLarge = VerifyTraits<T, 32, 3>;

static_assert(CpAsyncTraits99K<short>::kSmemBytes <= kSmem99K, "99 KB config must fit sm_120");
static_assert(CpAsyncTraitsLarge<short>::kSmemBytes <= kSmemSm80, "large config must fit sm_80");

}  // namespace treemla::cuda
