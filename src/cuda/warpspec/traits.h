// Tile configuration of the warpspec verify family (src/cuda/warpspec/kernel.cuh) and its
// shared-memory plan: a 64-row tile whose score warps (S = Q K^T and the softmax) and output
// warps (O += P V, and the KV copies) are different warps, mma.sync + bulk copies into an
// mbarrier ring of 16-key stages, sm_90 and newer (sm_120 included), at most 99 KB of shared
// memory.
#pragma once

#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

template <typename T, int kStages_, int kCopyLag_ = 1>
struct WarpSpecTraits {
  using Element = T;                        // q, o
  using KvElement = T;                      // kv_cache
  static constexpr int kBlockN = 16;        // keys a stage (half of the schedule's 32-key block)
  static constexpr int kStages = kStages_;  // stages in the ring
  // At block h the output warps refill the stage of block h - kCopyLag (once every output warp
  // has read it) with block h + kStages - kCopyLag.
  static constexpr int kCopyLag = kCopyLag_;
  static constexpr int kCopyLead = kStages - kCopyLag;
  // Warpgroup 0: four score warps, warp (rg, kh) = (w / 2, w % 2) holds Q of rows [32 rg, +32)
  // and columns [288 kh, +288) in registers. Warpgroups 1 and 2: eight output warps,
  // warp (rg, cq) accumulates O[32 rg .. +32, 128 cq .. +128) and copies KV.
  static constexpr int kScoreWarps = 4;
  static constexpr int kOutWarps = 8;
  static constexpr int kOutThreads = kOutWarps * 32;
  static constexpr int kScoreThreads = kScoreWarps * 32;
  static constexpr int kThreads = (kScoreWarps + kOutWarps) * 32;
  // 12 warps start at 168 registers (65,536 / 384, rounded down to 8); where setmaxnreg exists
  // (sm_90a, sm_100a, sm_120a) the output warpgroups give 16 each to the score warpgroup:
  // Q (144) + S (16) + fragments and addresses; O (128) + P (8) + V fragments, copies and
  // addresses. ptxas (sm_90a): no spill in the score warps, none in the output warps' block
  // loop (the loops keep their rare-path state and the output warps' fragment offsets in shared
  // memory: kOffWalk, kOffCopy, kOffFrag); the output warps' spills are outside it.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kScoreRegs = 200;
  static constexpr int kOutRegs = 152;

  static constexpr int kRowStride = kHeadDimQK + 8;  // +16 B: ldmatrix of 8 rows conflict-free
  static constexpr int kStageBytes = kBlockN * kRowStride * 2;
  static constexpr int kXStride = kBlockN + 8;  // fp32 partial-score rows, conflict-free float2
  static constexpr int kXBytes = 16 * kXStride * 4;  // one m16 tile's partial scores
  static constexpr int kPStride = kBlockN + 8;       // bf16 P rows, conflict-free ldmatrix
  static constexpr int kPBytes = kBlockM * kPStride * 2;

  // Shared memory, bytes from the start of the dynamic allocation.
  static constexpr int kOffStages = 0;
  static constexpr int kOffX = kOffStages + kStages * kStageBytes;  // [2 parity][2 rg][2 m-tile]
  static constexpr int kOffP = kOffX + 8 * kXBytes;                 // [2 parity] P, 64 x 16
  static constexpr int kOffAlpha = kOffP + 2 * kPBytes;             // [2 parity][64] fp32
  static constexpr int kOffML = kOffAlpha + 2 * kBlockM * 4;        // [64] (m, l) fp32 pairs
  // Per-thread state the block loops read only on their rare paths (kernel.cuh, BlockWalk):
  // [kWalkWords][kScoreThreads] words for the score threads (masked blocks), then
  // [kOutWarps * 2][kCopyWords] for the output warps' copy lanes.
  static constexpr int kWalkWords = 8;
  static constexpr int kCopyWords = 12;
  static constexpr int kOffWalk = kOffML + kBlockM * 8;
  static constexpr int kOffCopy = kOffWalk + kWalkWords * kScoreThreads * 4;
  // [kOutThreads] words: an output thread's V and P fragment offsets (kernel.cuh, out_role).
  static constexpr int kOffFrag = kOffCopy + kOutWarps * 2 * kCopyWords * 4;
  static constexpr int kOffBars = kOffFrag + kOutThreads * 4;
  // full[kStages], empty[kStages], pready[2 rg][2], pempty[2 rg][2], mlfull[2 rg], mlempty[2 rg]
  static constexpr int kNumBars = 2 * kStages + 12;
  static constexpr int kSmemBytes = kOffBars + kNumBars * 8;

  // The output warps' epilogue: each warp's slice of the stages holds 16 rows of its 128
  // columns, padded so that the fragment stores of a half-warp hit distinct banks.
  static constexpr int kEpiOutRow = 128 * 2 + 16;
  static constexpr int kEpiPartRow = 128 * 4 + 32;
  static constexpr int kEpiWarpBytes = 16 * kEpiPartRow;
  static_assert(kOutWarps * kEpiWarpBytes <= kStages * kStageBytes, "epilogue slices fit");

  static_assert(kBlockM == 64, "two row groups of 32 rows");
  static_assert(2 * kOutWarps == kBlockN, "lanes 0 and 1 of each output warp copy a block's rows");
  static_assert(sizeof(T) == 2, "16-bit elements");
  static_assert(kScoreRegs % 8 == 0 && kOutRegs % 8 == 0, "setmaxnreg takes multiples of 8");
  static_assert(kScoreRegs + 2 * kOutRegs <= 3 * kLaunchRegs,
                "setmaxnreg moves registers inside the CTA's launch allocation");
  static_assert(kStages >= 3, "one stage for O, one for S, at least one loading");
  static_assert(kCopyLag >= 1 && kCopyLead >= 2, "copies at least two blocks ahead");

  static_assert(kOffCopy % 16 == 0 && kCopyWords % 4 == 0, "copy lanes' state read as int4");
  static_assert(kOffBars % 8 == 0, "mbarriers are 8-byte aligned");
};

// The family's one configuration: four stages (the most that fit 99 KB), one CTA per SM.
template <typename T>
using WarpSpecTraits99K = WarpSpecTraits<T, 4>;

static_assert(WarpSpecTraits99K<short>::kSmemBytes <= kSmem99K, "99 KB config must fit sm_120");

}  // namespace treemla::cuda
