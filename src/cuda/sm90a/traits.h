// The configuration of the sm90a verify family (src/cuda/sm90a/kernel.cuh) and its shared-memory
// plan. One configuration: it needs the 227 KB of an sm_90 CTA (Q and two 64-key KV blocks,
// 72 KB each), so it has no 99 KB variant; sm_120 has no wgmma anyway.
#pragma once

#include "cuda/arch.h"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

template <typename T>
struct Sm90aTraits {
  using Element = T;                  // q, o
  using KvElement = T;                // kv_cache
  static constexpr int kBlockN = 64;  // keys per KV block (two 32-key blocks of the schedule)
  static constexpr int kStages = 2;   // one block per consumer warpgroup
  // Three warpgroups: 0 and 1 compute (output columns [0, 256) and [256, 512)), 2 loads. The
  // launch gives 168 registers a thread; setmaxnreg moves the producer's to the compute groups.
  static constexpr int kThreads = 3 * 128;
  static constexpr int kComputeRegs = 224;
  static constexpr int kProducerRegs = 56;
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // 168
  static_assert(2 * kComputeRegs + kProducerRegs <= 3 * kLaunchRegs,
                "setmaxnreg budget of the CTA (.inc waits forever past it)");

  // A [64 rows][576] tile (Q, or a KV block): 9 chunks of 64 columns, each 64 rows x 128 bytes,
  // 128-byte swizzled (wgmma.cuh). The rope chunk (8) of a KV block holds P once S is computed.
  static constexpr int kChunks = kHeadDimQK / 64;
  static constexpr int kChunkBytes = 64 * 128;
  static constexpr int kTileBytes = kChunks * kChunkBytes;
  static constexpr int kPChunk = kChunks - 1;

  static constexpr int kOffQ = 0;
  static constexpr int kOffStages = kOffQ + kTileBytes;
  static constexpr int kOffMax = kOffStages + kStages * kTileBytes;  // [2][64] fp32 row maxima
  static constexpr int kOffL = kOffMax + 2 * kBlockM * 4;            // [2][64] fp32 row sums
  // A stage lands, and is freed, in three parts: the latent columns [0, 256) (chunks 0-3, the
  // V half that WG0 reads), [256, 512) (chunks 4-7, WG1's V half) and the rope chunk 8 (P once
  // S is computed, read by both). Each part has its own full mbarrier (S starts on the first part
  // while the rest is in flight) and its own empty mbarrier, so the producer refills a part as
  // soon as its own readers are done: chunks 0-3 of a stage once WG0's P V on it is complete,
  // chunks 4-7 once WG1's is, chunk 8 once both are.
  static constexpr int kLoadParts = 3;
  static constexpr int part_begin(int part) { return part == 0 ? 0 : part == 1 ? 4 : 8; }
  static constexpr int part_end(int part) { return part == 0 ? 4 : part == 1 ? 8 : 9; }
  static constexpr int kOffBars = kOffL + 2 * kBlockM * 4;
  static constexpr int kNumBars = 2 * kStages * kLoadParts + 1;
  static constexpr int bar_full(int stage, int part) {
    return kOffBars + 8 * (stage * kLoadParts + part);
  }
  static constexpr int bar_empty(int stage, int part) {
    return kOffBars + 8 * (kStages * kLoadParts + stage * kLoadParts + part);
  }
  // Arrivals that free each part: WG0 alone, WG1 alone, both groups.
  static constexpr int empty_count(int part) { return part == 2 ? 256 : 128; }
  static constexpr int kBarQ = kOffBars + 8 * (2 * kStages * kLoadParts);
  static constexpr int kSmemUsed = kOffBars + kNumBars * 8;
  // The epilogue stages O / l in the KV stages, rows padded so that a warp's fragment stores hit
  // distinct banks: 512 x 16-bit + 16 bytes (the output), 512 x fp32 + 32 bytes (a partial).
  static constexpr int kOutRowBytes = kHeadDimV * 2 + 16;
  static constexpr int kPartRowBytes = kHeadDimV * 4 + 32;
  // The dynamic allocation is only 16-byte aligned; the kernel rounds its base up to 1024 bytes
  // (the swizzle atom), so ask for that much more.
  static constexpr int kSmemBytes = kSmemUsed + 1024;

