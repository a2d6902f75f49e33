// The sm90a family's TMA kernel: the see-saw of kernel.cuh (same tiles, stages, products and
// output), with no producer warpgroup. Each compute group copies the parts of the stages it is the
// last to read, right after its last product on them, so a part's refill starts with no handoff:
//   WG0 copies chunks 0-3 of every block, and the rope chunk of the blocks in stage 1 (where WG0's
//       P_B V_B[:, :256] is the last read of P_B);
//   WG1 copies chunks 4-7 of every block, and the rope chunk of the blocks in stage 0 (where WG1's
//       P_A V_A[:, 256:] is the last read of P_A).
// A 32-row half of a block whose keys are consecutive and lie in one page comes by TMA (one box a
// chunk; one 64-row box a chunk when both halves are the same page's consecutive rows); any other
// half (page size < 32, a half that crosses a page, the rows past a split's or the tail's last
// key, a bad page-table entry) by the group's cp.async, zero-filled where a row is not a key. One
// full mbarrier per (stage, copying group): 128 arrivals (cp.async.mbarrier.arrive) plus the boxes'
// bytes. S of a block waits for WG0's part first (it is refilled first in both stages).
// docs/verify-kernel.md, "The sm90a family", has the measurements.
#pragma once

#include "cuda/sm90a/kernel.cuh"

namespace treemla::cuda::sm90a {

#if TREEMLA_HAS_WGMMA

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
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

// A 32-row half of a KV block: its first key, and that key's page-table entry as loaded, when
// its geometry lets a box fetch it (all 32 rows are keys, consecutive and in one page); box() also
// needs the entry to be good. Built one fill ahead (next_source), so that the entry's load is in
// flight until the fill uses it.
struct HalfSrc {
  int t, page;
  bool geom;
  __device__ __forceinline__ bool box(const VerifyKernelParams& kp) const {
    return geom && page >= 0 && page < kp.p.num_pages;
  }
};
struct BlockSrc {
  HalfSrc h[2];
};

__device__ __forceinline__ BlockSrc block_source(const VerifyKernelParams& kp, const Item& d,
                                                 int it) {
  BlockSrc b;
  const int ps = kp.p.page_size;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    HalfSrc& hs = b.h[h];
    hs.t = it < d.n_blocks ? block_key(d, it, 32 * h) : -1;
    const int entry = hs.t >> kp.page_shift;
    hs.geom = ps >= 32 && hs.t >= 0 && block_key(d, it, 32 * h + 31) >= 0 &&
              (hs.t & (ps - 1)) <= ps - 32 && entry < kp.p.page_table_stride;
    hs.page = hs.geom ? __ldg(kp.p.page_table +
                              static_cast<int64_t>(d.b) * kp.p.page_table_stride + entry)
                      : 0;
  }
  return b;
}

