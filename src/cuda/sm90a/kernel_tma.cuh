// The sm90a family's TMA kernel: same tiles (64 rows, 64-key blocks in two stages), products and
// output as kernel.cuh, but no producer warpgroup and no P in a KV stage. 256 threads.
//
// Shared memory: Q (72 KB), stages 0 and 1 (72 KB each), P0 (8 KB), row maxima and sums, one full
// mbarrier per (stage, 64-column chunk). Once Q has landed each thread keeps its A fragments of
// Q's rope chunk in registers (the last four k-steps of S take A from registers), and the chunk's
// 8 KB hold P1: WG1's P for WG0. WG0's P for WG1 goes to P0. So a stage holds only K / V, and each
// of its parts is refilled by the group that reads it last, right after that read:
//   chunks 0-3 (V[:, :256]): WG0, after its P V on the stage;
//   chunks 4-8 (V[:, 256:] and the rope): WG1, after its P V on the stage (S, the rope chunk's
//   only reader, is long done).
// A refill is one TMA box a chunk (64 rows, or two 32-row boxes where the block's halves lie in
// different pages) issued by the group's thread 0, which arrives on the chunk's barrier with its
// bytes; a block whose halves are not whole runs of keys in one page (the tail's blocks, which
// come first, a split's last block, pages of fewer than 32 rows, a bad page-table entry) is
// copied by the group's 128 threads with cp.async instead, zero-filled where a row is not a key.
//
// Per pair of blocks (A = it in stage 0, B = it + 1 in stage 1), entering with S_A in WG0's
// registers and S_B in WG1's:
//   WG0: mA = max(m, rowmax S_A) to WG1; P_A (registers); O_L = O_L 2^(m - mA) + P_A V_A[:, :256];
//        while that runs, wait for mB and store P_A 2^(mA - mB) into P0 for WG1; when the product
//        is done, refill chunks 0-3 of stage 0 (block it + 2); O_L *= 2^(mA - mB); wait for P_B
//        in P1; O_L += P_B V_B[:, :256]; S of block it + 2 on chunks 0-3; once P_B V_B is done,
//        refill chunks 0-3 of stage 1 (it + 3); S of block it + 2 on chunks 4-8.
//   WG1: mB = max(mA, rowmax S_B) to WG0; P_B (registers, and into P1); O_R = O_R 2^(m - mB) +
//        P_B V_B[:, 256:]; wait for P_A in P0; O_R += P_A V_A[:, 256:]; once each product is done,
//        refill chunks 4-8 of its stage (blocks it + 3 and it + 2); S of block it + 3 (chunks 4-8,
//        then 0-3: the order they were refilled).
// The handoffs between the groups (mA, mB, P_A, P_B) are mbarriers (Hand). The family runs this
// kernel for pages of at least 32 rows and the producer kernel (kernel.cuh) for smaller ones,
// which this one would copy row by row at under half the speed; docs/verify-kernel.md, "The sm90a
// family", has the measurements.
#pragma once

#include "cuda/sm90a/kernel.cuh"

