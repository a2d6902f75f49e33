// Tile configurations of the decode verify family (src/cuda/decode/kernel.cuh): row tiles of at
// most 16 rows (q_len * H <= 16, e.g. q_len = 1 with H <= 16), mma.sync + cp.async, sm_80 ..
// sm_120, and its shared-memory plan. A CTA is small (8 warps, one 16-row tile), so two of them
// share an SM where the shared memory allows it (at 128 registers a thread).
#pragma once

#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

// Rows of the decode family's tile: one m16 tile of mma.sync.
constexpr int kDecodeRows = 16;

template <typename T, int kStages_, int kWarps_>
struct DecodeTraits {
  using Element = T;                        // q, o
  using KvElement = T;                      // kv_cache
  static constexpr int kBlockN = 32;        // KV rows per block (the schedule's block)
  static constexpr int kStages = kStages_;  // cp.async pipeline depth
  // Warp w computes a partial S over the 144 columns [144 (w % 4), +144) for the keys of its key
  // group w / 4 (32 / kKeyGroups of them), and O += P V for output columns
  // [kOCols w, kOCols w + kOCols).
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeyGroups = kWarps / 4;
  static constexpr int kQKTiles = kBlockN / kKeyGroups / 8;  // n8 tiles of S a warp computes
  static constexpr int kOCols = kHeadDimV / kWarps;
  static constexpr int kOTiles = kOCols / 8;                       // n8 tiles of O a warp owns
  static constexpr int kRowThreads = kThreads / kBlockN;           // threads copying one KV row
  static constexpr int kRowChunks = kHeadDimQK / 8 / kRowThreads;  // 16-byte copies a thread
  // Launch bounds: registers for two CTAs an SM where the SM's shared memory holds two (sm_90,
  // sm_100: 228 KB; 128 registers a thread), one elsewhere (sm_80: 164 KB; sm_86, sm_89,
  // sm_120: 100 KB), where the cap would only spill.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000)
  static constexpr int kCtasPerSm = 2;
#else
  static constexpr int kCtasPerSm = 1;
#endif
  static constexpr int kRowStride = kHeadDimQK + 8;  // +16 B: ldmatrix rows hit distinct banks
  static constexpr int kXStride = kBlockN + 8;       // fp32 partial-S rows, conflict-free float2
  static constexpr int kKVBytes = kStages * kBlockN * kRowStride * 2;
  static constexpr int kXBytes = 4 * kDecodeRows * kXStride * 4;  // the four column groups' S
  // Ring of page-table entries, one slot of 32 per block from kStages - 1 blocks before the
  // block's KV copies are issued until they are.
  static constexpr int kPageSlots = 2 * kStages;
  static constexpr int kPageBytes = kPageSlots * kBlockN * 4;
  static constexpr int kSmemBytes = kKVBytes + kXBytes + kPageBytes;
  static_assert(kWarps == 4 || kWarps == 8, "four column groups of the 576, one or two key groups");
  static_assert(kQKTiles % 2 == 0 && kOTiles % 2 == 0, "x4 ldmatrix loads cover two n8 tiles");
  static_assert(kRowChunks * kRowThreads * 8 == kHeadDimQK, "a row's 16-byte chunks");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(sizeof(T) == 2, "16-bit elements");
};

// The family's one configuration: two stages (96 KB with the partial-S buffer and the page ring),
// 8 warps at up to 128 registers, so that two CTAs share an SM of sm_90 / sm_100 (228 KB); one
// per SM on sm_120 (100 KB of shared memory per SM), which needs far fewer bytes in flight. Four
// stages with one CTA per SM streamed slower on the H200 (docs/verify-kernel.md, "The decode
// family"), so there is no larger configuration.
template <typename T>
using DecodeTraits99K = DecodeTraits<T, 2, 8>;

static_assert(DecodeTraits99K<short>::kSmemBytes <= kSmem99K, "99 KB config must fit sm_120");
static_assert(2 * (DecodeTraits99K<short>::kSmemBytes + 1024) <= 233472,
              "two CTAs must share an sm_90 SM (228 KB, 1 KB reserved per CTA)");

}  // namespace treemla::cuda
