// Tile configurations of the portable (mma.sync) verify kernel and their shared-memory plans.
#pragma once

#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

constexpr int kSmemSm120 = 101376;  // 99 KB opt-in per block on sm_86, sm_89, sm_120
constexpr int kSmemSm80 = 166912;   // 163 KB on sm_80
constexpr int kSmemSm90 = 232448;   // 227 KB on sm_90 and sm_100

template <int kBlockN_, int kStages_>
struct VerifyTraits {
  static constexpr int kBlockN = kBlockN_;  // KV rows per block
  static constexpr int kStages = kStages_;  // cp.async pipeline depth
  static constexpr int kWarps = 8;          // 4 row groups of 16 rows x 2 halves
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNTiles = kBlockN / 8;          // n8 tiles of S per warp
  static constexpr int kRowStride = kHeadDimQK + 8;    // +16 B: ldmatrix rows hit distinct banks
  static constexpr int kSStride = kBlockN + 8;         // fp32 exchange rows, conflict-free float2
  static constexpr int kKVBytes = kStages * kBlockN * kRowStride * 2;
  static constexpr int kSBytes = 2 * kBlockM * kSStride * 4;
  static constexpr int kSmemBytes = kKVBytes + kSBytes;
  static_assert(kBlockN == 32, "the tail bitmap and mask extraction assume 32-row blocks");
  static_assert(kStages >= 2, "need at least double buffering");
};

// 99 KB: two stages of 32 rows. Runs everywhere; the only configuration for sm_86/89/120.
using TraitsSmem99K = VerifyTraits<32, 2>;
// Larger parts (sm_80, sm_90, sm_100): a third stage hides more load latency.
using TraitsSmemLarge = VerifyTraits<32, 3>;

static_assert(TraitsSmem99K::kSmemBytes <= kSmemSm120, "99 KB config must fit sm_120");
static_assert(TraitsSmemLarge::kSmemBytes <= kSmemSm80, "large config must fit sm_80");

}  // namespace treemla::cuda