namespace treemla::cuda::sm90a {

#if TREEMLA_HAS_WGMMA

// Named barriers of this kernel (kernel.cuh's kBarBoth and kBarItem are reused; ids below 16).
constexpr int kBarFill0 = 11;  // the 128 threads of WG0 / WG1 after their cp.async of a part
constexpr int kBarFill1 = 12;

// The four handoffs between the groups, each once a pair of blocks (kHandP1 only when the pair
// has a block B).
enum Hand {
  kHandMA = 0,  // WG0 gives, WG1 takes: mA in s_max[0]
  kHandMB = 1,  // WG1 gives, WG0 takes: mB in s_max[1]
  kHandP0 = 2,  // WG0 gives, WG1 takes: P_A (at mB) in P0
  kHandP1 = 3,  // WG1 gives, WG0 takes: P_B in P1
};
// Each is an mbarrier of count 128 (Tr::bar_hand): every thread of the giving group arrives
// (release), the other group waits (acquire) for the phase of parity n & 1, n the handoff's
// earlier phases. Named barriers (bar.arrive on the giving side, bar.sync on the other) ran at
// the same speed, but compute-sanitizer racecheck reports hazards on the accesses they order.
template <class Tr>
__device__ __forceinline__ void hand_give(uint32_t smem, Hand h) {
  mbar_arrive(smem + Tr::bar_hand(h));
}
template <class Tr>
__device__ __forceinline__ void hand_take(uint32_t smem, Hand h, uint32_t n) {
  mbar_wait(smem + Tr::bar_hand(h), n & 1);
}

// One box of a [num_pages][page_size][576] map: columns [x, x + 64), rows [y, y + box) of page z.
__device__ __forceinline__ void tma_box(uint32_t dst, const TmaMap* map, int x, int y, int z,
                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}

// Makes the barrier track the thread's prior cp.async (its pending count goes up by one now and
// down by one when they have landed): a phase then needs the copying group's thread 0 to arrive
// as well, after the group's named barrier.
__device__ __forceinline__ void cp_async_mbar_track(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Chunks [c0, c1) of a block into the stage at `stage`: one box a chunk of rows [y0, y0 + box) of
// page z0 (map: 64-row boxes), or (y1 >= 0; map: 32-row boxes) two, the second of rows
// [y1, y1 + 32) of page z1 into the chunk's rows 32-63; each chunk arrives on its barrier (at
// bar0 + 8 c) with its 8 KB. Called by one thread. The loop is not unrolled: each TMA instruction
// compiles to a loop over the active lanes, and one a chunk at every refill site made the block
// loop's code too large; as a function call it cost more (docs/verify-kernel.md).
__device__ __forceinline__ void issue_boxes(const TmaMap* map, uint32_t stage, uint32_t bar0,
                                            int c0, int c1, int y0, int z0, int y1, int z1) {
#pragma unroll 1
  for (int c = c0; c < c1; ++c) {
    const uint32_t bar = bar0 + 8 * c;
    const uint32_t dst = stage + c * 8192;
    mbar_arrive_expect_tx(bar, 8192);
    tma_box(dst, map, c * 64, y0, z0, bar);
    if (y1 >= 0) tma_box(dst + 4096, map, c * 64, y1, z1, bar);
  }
}

// Where a 64-key block comes from. box: both 32-row halves are runs of keys in one page each,
// with good page-table entries, so TMA boxes fetch them; else the block is copied row by row.
struct BlockSrc {
  int t0, t1;        // first key of each half
  int page0, page1;  // their page-table entries (box only)
  bool box;
  bool one_page;  // both halves in the same page entry: one 64-row box a chunk
};

__device__ __forceinline__ BlockSrc block_source(const VerifyKernelParams& kp, const Item& d,
                                                 int it) {
  // Boxes only for prefix blocks whose 64 keys are all in the split (kbeg is a multiple of 32, so
  // with pages of at least 32 rows each half lies in one page); the tail's and a split's last,
  // partial block come row by row.
  BlockSrc b{-1, -1, -1, -1, false, false};
  const int t0 = d.kbeg + (it - d.n_tb) * 64;
  if (it < d.n_tb || kp.p.page_size < 32 || t0 + 64 > d.kend) return b;
  const int e0 = t0 >> kp.page_shift, e1 = (t0 + 32) >> kp.page_shift;
  if (e1 >= kp.p.page_table_stride) return b;
  const int* pt = kp.p.page_table + static_cast<int64_t>(d.b) * kp.p.page_table_stride;
  b.t0 = t0;
  b.t1 = t0 + 32;
  b.page0 = __ldg(pt + e0);
  b.page1 = e1 == e0 ? b.page0 : __ldg(pt + e1);
  b.box = b.page0 >= 0 && b.page0 < kp.p.num_pages && b.page1 >= 0 && b.page1 < kp.p.num_pages;
  b.one_page = e1 == e0;  // then the page has at least 64 rows, and the 64 keys are consecutive
  return b;
}

template <typename T, class Tr>
__device__ __noinline__ void fill_rows(const VerifyKernelParams& kp, const Item& d, int it,
                                       uint32_t stage, uint32_t bar0, int c0, int c1, int g,
                                       int wt);

// The part of block `it` that group g copies (chunks 0-3 for g = 0, 4-8 for g = 1) into stage st.
// Called by the group's 128 threads together (wt 0..127); `src` is block_source(it).
template <typename T, class Tr>
__device__ __forceinline__ void fill_part(const VerifyKernelParams& kp, const Item& d, int it,
                                          int st, uint32_t smem, int g, int wt,
                                          const BlockSrc& src) {
  const uint32_t stage = smem + Tr::kOffStages + st * Tr::kTileBytes;
  const int c0 = g == 0 ? 0 : 4, c1 = g == 0 ? 4 : Tr::kChunks;
  if (src.box) {
    if (wt == 0) {
      const int ps = kp.p.page_size;
      issue_boxes(&kp.kv_map[src.one_page ? 1 : 0], stage, smem + Tr::bar_full(st, 0), c0, c1,
                  src.t0 & (ps - 1), src.page0, src.one_page ? -1 : src.t1 & (ps - 1), src.page1);
    }
    return;
  }
  fill_rows<T, Tr>(kp, d, it, stage, smem + Tr::bar_full(st, 0), c0, c1, g, wt);
}

// The row-by-row copy of fill_part, out of line: most blocks come by boxes, and the unrolled copy
// loops would otherwise sit in the block loop's code four times.
template <typename T, class Tr>
__device__ __noinline__ void fill_rows(const VerifyKernelParams& kp, const Item& d, int it,
                                       uint32_t stage, uint32_t bar0, int c0, int c1, int g,
                                       int wt) {
  // Thread wt copies 16-byte unit wt % 8 of rows wt / 8 + 16 j.
  const T* kv = static_cast<const T*>(kp.p.kv_cache);
  const int u = wt & 7;
  int64_t srow[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int t = block_key(d, it, (wt >> 3) + 16 * j);
    srow[j] = -1;
    if (t < 0) continue;
    const int entry = t >> kp.page_shift;
    if (entry >= kp.p.page_table_stride) {
      record_status(kp.hdr, kStatusStride, d.b, t, kp.p.page_table_stride);
      continue;
    }
    const int page =
        __ldg(kp.p.page_table + static_cast<int64_t>(d.b) * kp.p.page_table_stride + entry);
    if (page < 0 || page >= kp.p.num_pages) {
      record_status(kp.hdr, kStatusPage, d.b, page, t);
      continue;
    }
    srow[j] =
        (static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1))) * kHeadDimQK;
  }
  for (int c = c0; c < c1; ++c) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = (wt >> 3) + 16 * j;
      const T* sp = kv + (srow[j] >= 0 ? srow[j] : 0) + c * 64 + u * 8;
      // Rows that are not keys: zeros (V must be finite where P = 0).
      cp_async_16(stage + c * Tr::kChunkBytes + swizzle128(r, u), sp, srow[j] >= 0 ? 16 : 0);
    }
    cp_async_mbar_track(bar0 + 8 * c);
  }
  bar_sync(g == 0 ? kBarFill0 : kBarFill1, 128);
  if (wt == 0) {
    for (int c = c0; c < c1; ++c) mbar_arrive(bar0 + 8 * c);
  }
}

