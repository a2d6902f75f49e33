// Tile configuration of the decode verify family (src/cuda/decode/kernel.cuh): row tiles of at
// most 16 rows (q_len * H <= 16, e.g. q_len = 1 with H <= 16), mma.sync on 4 compute warps, two
// producer warps that copy the KV rows into an mbarrier ring of 16-key stages (bulk copies on
// sm_90 and newer, cp.async before), sm_80 .. sm_120, and its shared-memory plan. A CTA is small
// (one 16-row tile), so two of them share an SM where the shared memory allows it.
#pragma once

#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

// Rows of the decode family's tile: one m16 tile of mma.sync.
constexpr int kDecodeRows = 16;

template <typename T, int kStages_>
struct DecodeTraits {
  using Element = T;                        // q, o
  using KvElement = T;                      // kv_cache
  static constexpr int kBlockN = 16;        // keys a stage (half of the schedule's 32-key block)
  static constexpr int kStages = kStages_;  // stages in the ring
  // Compute warp w: a partial S over the 144 columns [144 w, +144) for the 16 keys of a block,
  // then O += P V for the output columns [kOCols w, +kOCols).
  static constexpr int kComputeWarps = 4;
  static constexpr int kComputeThreads = kComputeWarps * 32;
  // Warps 4 .. 4 + kProducerWarps - 1 copy the rows: producer warp p the kBlockN / kProducerWarps
  // rows [p kProducerRows, +kProducerRows) of every block, so each issues half the copies.
  static constexpr int kProducerWarps = 2;
  static constexpr int kProducerRows = kBlockN / kProducerWarps;
  static constexpr int kThreads = kComputeThreads + 32 * kProducerWarps;
  static constexpr int kOCols = kHeadDimV / kComputeWarps;
  static constexpr int kOTiles = kOCols / 8;  // n8 tiles of O a warp owns
  // Launch bounds: two CTAs an SM where the SM's shared memory holds two (sm_90, sm_100: 228 KB;
  // six warps a CTA, 12 an SM, three a scheduler, leave 170 registers a thread: 168 on sm_90a,
  // as with five), one elsewhere (sm_80: 164 KB; sm_86, sm_89, sm_120: 100 KB).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000)
  static constexpr int kCtasPerSm = 2;
#else
  static constexpr int kCtasPerSm = 1;
#endif
  // Rows padded by 32 bytes: each row's bulk copy lands 32-byte aligned, so the L2 sees about a
  // third fewer requests than with the 16-byte pad (ldmatrix then meets 2-way bank conflicts,
  // which cost less: 3% faster on the H200; docs/verify-kernel.md, "The decode family").
  static constexpr int kRowStride = kHeadDimQK + 16;
  static constexpr int kStageBytes = kBlockN * kRowStride * 2;
  static constexpr int kXStride = kBlockN + 8;  // fp32 partial-S rows, conflict-free float2
  static constexpr int kXBytes = 4 * kDecodeRows * kXStride * 4;  // the four column groups' S

  // Shared memory, bytes from the start of the dynamic allocation: the ring, the partial scores
  // (double-buffered by block parity), full[kStages] and empty[kStages].
  static constexpr int kOffStages = 0;
  static constexpr int kOffX = kOffStages + kStages * kStageBytes;
  static constexpr int kOffBars = kOffX + 2 * kXBytes;
  static constexpr int kSmemBytes = kOffBars + 2 * kStages * 8;

  static_assert(kOTiles % 2 == 0, "x4 ldmatrix loads cover two n8 tiles");
  static_assert(kComputeWarps * 144 == kHeadDimQK, "a warp's partial S: 144 columns");
  static_assert(kStages >= 2, "one stage computed while the next lands");
  static_assert(kOffBars % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(kBlockN % kProducerWarps == 0 && kProducerRows <= 32, "whole rows a producer warp");
  static_assert(sizeof(T) == 2, "16-bit elements");
};

// The family's one configuration: four 16-key stages (three in flight while one is computed),
// 88 KB, so that two CTAs share an SM of sm_90 / sm_100 (228 KB); one per SM on sm_120 (100 KB of
// shared memory per SM), which needs far fewer bytes in flight.
template <typename T>
using DecodeTraits99K = DecodeTraits<T, 4>;

static_assert(DecodeTraits99K<short>::kSmemBytes <= kSmem99K, "99 KB config must fit sm_120");
static_assert(2 * (DecodeTraits99K<short>::kSmemBytes + 1024) <= 233472,
              "two CTAs must share an sm_90 SM (228 KB, 1 KB reserved per CTA)");

}  // namespace treemla::cuda
