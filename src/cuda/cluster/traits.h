// Configurations of the cluster verify family (src/cuda/cluster/kernel.cuh) and their
// shared-memory plans. Both CTAs of a pair use the same layout, so an offset names the same
// buffer in either CTA (the peer's copy is reached through map_to_rank).
#pragma once

#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

template <typename T, int kStages_>
struct ClusterTraits {
  using Element = T;    // q, o
  using KvElement = T;  // kv_cache (an 8-bit KV cache would be a new traits type)
  static constexpr int kStages = kStages_;  // KV blocks in flight per CTA
  static constexpr int kBlockN = 32;        // keys per KV block
  static constexpr int kConsumerWarps = 8;  // 2 row groups x 2 dim halves x 2 key halves
  // Three warpgroups: two compute, one whose first warp is the producer. A warp's registers
  // come from its scheduler's quarter of the register file and warp w runs on scheduler w % 4,
  // so 12 warps start at 168 registers; where setmaxnreg exists (sm_90a, sm_100a, sm_120a) the
  // producer group gives its registers to the compute warps (kComputeRegs, kProducerRegs).
  static constexpr int kThreads = 3 * 128;
  static constexpr int kComputeRegs = 232;
  static constexpr int kProducerRegs = 40;
  static constexpr int kClusterSize = 2;
  static constexpr int kHalfDims = 288;  // KV columns a CTA owns: 256 latent + 32 rope
  // Stage rows are the CTA's 576 bytes (36 chunks of 16 B), unpadded: chunk c of row r is stored
  // at chunk swizzle(r, c) (kernel.cuh), which keeps ldmatrix of 8 rows conflict-free.
  static constexpr int kRowBytes = kHalfDims * 2;
  static constexpr int kStageBytes = kBlockN * kRowBytes;

  // Shared memory, in bytes from the start of the dynamic allocation.
  static constexpr int kOffStages = 0;
  static constexpr int kExchBytes = 1024;  // one warp's 16 x 16 fp32 scores, fragment order
  static constexpr int kOffX = kOffStages + kStages * kStageBytes;  // [8 warps]: dh-pair swap
  static constexpr int kOffY =
      kOffX + kConsumerWarps * kExchBytes;                   // [8 warps]: written by the peer
  static constexpr int kPSlotBytes = kBlockM * kBlockN * 2;  // P, 64 rows x 32 keys
  static constexpr int kOffP = kOffY + kConsumerWarps * kExchBytes;        // [2 slots]
  static constexpr int kOffMax = kOffP + 2 * kPSlotBytes;                  // [2][8 warps][16] fp32
  static constexpr int kOffAlpha = kOffMax + 2 * kConsumerWarps * 16 * 4;  // [2][64] fp32
  static constexpr int kOffEpiL = kOffAlpha + 2 * kBlockM * 4;             // [8 warps][16] fp32
  static constexpr int kOffEpiM = kOffEpiL + kConsumerWarps * 16 * 4;      // [64] fp32
  static constexpr int kOffBars = kOffEpiM + kBlockM * 4;
  // full[kStages], empty[kStages], yfull[8], yempty[8]
  static constexpr int kNumBars = 2 * kStages + 2 * kConsumerWarps;
  static constexpr int kSmemBytes = kOffBars + kNumBars * 8;

  static_assert(kBlockM == 64, "two row groups of 32 rows");
  static_assert(sizeof(T) == 2, "16-bit elements");
  // setmaxnreg moves registers inside the CTA's launch allocation (168 per thread for 384 threads):
  // what the compute warpgroups gain, the producer warpgroup must give up, or .inc waits forever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // 168
  static_assert(2 * kComputeRegs + kProducerRegs <= 3 * kLaunchRegs,
                "setmaxnreg budget of the CTA");
  static_assert(kStages >= 4,
                "the compute warps hold two stages (software pipelining) while two load");
  static_assert(kOffBars % 8 == 0, "mbarriers are 8-byte aligned");
};

// 99 KB: four stages. Runs everywhere the family runs; the only configuration for sm_120.
template <typename T>
using ClusterTraits99K = ClusterTraits<T, 4>;
// sm_90 / sm_100: eight stages.
template <typename T>
using ClusterTraitsLarge = ClusterTraits<T, 8>;

static_assert(ClusterTraits99K<short>::kSmemBytes <= kSmem99K,
              "99 KB configuration must fit sm_120");
static_assert(ClusterTraitsLarge<short>::kSmemBytes <= kSmemSm90,
              "large configuration must fit sm_90");

}  // namespace treemla::cuda