// S (+)= Q K^T over chunks [first, first + n) (mod 9) of stage st, each chunk's products issued
// once it has landed; the rope chunk (8) takes A from registers (rq). zero: the first product
// overwrites S. fence: the block came by cp.async (generic-proxy writes, seen by wgmma after it).
template <typename T, class Tr>
__device__ __forceinline__ void s_chunks(float (&s)[32], uint32_t smem, int st, uint32_t parity,
                                         int first, int n, bool zero, bool fence,
                                         const uint32_t (&rq)[16]) {
  const uint32_t sk = smem + Tr::kOffStages + st * Tr::kTileBytes;
  const uint64_t dq = make_desc(smem + Tr::kOffQ, 16, 1024), dk = make_desc(sk, 16, 1024);
  if (fence) {
    // A block copied row by row (rare): wait for its chunks and fence once, out of the chain.
    for (int i = 0; i < n; ++i)
      mbar_wait(smem + Tr::bar_full(st, (first + i) % Tr::kChunks), parity);
    fence_proxy_async();
  }
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const int c = (first + i) % Tr::kChunks;
    mbar_wait(smem + Tr::bar_full(st, c), parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t off = static_cast<uint64_t>((c * 8192 + kk * 32) >> 4);
      const int scale_d = zero && i == 0 && kk == 0 ? 0 : 1;
      if (c == Tr::kPChunk) {
        const uint32_t a[4] = {rq[4 * kk], rq[4 * kk + 1], rq[4 * kk + 2], rq[4 * kk + 3]};
        wgmma_m64n64k16_rs<T>(s, a, dk + off, scale_d);
      } else {
        wgmma_m64n64k16_ss<T>(s, dq + off, dk + off, scale_d);
      }
    }
  }
  wgmma_commit();
}