// Group g's part of block `it` into its stage (it & 1): chunks [4 g, 4 g + 4), and the rope chunk
// when the stage is 1 - g. Called by the group's 128 threads (wt: 0..127) together.
// `src` holds block_source(it) and is left holding block_source(it + 1): a group fills blocks in
// order.
template <typename T, class Tr>
__device__ __forceinline__ void fill_part(const VerifyKernelParams& kp, const Item& d, int it,
                                          uint32_t smem, int g, int wt, BlockSrc& src) {
  const int s = it & 1;
  const uint32_t stage = smem + Tr::kOffStages + s * Tr::kTileBytes;
  const uint32_t bar = smem + Tr::bar_full(s, g);
  const int nch = s != g ? 5 : 4;
  struct {
    int t, page;
    bool box;
  } h0{src.h[0].t, src.h[0].page, src.h[0].box(kp)}, h1{src.h[1].t, src.h[1].page, src.h[1].box(kp)};
  // PROBE (wait_mode 256): the halves a box would fetch are copied by cp.async from the same page.
  const bool cpa = (kp.wait_mode & 256) != 0;
  const bool cp0 = cpa && h0.box, cp1 = cpa && h1.box;
  if (cpa) h0.box = h1.box = false;
  src = block_source(kp, d, it + 1);
  if (wt == 0 && (h0.box || h1.box)) {
    const int ps = kp.p.page_size;
    mbar_expect_tx(bar, static_cast<uint32_t>(nch * 4096 * (int(h0.box) + int(h1.box))));
    const bool box64 = h0.box && h1.box && h1.t == h0.t + 32 && h1.page == h0.page;
    for (int i = 0; i < nch; ++i) {
      const int c = i < 4 ? 4 * g + i : Tr::kPChunk;
      const uint32_t dst = stage + c * Tr::kChunkBytes;
      if (box64) {
        tma_box(dst, &kp.kv_map[1], c * 64, h0.t & (ps - 1), h0.page, bar);
      } else {
        if (h0.box) tma_box(dst, &kp.kv_map[0], c * 64, h0.t & (ps - 1), h0.page, bar);
        if (h1.box) tma_box(dst + 4096, &kp.kv_map[0], c * 64, h1.t & (ps - 1), h1.page, bar);
      }
    }
  }
  if (!h0.box || !h1.box) {
    // Thread wt copies 16-byte unit wt % 8 of rows wt / 8 + 16 j (j = 0, 1: half 0; 2, 3: half 1).
    const T* kv = static_cast<const T*>(kp.p.kv_cache);
    const int u = wt & 7;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if ((j < 2 ? h0.box : h1.box)) continue;
      const int r = (wt >> 3) + 16 * j;
      const int t = block_key(d, it, r);
      int64_t src = -1;
      if (j < 2 ? cp0 : cp1) {
        const int ps = kp.p.page_size;
        src = (static_cast<int64_t>(j < 2 ? h0.page : h1.page) * ps + (t & (ps - 1))) * kHeadDimQK;
      } else if (t >= 0) {
        const int entry = t >> kp.page_shift;
        if (entry >= kp.p.page_table_stride) {
          record_status(kp.hdr, kStatusStride, d.b, t, kp.p.page_table_stride);
        } else {
          const int page = __ldg(kp.p.page_table +
                                 static_cast<int64_t>(d.b) * kp.p.page_table_stride + entry);
          if (page < 0 || page >= kp.p.num_pages) {
            record_status(kp.hdr, kStatusPage, d.b, page, t);
          } else {
            src = (static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1))) *
                  kHeadDimQK;
          }
        }
      }
      const T* sp = kv + (src >= 0 ? src : 0) + u * 8;
      const uint32_t dr = stage + swizzle128(r, u);
      const uint32_t n = src >= 0 ? 16 : 0;  // rows that are not keys: zeros (V finite where P = 0)
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        if (i == 4 && nch == 4) break;
        const int c = i < 4 ? 4 * g + i : Tr::kPChunk;
        cp_async_16(dr + c * Tr::kChunkBytes, sp + c * 64, n);
      }
    }
  }
  cp_async_mbar_arrive(bar);
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
    const T* sp =
        qp + (ok ? (static_cast<int64_t>(d.rs.q_start) * d.H + d.row0 + r) * kHeadDimQK : 0) + u * 8;
    const uint32_t dr = smem + Tr::kOffQ + swizzle128(r, u);
#pragma unroll
    for (int c = 0; c < Tr::kChunks; ++c) cp_async_16(dr + c * Tr::kChunkBytes, sp + c * 64, ok ? 16 : 0);
  }
  cp_async_mbar_arrive(smem + Tr::kBarQ);
}