  static_assert(kBlockM == 64 && kBlockN == 64, "Q and KV tiles are both 64 rows");
  static_assert(sizeof(T) == 2, "16-bit elements");
  static_assert(kOffStages % 1024 == 0 && kTileBytes % 1024 == 0, "1024-byte swizzle atoms");
  static_assert(part_end(kLoadParts - 1) == kChunks && kPChunk == 8, "parts cover the chunks");
  static_assert(kBlockM * kPartRowBytes <= kStages * kTileBytes, "O / l fits in the KV stages");
};

static_assert(Sm90aTraits<short>::kSmemBytes <= kSmemSm90, "must fit an sm_90 CTA");

// The TMA kernel of the family (src/cuda/sm90a/kernel_tma.cuh): the same 64-row tiles and two
// 64-key stages, no producer warpgroup, 256 threads. Q's rope chunk moves to registers once Q has
// landed, and its 8 KB then hold WG1's P for WG0 (kOffP1); WG0's P for WG1 has a buffer of its own
// (kOffP0), so no P lives in a KV stage. Each stage lands in nine chunks, one full mbarrier each
// (count 1: the copying group's thread 0 arrives with the chunk's bytes; cp.async rows arrive
// through the same barrier). WG0 copies chunks 0-3 of every block, WG1 chunks 4-8.
template <typename T>
struct Sm90aTmaTraits {
  using Element = T;
  using KvElement = T;
  static constexpr int kBlockN = 64;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 2 * 128;
  static constexpr int kChunks = Sm90aTraits<T>::kChunks;
  static constexpr int kChunkBytes = Sm90aTraits<T>::kChunkBytes;
  static constexpr int kTileBytes = Sm90aTraits<T>::kTileBytes;
  static constexpr int kPChunk = Sm90aTraits<T>::kPChunk;
  static constexpr int kOffQ = 0;
  static constexpr int kOffP1 = kOffQ + kPChunk * kChunkBytes;  // Q's rope chunk, once in registers
  static constexpr int kOffStages = kOffQ + kTileBytes;
  static constexpr int kOffP0 = kOffStages + kStages * kTileBytes;
  static constexpr int kOffMax = kOffP0 + kChunkBytes;  // [2][64] fp32: WG0's and WG1's row maxima
  static constexpr int kOffL = kOffMax + 2 * kBlockM * 4;  // [2][64] fp32 row sums (epilogue)
  static constexpr int kOffBars = kOffL + 2 * kBlockM * 4;
  static constexpr int bar_full(int stage, int chunk) {
    return kOffBars + 8 * (kChunks * stage + chunk);
  }
  static constexpr int kBarQ = kOffBars + 8 * (kStages * kChunks);  // 256 cp.async arrivals
  // The handoffs between the groups (kernel_tma.cuh, Hand): four mbarriers of count 128, one
  // phase a pair of blocks; every thread of the handing group arrives.
  static constexpr int kBarHand = kBarQ + 8;
  static constexpr int kNumHand = 4;
  static constexpr int bar_hand(int h) { return kBarHand + 8 * h; }
  static constexpr int kSmemUsed = kBarHand + 8 * kNumHand;
  static constexpr int kOutRowBytes = Sm90aTraits<T>::kOutRowBytes;
  static constexpr int kPartRowBytes = Sm90aTraits<T>::kPartRowBytes;
  static constexpr int kSmemBytes = kSmemUsed + 1024;
  static_assert(kOffStages % 1024 == 0 && kOffP0 % 1024 == 0, "1024-byte swizzle atoms");
  static_assert(kBlockM * kPartRowBytes <= kStages * kTileBytes, "O / l fits in the KV stages");
};

static_assert(Sm90aTmaTraits<short>::kSmemBytes <= kSmemSm90, "must fit an sm_90 CTA");

}  // namespace treemla::cuda