// O[:, 256 half ...] += P V, P (64 x 64 keys) at `pbuf` (swizzled, K-major), V = chunks
// [4 half, 4 half + 4) of the stage at `stage`, N-major.
template <typename T, class Tr>
__device__ __forceinline__ void pv_smem(float (&o)[128], uint32_t pbuf, uint32_t stage, int half) {
  const uint64_t dp = make_desc(pbuf, 16, 1024);
  const uint64_t dv = make_desc(stage + 4 * half * Tr::kChunkBytes, Tr::kChunkBytes, 1024);
  fence_regs(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64n256k16_ss_tnspb<T>(o, dp + static_cast<uint64_t>((kk * 32) >> 4),
                                 dv + static_cast<uint64_t>((kk * 2048) >> 4), 1);
  }
  wgmma_commit();
}

// Keeps the compiler from reusing the registers of an in-flight wgmma's A operand before the wait
// that follows the product (the asm statement of the product reads them only at issue).
__device__ __forceinline__ void keep_regs(uint32_t (&r)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// P = 2^(S sc - m sc) as A fragments (pk) and row sums; s becomes P in fp32, in place (for
// store_p_scaled).
template <typename T>
__device__ __forceinline__ void make_p(float (&s)[32], float m0, float m1, float sc, float& rs0,
                                       float& rs1, uint32_t (&pk)[16]) {
  const float mu0 = m0 == -INFINITY ? 0.f : m0 * sc, mu1 = m1 == -INFINITY ? 0.f : m1 * sc;
  rs0 = rs1 = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    s[4 * i + 0] = fast_exp2(fmaf(s[4 * i + 0], sc, -mu0));
    s[4 * i + 1] = fast_exp2(fmaf(s[4 * i + 1], sc, -mu0));
    s[4 * i + 2] = fast_exp2(fmaf(s[4 * i + 2], sc, -mu1));
    s[4 * i + 3] = fast_exp2(fmaf(s[4 * i + 3], sc, -mu1));
    rs0 += s[4 * i + 0] + s[4 * i + 1];
    rs1 += s[4 * i + 2] + s[4 * i + 3];
    pk[2 * i] = pack2<T>(s[4 * i + 0], s[4 * i + 1]);
    pk[2 * i + 1] = pack2<T>(s[4 * i + 2], s[4 * i + 3]);
  }
}

// The A fragments in pk into a swizzled 64 x 64 P buffer.
__device__ __forceinline__ void store_p(const uint32_t (&pk)[16], uint32_t pbuf, const RowInfo& ri,
                                        int q4) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(pbuf + swizzle128(ri.r0, i) + 4 * q4),
                 "r"(pk[2 * i])
                 : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(pbuf + swizzle128(ri.r1, i) + 4 * q4),
                 "r"(pk[2 * i + 1])
                 : "memory");
  }
}