// S = Q K^T of the block in stage S: WG0's part (chunks 0-3, and 8 in stage 1) first, then WG1's.
template <typename T, class Tr, int S>
__device__ __forceinline__ void compute_s_tma(float (&s)[32], uint32_t smem, uint32_t parity,
                                              bool fence) {
  const uint32_t sk = smem + Tr::kOffStages + S * Tr::kTileBytes;
  const uint64_t dq = make_desc(smem + Tr::kOffQ, 16, 1024), dk = make_desc(sk, 16, 1024);
  fence_regs(s);
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    mbar_wait(smem + Tr::bar_full(S, g), parity);
    if (fence) fence_proxy_async();  // the part's cp.async rows (if any), seen by wgmma
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < 5; ++i) {
      if (i == 4 && S == g) break;
      const int c = i < 4 ? 4 * g + i : Tr::kPChunk;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t off = static_cast<uint64_t>((c * 8192 + kk * 32) >> 4);
        wgmma_m64n64k16_ss<T>(s, dq + off, dk + off, (c | kk) != 0);
      }
    }
  }
  wgmma_commit();
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
  const uint32_t p0base = stage0 + Tr::kPChunk * Tr::kChunkBytes;
  const uint32_t p1base = stage1 + Tr::kPChunk * Tr::kChunkBytes;
  float* s_max = smem_f + Tr::kOffMax / 4;  // [2][64]
  const bool fence = (kp.wait_mode & 128) == 0;  // PROBE: 128 skips the proxy fences (wrong results)

  load_q<T, Tr>(kp, d, smem);
  BlockSrc src = block_source(kp, d, 0);
  if (n_blocks > 0) fill_part<T, Tr>(kp, d, 0, smem, wg, wt, src);
  if (n_blocks > 1) fill_part<T, Tr>(kp, d, 1, smem, wg, wt, src);
  const RowInfo ri = row_info(kp, d, wq, g);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  mbar_wait(smem + Tr::kBarQ, qphase);
  for (int it = 0; it < n_blocks; it += 2) {
    const bool has_b = it + 1 < n_blocks;
    float s[32];
    if (wg == 0) {
      compute_s_tma<T, Tr, 0>(s, smem, uses[0] & 1, fence);
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(o);
      mask_s(s, d, it, ri, q4);
      float ma0 = m0, ma1 = m1;
      row_max(s, ma0, ma1);
      float rs0, rs1;
      uint32_t pk[16];
      write_p<T>(s, ma0, ma1, sc, p0base, ri, q4, rs0, rs1, pk);
      if (q4 == 0) {
        s_max[ri.r0] = ma0;
        s_max[ri.r1] = ma1;
      }
      fence_proxy_async();
      bar_sync(kBarWg0, 128);
      bar_arrive(kBarA, 256);
      const float a0 = rescale(m0, ma0, sc), a1 = rescale(m1, ma1, sc);
      l0 = l0 * a0 + rs0;
      l1 = l1 * a1 + rs1;
      if (a0 != 1.f || a1 != 1.f) scale_o(o, a0, a1);
      compute_pv_rs<T, Tr>(o, pk, stage0, 0);
      m0 = ma0;
      m1 = ma1;
      wgmma_wait<0>();
      fence_regs(o);
      if (it + 2 < n_blocks) fill_part<T, Tr>(kp, d, it + 2, smem, 0, wt, src);  // chunks 0-3 of A
      if (has_b) {
        bar_sync(kBarB, 256);
        const float mb0 = s_max[64 + ri.r0], mb1 = s_max[64 + ri.r1];
        const float b0 = rescale(ma0, mb0, sc), b1 = rescale(ma1, mb1, sc);
        if (b0 != 1.f || b1 != 1.f) {
          l0 *= b0;
          l1 *= b1;
          scale_o(o, b0, b1);
        }
        compute_pv<T, Tr>(o, stage1, 0);
        wgmma_wait<0>();
        fence_regs(o);
        if (it + 3 < n_blocks) fill_part<T, Tr>(kp, d, it + 3, smem, 0, wt, src);  // 0-3 and 8 of B
        m0 = mb0;
        m1 = mb1;
      }
    } else {
      float mb0 = -INFINITY, mb1 = -INFINITY, rs0 = 0.f, rs1 = 0.f;
      uint32_t pk[16];
      if (has_b) {
        compute_s_tma<T, Tr, 1>(s, smem, uses[1] & 1, fence);
        wgmma_wait<0>();
        fence_regs(s);
        fence_regs(o);
        mask_s(s, d, it + 1, ri, q4);
        row_max(s, mb0, mb1);
      }
      bar_sync(kBarA, 256);
      const float ma0 = s_max[ri.r0], ma1 = s_max[ri.r1];
      mb0 = fmaxf(mb0, ma0);
      mb1 = fmaxf(mb1, ma1);
      if (has_b) {
        write_p<T>(s, mb0, mb1, sc, p1base, ri, q4, rs0, rs1, pk);
        if (q4 == 0) {
          s_max[64 + ri.r0] = mb0;
          s_max[64 + ri.r1] = mb1;
        }
        fence_proxy_async();
        bar_arrive(kBarB, 256);
      }
      const float a0 = rescale(m0, ma0, sc), a1 = rescale(m1, ma1, sc);
      if (a0 != 1.f || a1 != 1.f) scale_o(o, a0, a1);
      compute_pv<T, Tr>(o, stage0, 1);
      if (has_b) {
        const float b0 = rescale(ma0, mb0, sc), b1 = rescale(ma1, mb1, sc);
        if (group_any(kBarWg1, b0 != 1.f || b1 != 1.f)) {
          wgmma_wait<0>();
          fence_regs(o);
          scale_o(o, b0, b1);
        }
        compute_pv_rs<T, Tr>(o, pk, stage1, 1);
        wgmma_wait<1>();
        if (it + 2 < n_blocks) fill_part<T, Tr>(kp, d, it + 2, smem, 1, wt, src);  // 4-7 and 8 of A
        wgmma_wait<0>();
        fence_regs(o);
        if (it + 3 < n_blocks) fill_part<T, Tr>(kp, d, it + 3, smem, 1, wt, src);  // 4-7 of B
      } else {
        wgmma_wait<0>();
        fence_regs(o);
      }
      l0 = l0 * rescale(m0, mb0, sc) + rs0;
      l1 = l1 * rescale(m1, mb1, sc) + rs1;
      m0 = mb0;
      m1 = mb1;
    }
    ++uses[0];
    if (has_b) ++uses[1];
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
      for (int g = 0; g < 2; ++g) mbar_init(smem + Tr::bar_full(st, g), 128);
    }
    mbar_init(smem + Tr::kBarQ, Tr::kThreads);
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
