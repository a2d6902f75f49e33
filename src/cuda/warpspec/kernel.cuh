// The warpspec verify family: a 64-row tile (as the cpasync family) whose two products run on
// different warps, mma.sync m16n8k16 + ldmatrix, KV rows by bulk copies (cp.async.bulk) into an
// mbarrier ring of 16-key stages, sm_90 and newer (sm_120 included), 99 KB of shared memory, one
// CTA of 12 warps per SM.
//
// Why: a 64-row tile needs 128 KB of O accumulators and 72 KB of Q fragments, so one CTA fills
// the register file. In the cpasync family every warp holds both (16 rows each), runs every
// phase of a block in lockstep with the others, and reads every K and V byte from shared memory
// for its 16 rows. Here each warp's operand is 32 rows (half the shared-memory bytes per FLOP),
// and the score and output warps run up to two 16-key blocks apart, so one role's softmax and
// waits can overlap the other's products. docs/verify-kernel.md ("The warpspec family") has the
// budget, the measurements and what limits it (it is about as fast as cpasync on the H200).
//
// Roles (warp w):
//   w < 4, score warp (rg, kh) = (w / 2, w % 2): Q of rows [32 rg, +32) and columns
//     [288 kh, +288) in registers (144 a thread). Per 16-key block: a partial S[32 x 16] over its
//     288 columns, then the two warps of a row group swap halves through shared memory (warp kh
//     sends the partial of the m16 tile it does not own and adds the sibling's partial of the
//     one it owns, rows [32 rg + 16 kh, +16)); masks; the online softmax of those 16 rows (m, l
//     stay here); P (16-bit) and the rows' factors alpha into a double-buffered slot.
//   w >= 4, output warp (rg, cq) = ((w - 4) / 4, (w - 4) % 4): O[32 rg .. +32, 128 cq .. +128)
//     in registers (128 a thread). Per block h: first, once every output warp has read block
//     h - 1, lanes 0 and 1 copy rows 2 (w - 4) + lane of block h + kStages - 1 into that stage
//     (one bulk copy of 1,152 B per row; the row's page-table entry loaded one block earlier);
//     then O = O alpha + P V (P by ldmatrix out of the slot, V by ldmatrix.trans out of the
//     stage). At the end of an item, once all eight are past their block loop, each writes O / l
//     of its 16-row m-tiles into its own slice of the stages and stores whole 128-column row
//     segments from there (and the LSE), the split's partial or the final output.
// Handoffs (mbarriers; parities from a per-CTA count of blocks, so the ring runs across items):
//   full[s]: the 16 rows of a stage landed (one arrival per row with its bytes, or zero-filled);
//     only the score warps wait on it: the output warps read a stage's V after pready of the
//     same block, which the row group's two score warps arrive on after their wait on full[s]
//     (mbarrier arrive releases and the wait acquires, and causality order is transitive, so the
//     landed rows are visible to the output warps without a wait of their own);
//   empty[s]: the 256 output threads have read a stage (the score warps read it before they
//     released the block's P, which the output warps waited for);
//   pready[rg][slot] / pempty[rg][slot]: P and alpha of a row group written / read;
//   mlfull[rg] / mlempty[rg]: an item's final (m, l) of a row group written / read.
//
// Grid: plan.num_ctas persistent CTAs; CTA c takes work items c, c + grid, ... of the schedule's
// list. A schedule block (32 keys) is two of this kernel's blocks; a half with no key is masked
// whole (at most one a split, where the prefix ends), except the tail's last one, which is left
// out (half_item).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/async.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/mma_rows.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/dispatch.h"
#include "cuda/warpspec/traits.h"

// Deliberately broken builds for the test checks (docs/testing.md, "Kernel mutations"); 0 in
// every normal build: 1 tail mask ignored, 2 the first key of every split after the first
// dropped, 3 the LSE written in base 2 (common/mma_rows.cuh).
#ifndef TREEMLA_KERNEL_MUTATION
#define TREEMLA_KERNEL_MUTATION 0
#endif