// P (fp32, in p) times b0 (row r0) / b1 (row r1), rounded, into a swizzled 64 x 64 P buffer.
template <typename T>
__device__ __forceinline__ void store_p_scaled(const float (&p)[32], float b0, float b1,
                                               uint32_t pbuf, const RowInfo& ri, int q4) {
  uint32_t pk[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    pk[2 * i] = pack2<T>(p[4 * i] * b0, p[4 * i + 1] * b0);
    pk[2 * i + 1] = pack2<T>(p[4 * i + 2] * b1, p[4 * i + 3] * b1);
  }
  store_p(pk, pbuf, ri, q4);
}

// Q rows of the tile (zero past the request's rows), by both groups: thread q (0..255) copies unit
// q % 8 of rows q / 8 and q / 8 + 32.
template <typename T, class Tr>
__device__ __forceinline__ void load_q(const VerifyKernelParams& kp, const Item& d, uint32_t smem) {
  const int q = threadIdx.x, u = q & 7;
  const T* qp = static_cast<const T*>(kp.p.q);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = (q >> 3) + 32 * j;
    const bool ok = d.row0 + r < d.rows;
    const T* sp = qp +
                  (ok ? (static_cast<int64_t>(d.rs.q_start) * d.H + d.row0 + r) * kHeadDimQK : 0) +
                  u * 8;
    const uint32_t dr = smem + Tr::kOffQ + swizzle128(r, u);
#pragma unroll
    for (int c = 0; c < Tr::kChunks; ++c) {
      cp_async_16(dr + c * Tr::kChunkBytes, sp + c * 64, ok ? 16 : 0);
    }
  }
  cp_async_mbar_arrive(smem + Tr::kBarQ);
}