namespace treemla::cuda::warpspec {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Named barriers (0 is __syncthreads): 2 + rg, the score warps' swap; the output warps' epilogue.
constexpr int kBarOutEpilogue = 4;

template <class Tr>
struct Smem {
  unsigned char* ptr;
  uint32_t base;
  __device__ uint32_t stage(int s) const { return base + Tr::kOffStages + s * Tr::kStageBytes; }
  // Partial scores of m16 tile mt of row group rg, parity par (written by the warp that does
  // not own the tile).
  __device__ float* x(int par, int rg, int mt) const {
    return reinterpret_cast<float*>(ptr + Tr::kOffX + ((par * 2 + rg) * 2 + mt) * Tr::kXBytes);
  }
  __device__ uint32_t p(int par) const { return base + Tr::kOffP + par * Tr::kPBytes; }
  __device__ uint32_t* p_ptr(int par) const {
    return reinterpret_cast<uint32_t*>(ptr + Tr::kOffP + par * Tr::kPBytes);
  }
  __device__ float* alpha(int par) const {
    return reinterpret_cast<float*>(ptr + Tr::kOffAlpha + par * kBlockM * 4);
  }
  __device__ float2* ml() const { return reinterpret_cast<float2*>(ptr + Tr::kOffML); }
  // Score thread i's words: walk() + w * kScoreThreads + i.
  __device__ int* walk() const { return reinterpret_cast<int*>(ptr + Tr::kOffWalk); }
  // Output thread i's fragment offsets.
  __device__ uint32_t* frag() const { return reinterpret_cast<uint32_t*>(ptr + Tr::kOffFrag); }
  // Copy lane i's (row i's) words.
  __device__ int* copy(int i) const {
    return reinterpret_cast<int*>(ptr + Tr::kOffCopy) + i * Tr::kCopyWords;
  }
  __device__ uint32_t bar(int i) const { return base + Tr::kOffBars + 8 * i; }
  __device__ uint32_t full(int s) const { return bar(s); }
  __device__ uint32_t empty(int s) const { return bar(Tr::kStages + s); }
  __device__ uint32_t pready(int rg, int par) const { return bar(2 * Tr::kStages + 2 * rg + par); }
  __device__ uint32_t pempty(int rg, int par) const {
    return bar(2 * Tr::kStages + 4 + 2 * rg + par);
  }
  __device__ uint32_t mlfull(int rg) const { return bar(2 * Tr::kStages + 8 + rg); }
  __device__ uint32_t mlempty(int rg) const { return bar(2 * Tr::kStages + 10 + rg); }
};

// What both roles know of a work item is a HalfItem (verify_device.cuh): request, row tile,
// split, and its 16-key blocks. half_item is a warp collective: every warp calls it.
// The 16-key blocks of an item, without a search per block. Blocks are numbered by the CTA's
// block count pos (the ring position); an item starts at pos0 (odd after an item whose last tail
// half was left out, half_item) and block pos < tail_pos = pos0 + 2 n_pb is half (pos - pos0) % 2
// of a prefix block of the split, keys from fbase + 16 pos on, ending at prefix_len; the later
// ones are the halves (pos - tail_pos) % 2 of the tail's 32-key blocks (the set bits of
// tail_bits, lowest first), ending at tail_limit. at(pos) gives the block key_block_at(h / 2, ...)
// gives for h = pos - pos0; it is called for the item's tail blocks in order (each tail block's
// second half drops it from rem).
struct BlockWalk {
  static constexpr int kSchedN = 32;  // keys a schedule block
  uint32_t fbase;  // (unsigned: pos may be large; the differences are what count)
  uint32_t tail_pos;
  int prefix_len, tail_limit;
  uint64_t rem;  // tail blocks not yet finished
  __device__ __forceinline__ BlockWalk() {}
  __device__ __forceinline__ BlockWalk(const RequestSched& rs, const HalfItem& it, uint32_t pos0) {
    fbase = static_cast<uint32_t>(kSchedN * it.pb_begin) - 16u * pos0;
    tail_pos = pos0 + 2 * it.n_pb;
    prefix_len = rs.prefix_len;
    tail_limit = rs.prefix_len + rs.q_len;
    rem = it.tail_bits;
  }
  // Block pos: its first key row (t0 + 16 (h & 1) in key_block_at's terms), the row where its
  // keys end, and its tail block index (-1: a prefix block).
  __device__ __forceinline__ void at(uint32_t pos, int& first, int& limit, int& jb) {
    if (static_cast<int>(pos - tail_pos) < 0) {
      first = static_cast<int>(fbase + 16u * pos);
      limit = prefix_len;
      jb = -1;
    } else {
      const uint32_t half = (pos - tail_pos) & 1u;
      jb = __ffsll(static_cast<long long>(rem)) - 1;
      first = prefix_len + kSchedN * jb + 16 * static_cast<int>(half);
      limit = tail_limit;
      if (half) rem &= rem - 1;
    }
  }
  // The first block at or after pos0 that needs a mask (blocks before it are whole prefix
  // blocks: limit - first >= 16): the last prefix blocks once fewer than 16 keys are left, and
  // every tail block.
  __device__ __forceinline__ uint32_t first_masked(uint32_t pos0) const {
    const int left = prefix_len - static_cast<int>(fbase + 16u * pos0);  // prefix keys from pos0
    return pos0 + min(static_cast<uint32_t>(max(left, 0) / 16), tail_pos - pos0);
  }
  // As words in shared memory (the block loops keep it out of their registers): word w of slot i
  // at p[w * stride + i].
  __device__ __forceinline__ void store(int* p, int stride) const {
    p[0] = static_cast<int>(fbase);
    p[stride] = static_cast<int>(tail_pos);
    p[2 * stride] = prefix_len;
    p[3 * stride] = tail_limit;
    p[4 * stride] = static_cast<int>(static_cast<uint32_t>(rem));
    p[5 * stride] = static_cast<int>(static_cast<uint32_t>(rem >> 32));
  }
  __device__ __forceinline__ void load(const int* p, int stride) {
    fbase = static_cast<uint32_t>(p[0]);
    tail_pos = static_cast<uint32_t>(p[stride]);
    prefix_len = p[2 * stride];
    tail_limit = p[3 * stride];
    rem = (static_cast<uint64_t>(static_cast<uint32_t>(p[5 * stride])) << 32) |
          static_cast<uint32_t>(p[4 * stride]);
  }
  __device__ __forceinline__ void store_rem(int* p, int stride) const {
    p[4 * stride] = static_cast<int>(static_cast<uint32_t>(rem));
    p[5 * stride] = static_cast<int>(static_cast<uint32_t>(rem >> 32));
  }
};

// ---------------------------------------------------------------------------------------------
// Score warps.

template <typename T, class Tr>
__device__ void score_role(const VerifyKernelParams& kp, const Smem<Tr>& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q4 = lane & 3, mat = lane >> 3;
  const int rg = warp >> 1, kh = warp & 1;
  const int H = kp.p.num_heads;
  const float sc = kp.scale_log2;
  // K fragments: keys (mat >> 1) * 8 + lane % 8, columns 288 kh + (mat & 1) * 8 (+ 16 ks).
  const uint32_t k_off =
      (((mat >> 1) * 8 + (lane & 7)) * Tr::kRowStride + 288 * kh + (mat & 1) * 8) * 2;
  uint32_t blk = 0;  // 16-key blocks this CTA has run, across items (the ring's position)
  uint32_t n_item = 0;
  WorkItem w;
  for (int item = blockIdx.x; fetch_item(kp, item, w); item += gridDim.x, ++n_item) {
    const HalfItem it = half_item(kp, w, lane, kBlockM);
    const RequestSched& rs = kp.sched[it.b];
    const int64_t qrow0 = static_cast<int64_t>(rs.q_start) * H + it.tile * kBlockM + 32 * rg;

    // Q fragments of rows 32 rg + 16 (mt ^ kh) + g (+ 8), columns 288 kh + 16 ks + 2 q4 (+ 8):
    // qf[0] is the m16 tile this warp owns after the swap, qf[1] the sibling's.
    uint32_t qf[2][18][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int r = 32 * rg + 16 * (mt ^ kh) + g;
      const bool va = r < it.rows, vb = r + 8 < it.rows;
      const T* q = static_cast<const T*>(kp.p.q) + (qrow0 + 16 * (mt ^ kh) + g) * kHeadDimQK +
                   288 * kh + q4 * 2;
      const uint32_t* qa = reinterpret_cast<const uint32_t*>(q);
      const uint32_t* qb = reinterpret_cast<const uint32_t*>(q + 8 * kHeadDimQK);
#pragma unroll
      for (int ks = 0; ks < 18; ++ks) {
        qf[mt][ks][0] = va ? __ldg(qa + ks * 8) : 0u;
        qf[mt][ks][1] = vb ? __ldg(qb + ks * 8) : 0u;
        qf[mt][ks][2] = va ? __ldg(qa + ks * 8 + 4) : 0u;
        qf[mt][ks][3] = vb ? __ldg(qb + ks * 8 + 4) : 0u;
      }
    }
    // The rows this warp owns after the swap: 32 rg + 16 kh + g (+ 8).
    const int r0 = 32 * rg + 16 * kh + g;
    const bool v0 = r0 < it.rows, v1 = r0 + 8 < it.rows;
    const int row0 = it.tile * kBlockM;
    const int node0 = v0 ? (row0 + r0) / H : 0, node1 = v1 ? (row0 + r0 + 8) / H : 0;
    // The item's walk and the rows' mask rows, read back only for masked blocks.
    int* const wp = sm.walk() + threadIdx.x;
    uint32_t masked_from;
    {
      const BlockWalk walk(rs, it, blk);
      masked_from = walk.first_masked(blk);
      walk.store(wp, Tr::kScoreThreads);
      wp[6 * Tr::kScoreThreads] = rs.q_start + node0;
      wp[7 * Tr::kScoreThreads] = rs.q_start + node1;
    }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
#if TREEMLA_KERNEL_MUTATION == 2
    const uint32_t blk0 = blk;
#endif

    for (const uint32_t blk_end = blk + it.n_blocks; blk != blk_end; ++blk) {
      const int st = blk % Tr::kStages;
      const int par = blk & 1;
      mbar_wait_suspend(sm.full(st), (blk / Tr::kStages) & 1);
      const uint32_t kaddr = sm.stage(st) + k_off;
      // ---- partial S over this warp's 288 columns, both m16 tiles (s[0]: the tile it owns);
      // the K fragments of step ks + 1 load while step ks multiplies ----
      float s[2][2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
          s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
      uint32_t kf[2][4];
      ldmatrix_x4(kf[0][0], kf[0][1], kf[0][2], kf[0][3], kaddr);
#pragma unroll
      for (int ks = 0; ks < 18; ++ks) {
        if (ks + 1 < 18)
          ldmatrix_x4(kf[(ks + 1) & 1][0], kf[(ks + 1) & 1][1], kf[(ks + 1) & 1][2],
                      kf[(ks + 1) & 1][3], kaddr + (ks + 1) * 32);
        const uint32_t* b = kf[ks & 1];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_16816<T>(s[mt][0], qf[mt][ks], b[0], b[1]);
          mma_16816<T>(s[mt][1], qf[mt][ks], b[2], b[3]);
        }
      }
      // ---- swap: send the partial of the tile the sibling owns, add the sibling's ----
      float(&own)[2][4] = s[0];
      const float(&other)[2][4] = s[1];
      {
        float* xo = sm.x(par, rg, 1 - kh);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = nt * 8 + q4 * 2;
          *reinterpret_cast<float2*>(xo + g * Tr::kXStride + col) =
              make_float2(other[nt][0], other[nt][1]);
          *reinterpret_cast<float2*>(xo + (g + 8) * Tr::kXStride + col) =
              make_float2(other[nt][2], other[nt][3]);
        }
      }
      named_barrier(2 + rg, 64);  // the row group's two partials written
      {
        const float* xi = sm.x(par, rg, kh);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = nt * 8 + q4 * 2;
          const float2 a = *reinterpret_cast<const float2*>(xi + g * Tr::kXStride + col);
          const float2 c = *reinterpret_cast<const float2*>(xi + (g + 8) * Tr::kXStride + col);
          own[nt][0] += a.x;
          own[nt][1] += a.y;
          own[nt][2] += c.x;
          own[nt][3] += c.y;
        }
      }
      // ---- mask: tail blocks and the last, partial prefix block ----
      if (static_cast<int>(blk - masked_from) >= 0) {
        BlockWalk walk;
        walk.load(wp, Tr::kScoreThreads);
        int first, limit, jb;
        walk.at(blk, first, limit, jb);
        // the half of its schedule block (tail_pos - pos0 is even)
        const int hh = static_cast<int>((blk - walk.tail_pos) & 1u);
        if (jb >= 0 && hh) walk.store_rem(wp, Tr::kScoreThreads);
#if TREEMLA_KERNEL_MUTATION == 1
        const int mask_jb = -1;  // mutation: every node sees every tail row
#else
        const int mask_jb = jb;
#endif
        const uint32_t* mrow0 = reinterpret_cast<const uint32_t*>(
            kp.p.tree_mask + static_cast<int64_t>(wp[6 * Tr::kScoreThreads]) * kp.p.mask_words);
        const uint32_t* mrow1 = reinterpret_cast<const uint32_t*>(
            kp.p.tree_mask + static_cast<int64_t>(wp[7 * Tr::kScoreThreads]) * kp.p.mask_words);
        mask_block<2>(own, limit - (first - 16 * hh), mask_jb, mrow0, mrow1, v0, v1, 16 * hh, q4);
      }
#if TREEMLA_KERNEL_MUTATION == 2
      // mutation: the split's first key dropped
      if (blk == blk0 && it.n_pb > 0 && it.pb_begin > 0 && q4 == 0)
        own[0][0] = own[0][2] = -INFINITY;
#endif
      // ---- online softmax of the 16 rows this warp owns ----
      float alpha0, alpha1;
      online_softmax_step<2>(own, sc, m0, m1, l0, l1, alpha0, alpha1);
      // ---- P and alpha into slot par, once the output warps have read its previous use ----
      mbar_wait_suspend(sm.pempty(rg, par), ((blk >> 1) & 1) ^ 1);
      {
        uint32_t* p = sm.p_ptr(par);
        constexpr int kW = Tr::kPStride / 2;  // 32-bit words a P row
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          p[r0 * kW + nt * 4 + q4] = pack2<T>(own[nt][0], own[nt][1]);
          p[(r0 + 8) * kW + nt * 4 + q4] = pack2<T>(own[nt][2], own[nt][3]);
        }
        if (q4 == 0) {
          sm.alpha(par)[r0] = alpha0;
          sm.alpha(par)[r0 + 8] = alpha1;
        }
      }
      mbar_arrive(sm.pready(rg, par));
    }
    // ---- the item's (m, l) for the output warps ----
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    mbar_wait_suspend(sm.mlempty(rg), (n_item & 1) ^ 1);
    if (q4 == 0) {
      sm.ml()[r0] = make_float2(m0, l0);
      sm.ml()[r0 + 8] = make_float2(m1, l1);
    }
    mbar_arrive(sm.mlfull(rg));
  }
}

// A copy lane's words (Smem::copy): its item's BlockWalk (words 0-5, as BlockWalk::store with
// stride 1) and the item's request (word 6).
// Row r of block pos of the lane's item: the row's logical row t (-1: the stage row is
// zero-filled, past the block's keys or past the page-table row, the latter recorded here) and
// its page-table entry (loaded here, checked by copy_row: the load's latency is spent before).
__device__ __forceinline__ void fetch_row(const VerifyKernelParams& kp, int* cw, uint32_t pos,
                                          int r, int& t, int& page) {
  const int4 w0 = *reinterpret_cast<const int4*>(cw);
  const int4 w1 = *reinterpret_cast<const int4*>(cw + 4);
  BlockWalk walk;
  walk.fbase = static_cast<uint32_t>(w0.x);
  walk.tail_pos = static_cast<uint32_t>(w0.y);
  walk.prefix_len = w0.z;
  walk.tail_limit = w0.w;
  walk.rem =
      (static_cast<uint64_t>(static_cast<uint32_t>(w1.y)) << 32) | static_cast<uint32_t>(w1.x);
  int first, limit, jb;
  walk.at(pos, first, limit, jb);
  if (jb >= 0 && ((pos - walk.tail_pos) & 1u)) walk.store_rem(cw, 1);
  t = first + r;
  page = -1;
  if (t >= limit) {
    t = -1;
  } else {
    const int entry = t >> kp.page_shift;
    if (entry < kp.p.page_table_stride) {
      page = __ldg(kp.p.page_table + static_cast<int64_t>(w1.z) * kp.p.page_table_stride + entry);
    } else {
      record_status(kp.hdr, kStatusStride, w1.z, t, kp.p.page_table_stride);  // row not mapped
      t = -1;
    }
  }
}