template <typename T, class Tr>
__device__ void tma_item(const VerifyKernelParams& kp, const Item& d, uint32_t smem, float* smem_f,
                         uint32_t (&uses)[2], uint32_t qphase) {
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0);
  const int n_blocks = __shfl_sync(0xffffffffu, d.n_blocks, 0);
  const int wt = threadIdx.x & 127, wq = wt >> 5, lane = wt & 31;
  const int g = lane >> 2, q4 = lane & 3;
  const float sc = kp.scale_log2;
  const uint32_t stage0 = smem + Tr::kOffStages, stage1 = stage0 + Tr::kTileBytes;
  const uint32_t p0buf = smem + Tr::kOffP0, p1buf = smem + Tr::kOffP1;
  float* s_max = smem_f + Tr::kOffMax / 4;  // [0][64]: mA (WG0), [1][64]: mB (WG1)

  load_q<T, Tr>(kp, d, smem);
  BlockSrc src_a = block_source(kp, d, 0), src_b = block_source(kp, d, 1);
  if (n_blocks > 0) fill_part<T, Tr>(kp, d, 0, 0, smem, wg, wt, src_a);
  if (n_blocks > 1) fill_part<T, Tr>(kp, d, 1, 1, smem, wg, wt, src_b);
  bool fb_a = !src_a.box, fb_b = !src_b.box;  // the blocks in stages 0 / 1 came row by row
  const RowInfo ri = row_info(kp, d, wq, g);

  // Q's rope chunk into registers: the A fragments of S's last four k-steps.
  mbar_wait(smem + Tr::kBarQ, qphase);
  uint32_t rq[16];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t base = p1buf + 4 * q4;
      asm volatile("ld.shared.b32 %0, [%1];\n"
                   : "=r"(rq[4 * kk + 2 * h])
                   : "r"(base + swizzle128(ri.r0, 2 * kk + h)));
      asm volatile("ld.shared.b32 %0, [%1];\n"
                   : "=r"(rq[4 * kk + 2 * h + 1])
                   : "r"(base + swizzle128(ri.r1, 2 * kk + h)));
    }
  }

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float s[32];
  if (wg == 0) {
    if (n_blocks > 0) s_chunks<T, Tr>(s, smem, 0, uses[0] & 1, 0, 9, true, fb_a, rq);
  } else {
    if (n_blocks > 1) s_chunks<T, Tr>(s, smem, 1, uses[1] & 1, 4, 9, true, fb_b, rq);
  }
  wgmma_wait<0>();
  fence_regs(s);
  if (n_blocks > wg) mask_s<true>(s, d, wg, ri, q4);  // WG0: block 0, WG1: block 1

  for (int it = 0; it < n_blocks; it += 2) {
    const bool has_b = it + 1 < n_blocks, has_a2 = it + 2 < n_blocks, has_b2 = it + 3 < n_blocks;
    ++uses[0];
    if (has_b) ++uses[1];
    const uint32_t np = uses[0] - 1, npb = uses[1] - 1;  // earlier phases of the handoffs
    // The next pair's sources, in flight while this pair is computed.
    const BlockSrc nsrc_a = block_source(kp, d, it + 2), nsrc_b = block_source(kp, d, it + 3);
    if (wg == 0) {
      fence_regs(o);
      float ma0 = m0, ma1 = m1;
      row_max(s, ma0, ma1);
      if (q4 == 0) {
        s_max[ri.r0] = ma0;
        s_max[ri.r1] = ma1;
      }
      hand_give<Tr>(smem, kHandMA);
      float rs0, rs1;
      uint32_t pk[16];
      make_p<T>(s, ma0, ma1, sc, rs0, rs1, pk);
      const float a0 = rescale(m0, ma0, sc), a1 = rescale(m1, ma1, sc);
      l0 = l0 * a0 + rs0;
      l1 = l1 * a1 + rs1;
      if (a0 != 1.f || a1 != 1.f) scale_o(o, a0, a1);
      compute_pv_rs<T, Tr>(o, pk, stage0, 0);
      // P_A at mB for WG1 while P_A V_A runs: P_A scaled by 2^(mA - mB), not recomputed from S
      // (on the H200 7-8% faster at the GLM-5 shape and at 1,128,64 than recomputing it after
      // the product's wait; scaling alone gave 1-2%).
      hand_take<Tr>(smem, kHandMB, np);
      const float mb0 = s_max[64 + ri.r0], mb1 = s_max[64 + ri.r1];
      const float b0 = rescale(ma0, mb0, sc), b1 = rescale(ma1, mb1, sc);
      store_p_scaled<T>(s, b0, b1, p0buf, ri, q4);
      fence_proxy_async();
      hand_give<Tr>(smem, kHandP0);
      wgmma_wait<0>();
      keep_regs(pk);  // the product read pk until the wait: its registers stay untouched till then
      fence_regs(o);
      if (has_a2) fill_part<T, Tr>(kp, d, it + 2, 0, smem, 0, wt, nsrc_a);
      l0 *= b0;
      l1 *= b1;
      if (b0 != 1.f || b1 != 1.f) scale_o(o, b0, b1);
      m0 = mb0;
      m1 = mb1;
      if (has_b) {
        hand_take<Tr>(smem, kHandP1, npb);
        pv_smem<T, Tr>(o, p1buf, stage1, 0);
      }
      if (has_a2) s_chunks<T, Tr>(s, smem, 0, uses[0] & 1, 0, 4, true, !nsrc_a.box, rq);
      if (has_b) {
        if (has_a2) {
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        if (has_b2) fill_part<T, Tr>(kp, d, it + 3, 1, smem, 0, wt, nsrc_b);
      }
      if (has_a2) s_chunks<T, Tr>(s, smem, 0, uses[0] & 1, 4, 5, false, !nsrc_a.box, rq);
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(o);
      if (has_a2) mask_s<true>(s, d, it + 2, ri, q4);  // right after the wait (C7515 otherwise)
    } else {
      fence_regs(o);
      float mb0 = -INFINITY, mb1 = -INFINITY;
      if (has_b) row_max(s, mb0, mb1);
      hand_take<Tr>(smem, kHandMA, np);
      mb0 = fmaxf(mb0, s_max[ri.r0]);
      mb1 = fmaxf(mb1, s_max[ri.r1]);
      if (q4 == 0) {
        s_max[64 + ri.r0] = mb0;
        s_max[64 + ri.r1] = mb1;
      }
      hand_give<Tr>(smem, kHandMB);
      // This group's running maxima (m0, m1) move to mB with O_R and its row sums.
      const float c0 = rescale(m0, mb0, sc), c1 = rescale(m1, mb1, sc);
      l0 *= c0;
      l1 *= c1;
      if (c0 != 1.f || c1 != 1.f) scale_o(o, c0, c1);
      m0 = mb0;
      m1 = mb1;
      uint32_t pk[16];
      if (has_b) {
        float rs0, rs1;
        make_p<T>(s, mb0, mb1, sc, rs0, rs1, pk);
        l0 += rs0;
        l1 += rs1;
        store_p(pk, p1buf, ri, q4);
        fence_proxy_async();
        compute_pv_rs<T, Tr>(o, pk, stage1, 1);
      }
      hand_take<Tr>(smem, kHandP0, np);
      pv_smem<T, Tr>(o, p0buf, stage0, 1);
      if (has_b) {
        hand_give<Tr>(smem, kHandP1);
        wgmma_wait<1>();
        keep_regs(pk);
        if (has_b2) fill_part<T, Tr>(kp, d, it + 3, 1, smem, 1, wt, nsrc_b);
      }
      wgmma_wait<0>();
      fence_regs(o);
      if (has_a2) fill_part<T, Tr>(kp, d, it + 2, 0, smem, 1, wt, nsrc_a);
      if (has_b2) {
        s_chunks<T, Tr>(s, smem, 1, uses[1] & 1, 4, 9, true, !nsrc_b.box, rq);
        wgmma_wait<0>();
        fence_regs(s);
        mask_s<true>(s, d, it + 3, ri, q4);
      }
    }
  }
  store_output<T, Tr>(kp, d, smem, smem_f, o, m0, m1, l0, l1, ri, wg, lane, q4);
}