// One lane copies row r of a block (logical row t and page-table entry from fetch_row) into
// stage address `stage` with one bulk copy of the row's 1,152 bytes, counted on the stage's full
// barrier (one arrival per row, with the row's bytes); a row that is not a key (t = -1), or whose
// page index is bad (recorded), is zero-filled instead. The caller has waited until every output
// warp has read the stage's previous block.
template <typename T, class Tr>
__device__ __forceinline__ void copy_row(const VerifyKernelParams& kp, const int* cw,
                                         uint32_t stage, uint32_t full, int r, int t, int page) {
  const uint32_t dst = stage + r * Tr::kRowStride * 2;
  if (t >= 0 && page >= 0 && page < kp.p.num_pages) {
    const T* src =
        static_cast<const T*>(kp.p.kv_cache) +
        (static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1))) * kHeadDimQK;
    mbar_arrive_expect_tx(full, kHeadDimQK * 2);
    bulk_copy_g2s(dst, src, kHeadDimQK * 2, full);
  } else {
    if (t >= 0) record_status(kp.hdr, kStatusPage, cw[6], page, t);  // zero-filled, not read
    for (int i = 0; i < kHeadDimQK * 2 / 16; ++i)
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst + 16 * i), "r"(0)
                   : "memory");
    fence_proxy_async_smem();  // before a later bulk copy into the same bytes
    mbar_arrive(full);
  }
}

// ---------------------------------------------------------------------------------------------
// Output warps.
template <typename T, class Tr>
__device__ void out_role(const VerifyKernelParams& kp, const Smem<Tr>& sm) {
  const int lane = threadIdx.x & 31, ow = (threadIdx.x >> 5) - Tr::kScoreWarps;
  const int g = lane >> 2, q4 = lane & 3, mat = lane >> 3;
  const int rg = ow >> 2, cq = ow & 3;
  const int H = kp.p.num_heads;
  // V fragments (ldmatrix.trans): keys (mat & 1) * 8 + lane % 8, columns 128 cq + (mat >> 1) * 8.
  const uint32_t v_off =
      (((mat & 1) * 8 + (lane & 7)) * Tr::kRowStride + 128 * cq + (mat >> 1) * 8) * 2;
  // P fragments (ldmatrix): rows 32 rg + 16 mt + lane % 16, keys (lane / 16) * 8.
  const uint32_t p_off = ((32 * rg + (lane & 15)) * Tr::kPStride + (lane >> 4) * 8) * 2;
  constexpr int kPTile = 16 * Tr::kPStride * 2;  // bytes of 16 P rows
  // The block loop reads both offsets back from shared memory (v_off | p_off << 16) rather than
  // keep them in registers, which it does not have (ptxas rederives them from the thread index
  // otherwise, ~15 instructions a block).
  static_assert(
      ((15 * Tr::kRowStride + 128 * 3 + 8) * 2) < 65536 && ((63 * Tr::kPStride + 8) * 2) < 65536,
      "fragment offsets packed in 16 bits each");
  uint32_t* const frag_slot = sm.frag() + (threadIdx.x - Tr::kScoreThreads);
  *frag_slot = v_off | (p_off << 16);

  float o[2][16][4];
  uint32_t blk = 0;
  uint32_t n_item = 0;
  WorkItem w;
  for (int item = blockIdx.x; fetch_item(kp, item, w); item += gridDim.x, ++n_item) {
    const HalfItem it = half_item(kp, w, lane, kBlockM);
    const int n_blocks = it.n_blocks;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 16; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;

    // Lanes 0 and 1 of output warp ow copy rows 2 ow + lane of every block, kStages - 1 blocks
    // ahead; a lane loads its row's page-table entry one block before it issues the copy.
    const int crow = 2 * ow + (lane & 1);
    int* const cw = sm.copy(crow);
    const uint32_t blk_end = blk + n_blocks;
    int next_t = -1, next_page = -1;
    if (lane < 2) {
      const RequestSched& rs = kp.sched[it.b];
      BlockWalk(rs, it, blk).store(cw, 1);
      cw[6] = it.b;
    }
    for (uint32_t b = blk; b != blk + Tr::kCopyLead && b != blk_end; ++b) {
      mbar_wait_suspend(sm.empty(b % Tr::kStages), ((b / Tr::kStages) & 1) ^ 1);
      if (lane < 2) {
        fetch_row(kp, cw, b, crow, next_t, next_page);
        copy_row<T, Tr>(kp, cw, sm.stage(b % Tr::kStages), sm.full(b % Tr::kStages), crow, next_t,
                        next_page);
      }
    }
    if (lane < 2 && Tr::kCopyLead < n_blocks)
      fetch_row(kp, cw, blk + Tr::kCopyLead, crow, next_t, next_page);

    for (; blk != blk_end; ++blk) {
      const int st = blk % Tr::kStages;
      const int par = blk & 1;
      // Block h + kCopyLead goes into the stage of block h - kCopyLag, once every output warp
      // has read that (the score warps read it before they released that block's P).
      const uint32_t b = blk + Tr::kCopyLead;
      if (static_cast<int>(blk_end - b) > 0) {
        mbar_wait_suspend(sm.empty(b % Tr::kStages), ((b / Tr::kStages) & 1) ^ 1);
        if (lane < 2) {
          copy_row<T, Tr>(kp, cw, sm.stage(b % Tr::kStages), sm.full(b % Tr::kStages), crow, next_t,
                          next_page);
          if (b + 1 != blk_end) fetch_row(kp, cw, b + 1, crow, next_t, next_page);
        }
      }
      mbar_wait_suspend(sm.pready(rg, par), (blk >> 1) & 1);
      // No wait on full[st]: the score warps waited on it before they arrived on pready (above).
      // ---- O *= alpha (skipped while no row maximum of the warp moved) ----
      {
        const float* al = sm.alpha(par) + 32 * rg + g;
        const float a00 = al[0], a01 = al[8], a10 = al[16], a11 = al[24];
        if (__any_sync(0xffffffffu, a00 != 1.f || a01 != 1.f || a10 != 1.f || a11 != 1.f)) {
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            o[0][i][0] *= a00;
            o[0][i][1] *= a00;
            o[0][i][2] *= a01;
            o[0][i][3] *= a01;
            o[1][i][0] *= a10;
            o[1][i][1] *= a10;
            o[1][i][2] *= a11;
            o[1][i][3] *= a11;
          }
        }
      }
      const uint32_t frag_off = *frag_slot;
      uint32_t pa[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4(pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3],
                    sm.p(par) + (frag_off >> 16) + mt * kPTile);
      mbar_arrive(sm.pempty(rg, par));  // P and alpha of this slot read (into registers)
      // ---- O[:, 128 cq ..) += P V, the next V fragments loading while these multiply ----
      const uint32_t vaddr = sm.stage(st) + (frag_off & 0xffffu);
      uint32_t vb[2][4];
      ldmatrix_x4_trans(vb[0][0], vb[0][1], vb[0][2], vb[0][3], vaddr);
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        if (np + 1 < 8)
          ldmatrix_x4_trans(vb[(np + 1) & 1][0], vb[(np + 1) & 1][1], vb[(np + 1) & 1][2],
                            vb[(np + 1) & 1][3], vaddr + (np + 1) * 32);
        const uint32_t* b = vb[np & 1];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_16816<T>(o[mt][2 * np], pa[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * np + 1], pa[mt], b[2], b[3]);
        }
      }
      mbar_arrive(sm.empty(st));  // this thread is done with the stage
    }

    // ---- epilogue: rows 32 rg + 16 mt + g (+ 8), columns [128 cq, +128) ----
    const RequestSched& rs = kp.sched[it.b];
    mbar_wait_suspend(sm.mlfull(rg), n_item & 1);
    float2 ml[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      ml[mt][0] = sm.ml()[32 * rg + 16 * mt + g];
      ml[mt][1] = sm.ml()[32 * rg + 16 * mt + g + 8];
    }
    mbar_arrive(sm.mlempty(rg));
    const int64_t grow = static_cast<int64_t>(rs.q_start) * H + it.tile * kBlockM;
    // O / l leaves through the stages: once every output warp is past its block loop, warp ow
    // writes its fragments of 16 rows into its own padded slice, then stores whole row segments
    // (128 columns: 512 contiguous bytes a warp instruction for a partial, 256 for the output).
    // Direct fragment stores write 8 rows x 16 or 32 bytes an instruction.
    named_barrier(kBarOutEpilogue, Tr::kOutThreads);
    const uint32_t scratch = sm.stage(0) + ow * Tr::kEpiWarpBytes;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int rl = 32 * rg + 16 * mt + g;
      const float l0 = ml[mt][0].y, l1 = ml[mt][1].y;
      const float inv0 = l0 > 0.f ? fast_rcp(l0) : 0.f, inv1 = l1 > 0.f ? fast_rcp(l1) : 0.f;
      if (cq == 0 && q4 == 0)
        write_row_lse(kp, it.slot, rl, grow + rl, rl < it.rows, rl + 8 < it.rows, ml[mt][0].x,
                      ml[mt][1].x, l0, l1);
      if (it.slot < 0) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          const uint32_t a = scratch + g * Tr::kEpiOutRow + (8 * nt + 2 * q4) * 2;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a),
                       "r"(pack2<T>(o[mt][nt][0] * inv0, o[mt][nt][1] * inv0))
                       : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a + 8 * Tr::kEpiOutRow),
                       "r"(pack2<T>(o[mt][nt][2] * inv1, o[mt][nt][3] * inv1))
                       : "memory");
        }
        __syncwarp();
        T* out =
            static_cast<T*>(kp.o) + (grow + 32 * rg + 16 * mt) * kHeadDimV + 128 * cq + 4 * lane;