#endif  // TREEMLA_HAS_WGMMA

template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    verify_tma_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if TREEMLA_HAS_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem = (raw + 1023u) & ~1023u;
  float* smem_f = reinterpret_cast<float*>(smem_raw + (smem - raw));
  if (threadIdx.x == 0) {
    for (int st = 0; st < Tr::kStages; ++st) {
      for (int c = 0; c < Tr::kChunks; ++c) mbar_init(smem + Tr::bar_full(st, c), 1);
    }
    mbar_init(smem + Tr::kBarQ, Tr::kThreads);
    for (int h = 0; h < Tr::kNumHand; ++h) mbar_init(smem + Tr::bar_hand(h), 128);
    fence_mbar_init();
    if (kp.p.page_size >= 32) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.kv_map[0]))
                   : "memory");
    }
    if (kp.p.page_size >= 64) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kp.kv_map[1]))
                   : "memory");
    }
  }
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();
  uint32_t uses[2] = {0u, 0u};
  Item d;
  for (uint32_t n = 0; next_item(kp, d, n); ++n) {
    tma_item<T, Tr>(kp, d, smem, smem_f, uses, n & 1);
    bar_sync(kBarItem, Tr::kThreads);  // Q, the stages and the row statistics are reused
  }
  bulk_wait_all();
#else
  __trap();
#endif
}

}  // namespace treemla::cuda::sm90a

namespace treemla::cuda {

template <class Tr>
AltKernel make_sm90a_tma_kernel() {
  return {reinterpret_cast<const void*>(&sm90a::verify_tma_kernel<typename Tr::Element, Tr>),
          Tr::kThreads, Tr::kSmemBytes, 32};
}

}  // namespace treemla::cuda