#pragma unroll 4
        for (int j = 0; j < 16; ++j) {
          uint2 v;
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                       : "=r"(v.x), "=r"(v.y)
                       : "r"(scratch + j * Tr::kEpiOutRow + 8 * lane)
                       : "memory");
          if (32 * rg + 16 * mt + j < it.rows) *reinterpret_cast<uint2*>(out + j * kHeadDimV) = v;
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          const uint32_t a = scratch + g * Tr::kEpiPartRow + (8 * nt + 2 * q4) * 4;
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(o[mt][nt][0] * inv0),
                       "f"(o[mt][nt][1] * inv0)
                       : "memory");
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a + 8 * Tr::kEpiPartRow),
                       "f"(o[mt][nt][2] * inv1), "f"(o[mt][nt][3] * inv1)
                       : "memory");
        }
        __syncwarp();
        float* po =
            kp.part_o + (it.slot * kBlockM + 32 * rg + 16 * mt) * kHeadDimV + 128 * cq + 4 * lane;
#pragma unroll 4
        for (int j = 0; j < 16; ++j) {
          float4 v;
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                       : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                       : "r"(scratch + j * Tr::kEpiPartRow + 16 * lane)
                       : "memory");
          if (32 * rg + 16 * mt + j < it.rows) *reinterpret_cast<float4*>(po + j * kHeadDimV) = v;
        }
      }
      __syncwarp();  // the slice is read before the next m-tile overwrites it
    }
    // Every slice read before the next item's first copies refill the stages, and this thread's
    // stores into it ordered before those bulk copies' writes (as copy_row's zero-fill does).
    fence_proxy_async_smem();
    named_barrier(kBarOutEpilogue, Tr::kOutThreads);
  }
}

#endif  // __CUDA_ARCH__ >= 900

template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    warpspec_main_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (config_fits_arch<Tr::kSmemBytes>()) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Smem<Tr> sm{smem, smem_u32(smem)};
    if (threadIdx.x == 0) {
      for (int s = 0; s < Tr::kStages; ++s) {
        mbar_init(sm.full(s), Tr::kBlockN);       // one arrival per row, plus its bytes
        mbar_init(sm.empty(s), Tr::kOutThreads);  // every output thread, after reading
      }
      for (int rg = 0; rg < 2; ++rg) {
        for (int par = 0; par < 2; ++par) {
          mbar_init(sm.pready(rg, par), 64);   // the row group's two score warps
          mbar_init(sm.pempty(rg, par), 128);  // the row group's four output warps
        }
        mbar_init(sm.mlfull(rg), 64);
        mbar_init(sm.mlempty(rg), 128);
      }
    }
    __syncthreads();
    pdl_wait();  // the schedule (or the previous layer's combine) has completed
    pdl_launch_dependents();
    if (threadIdx.x < Tr::kScoreThreads) {
      warpgroup_reg_alloc<Tr::kScoreRegs>();
      score_role<T, Tr>(kp, sm);
    } else {
      warpgroup_reg_dealloc<Tr::kOutRegs>();
      out_role<T, Tr>(kp, sm);
    }
  } else {
    __trap();  // this configuration does not fit this architecture's shared memory
  }
#else
  __trap();  // the warpspec family needs sm_90 or newer
#endif
}

}  // namespace treemla::cuda::warpspec

namespace treemla::cuda {

template <class Tr>
KernelEntry make_warpspec_entry() {
  using T = typename Tr::Element;
  return {reinterpret_cast<const void*>(&warpspec::warpspec_main_kernel<T, Tr>),
          Tr::kThreads,
          Tr::kSmemBytes,
          1,
          0,
          kMinCcClusters};
}

}  // namespace treemla::cuda
