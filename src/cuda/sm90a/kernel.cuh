// The sm90a verify family: wgmma (Q, K, V and P read from shared memory) + a cp.async producer
// warpgroup + mbarriers, for sm_90a (H100, H200, H20). Budget and measurements:
// docs/verify-kernel.md, "The sm90a family".
//
// Grid and work items: a persistent grid, one CTA per SM; CTA c takes items c, c + grid, ... of
// the schedule's list (next_item). An item is one row tile (kBlockM = 64 folded rows (node, head))
// and one split of its prefix; the last split also attends the tree tail. The item's keys are
// walked in 64-key blocks: first the tail's 32-key blocks that some row of the tile can see, two
// to a block (each half masked with its own tree-mask word), then its prefix range in order. The
// tail first: its row-by-row copies and mask loads then overlap the item's start (Q, the first
// prefix boxes) instead of ending the split that carries it (1-4% faster at 8,128,1,32768 and
// 1,16,16,32768 on the H200, level elsewhere; docs/verify-kernel.md).
//
// Warpgroups: WG0 and WG1 compute; WG2 loads. WG0 owns output columns [0, 256), WG1 [256, 512)
// (O: 64 x 256 fp32, 128 registers a thread). Blocks go in pairs (A, B) = (2p, 2p + 1), A in
// stage 0 and B in stage 1, and the two groups see-saw over them:
//   WG0: S_A = Q K_A^T (36 wgmma m64n64k16); mA = max(m, rowmax S_A); P_A = exp2(S_A - mA) into
//        the rope chunk of stage 0 (dead once S_A is done); tell WG1 (named barrier A);
//        O_L = O_L * 2^(m - mA) + P_A V_A[:, 0:256].
//   WG1: S_B = Q K_B^T meanwhile; waits for A; mB = max(mA, rowmax S_B); P_B into stage 1's rope
//        chunk; tells WG0 (barrier B); O_R = (O_R * 2^(m - mA) + P_A V_A[:, 256:]) * 2^(mA - mB)
//        + P_B V_B[:, 256:].
//   WG0: waits for B; O_L = O_L * 2^(mA - mB) + P_B V_B[:, 0:256].
// Each group's product with its own P takes P from registers (wgmma with A in registers: the
// accumulator layout of S is the fragment layout of A); the other group's reads it from the rope
// chunk. Both end the pair at row max mB. Each group keeps the row sums of the P it computed, at
// the current max; the epilogue adds the two. Every S is computed once, every P V column once, and
// one group's softmax runs while the other's products keep the tensor cores busy. A thread skips
// a rescale of O that moves none of its two rows' maxima (most blocks of a long prefix; 3% at
// 1, 128, 64, 131072); when B moves none of WG1's, WG1 also issues its second P V without
// waiting for the first.
// Stages are freed in three parts (traits.h): chunks 0-3 once WG0's P V on the stage is done,
// chunks 4-7 once WG1's is, the rope chunk (P) once both are; WG0 waits for its P_A V_A before
// waiting for WG1's softmax of B, so chunks 0-3 of stage 0 are refilled while the rest of the
// pair is computed.
// Producer: per block, waits for each part of the stage to be free and copies the 64 rows' columns
// of that part with cp.async (16 bytes a copy, into the swizzled layout), zero-filling rows that
// are not keys (V must be finite where P = 0); each part lands on its own full mbarrier, so S
// starts on the first part while the rest is in flight. The page-table entries of a block are
// read one block ahead and used after the wait. Q is loaded the same way at the start of an item.
// Tried and dropped (docs/verify-kernel.md): L2 prefetch of later blocks by the producer (20%
// slower), WG1 issuing P_A V_A before its softmax (no gain; slower on small items), TMA copies of
// whole 32-key halves (no faster than cp.async), tiles of at most 16 rows computed transposed
// (S^T = K Q^T, O^T += V^T P^T: decode 6-8% faster, but the tree shapes 1-3% slower with that
// path in the kernel; commit e196e0e has it), a FlashMLA-like order (each group's own P from
// registers, the next S issued right after the group's products: 17-21% slower; 93968a3); TMA
// tensor boxes for the KV blocks again, with no proxy fence for them (32- or 64-row boxes: 23-56%
// slower than cp.async; a part's boxes land later than its cp.async rows, and beside wgmma they
// cost as much: bench/micro/copy_modes.cu), and with a full barrier a chunk (still 12-20% slower);
// Q's rope chunk in registers for S (ptxas serializes every wgmma and spills); one group computing
// every S and the other only its half of P V (2-6% slower at the tree shapes; c008169). The
// family's second kernel, kernel_tma.cuh (no producer group, TMA boxes issued by the compute
// groups, no P in a stage), is selectable with TREEMLA_SM90A_KERNEL=tma.
//
// Output: as the other families: an item covering its tile's whole key range writes O (input
// dtype) and LSE (ln); otherwise a normalized fp32 partial and a log2-domain LSE, merged by the
// combine kernel. Both groups put their columns of O / l into the KV stages (free by then), and
// lanes 0-7 of each compute warp copy one row each to global memory with a bulk copy; WG0 writes
// the LSE.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/arch.h"
#include "cuda/common/async.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/dispatch.h"
#include "cuda/sm90a/traits.h"
#include "cuda/sm90a/wgmma.cuh"

namespace treemla::cuda::sm90a {

#if TREEMLA_HAS_WGMMA

// Named barriers (0 is __syncthreads).
constexpr int kBarA = 1;     // WG0 arrives, WG1 waits: P_A and mA are in shared memory
constexpr int kBarB = 2;     // WG1 arrives, WG0 waits: P_B and mB
constexpr int kBarWg0 = 3;   // WG0 alone: its P_A writes are all done
constexpr int kBarWg1 = 4;   // WG1 alone: its P_B writes are all done
constexpr int kBarBoth = 5;  // WG0 + WG1: the epilogue's row-sum swap
// All 384 threads at the end of each item. Not barrier 0: the roles reach it from their own loops,
// and compute-sanitizer racecheck takes barrier 0 for __syncthreads at one place in the code.
constexpr int kBarItem = 6;

// One work item as every warpgroup sees it.
struct Item {
  int b, tile;
  int64_t slot;  // -1: the final O and LSE; else the partial slot (WorkItem)
  RequestSched rs;
  int H, rows, row0;
  int kbeg, kend;  // this split's prefix keys [kbeg, kend)
  int n_pfx;       // 64-key prefix blocks
  int n_tail;      // 32-key tail blocks (set bits of tail_bits)
  uint64_t tail_bits;
  int n_blocks;  // n_tb + n_pfx: blocks [n_tb, n_blocks) are prefix blocks 0 .. n_pfx - 1
  int n_tb;      // 64-key tail blocks, ceil(n_tail / 2): blocks [0, n_tb) are the tail's
};

// The key (logical row of the request) that row r (0..63) of block `it` holds, or -1.
__device__ __forceinline__ int block_key(const Item& d, int it, int r) {
  if (it >= d.n_tb) {
    const int t = d.kbeg + (it - d.n_tb) * 64 + r;
    return t < d.kend ? t : -1;
  }
  const int k = 2 * it + (r >> 5);
  if (k >= d.n_tail) return -1;
  const int t = d.rs.prefix_len + nth_set_bit(d.tail_bits, k) * 32 + (r & 31);
  return t < d.rs.prefix_len + d.rs.q_len ? t : -1;
}

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Whether `pred` holds for any thread of the 128 that meet at named barrier `id` (a barrier
// too); the same answer in every thread, read through a shuffle so the compiler knows it is.
__device__ __forceinline__ bool group_any(int id, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, 128, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(pred)), "r"(id)
      : "memory");
  return __shfl_sync(0xffffffffu, r, 0) != 0;
}

// 2^((m_old - m_new) * sc): the factor that moves a state at max m_old to max m_new >= m_old.
// A row that has seen nothing keeps max -inf: its state is zero, any factor does.
__device__ __forceinline__ float rescale(float m_old, float m_new, float sc) {
  return m_new == -INFINITY ? 1.f : fast_exp2(m_old * sc - m_new * sc);
}

// ---------------------------------------------------------------------------------------------
// Producer (WG2, 128 threads). Thread p copies rows p / 8 + 16 j (j = 0..3), 16-byte unit p % 8
// of each of the 9 chunks: a warp moves 4 rows x 128 contiguous bytes per instruction.

// The page-table reads of one block's rows, issued a block ahead and used only after the wait
// for the stage, so their latency (64 different entries a block at page size 1) overlaps it.
struct PageLoads {
  int key[4];   // key (logical row) of each of the thread's rows, -1: none
  int page[4];  // its page-table entry as loaded (checked when used)
};

__device__ __forceinline__ void load_pages(const VerifyKernelParams& kp, const Item& d, int it,
                                           int p, PageLoads& pl) {
  const int64_t pt_row = static_cast<int64_t>(d.b) * kp.p.page_table_stride;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    pl.key[j] = it < d.n_blocks ? block_key(d, it, (p >> 3) + 16 * j) : -1;
    const int entry = pl.key[j] >> kp.page_shift;
    pl.page[j] = pl.key[j] >= 0 && entry < kp.p.page_table_stride
                     ? __ldg(kp.p.page_table + pt_row + entry)
                     : 0;
  }
}

// Source offsets (elements) of the thread's rows, -1 where the row is not a key or its page
// entry is bad (recorded; the row is zero-filled instead of read).
__device__ __forceinline__ void row_sources(const VerifyKernelParams& kp, const Item& d,
                                            const PageLoads& pl, int64_t (&src)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int t = pl.key[j], page = pl.page[j];
    src[j] = -1;
    if (t < 0) continue;
    if ((t >> kp.page_shift) >= kp.p.page_table_stride) {
      record_status(kp.hdr, kStatusStride, d.b, t, kp.p.page_table_stride);
    } else if (page < 0 || page >= kp.p.num_pages) {
      record_status(kp.hdr, kStatusPage, d.b, page, t);
    } else {
      src[j] =
          (static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1))) * kHeadDimQK;
    }
  }
}

// cp.async of the thread's rows of chunks [c_begin, c_end); rows with src -1 are zero-filled (V
// must be finite where P = 0).
template <typename T>
__device__ __forceinline__ void copy_rows(uint32_t dst, const T* base, const int64_t (&src)[4],
                                          int p, int c_begin, int c_end) {
  const int u = p & 7;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = (p >> 3) + 16 * j;
    const bool ok = src[j] >= 0;
    const T* s = base + (ok ? src[j] : 0) + u * 8;
    const uint32_t d = dst + swizzle128(r, u);
#pragma unroll
    for (int c = c_begin; c < c_end; ++c) cp_async_16(d + c * 8192, s + c * 64, ok ? 16 : 0);
  }
}

template <typename T, class Tr>
__device__ void produce_item(const VerifyKernelParams& kp, const Item& d, uint32_t smem,
                             uint32_t (&uses)[2]) {
  const int p = threadIdx.x - 256;
  PageLoads pl;
  load_pages(kp, d, 0, p, pl);
  // Q rows of the tile (zero past the request's rows).
  {
    int64_t src[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = d.row0 + (p >> 3) + 16 * j;
      src[j] = r < d.rows ? (static_cast<int64_t>(d.rs.q_start) * d.H + r) * kHeadDimQK : -1;
    }
    copy_rows<T>(smem + Tr::kOffQ, static_cast<const T*>(kp.p.q), src, p, 0, Tr::kChunks);
    cp_async_mbar_arrive(smem + Tr::kBarQ);
  }
  const T* kv = static_cast<const T*>(kp.p.kv_cache);
  for (int it = 0; it < d.n_blocks; ++it) {
    const int s = it & 1;
    const uint32_t dst = smem + Tr::kOffStages + s * Tr::kTileBytes;
    const uint32_t parity = (uses[s] & 1) ^ 1;
    int64_t src[4];
#pragma unroll
    for (int part = 0; part < Tr::kLoadParts; ++part) {
      mbar_wait(smem + Tr::bar_empty(s, part), parity);
      if (part == 0) {
        row_sources(kp, d, pl, src);
        load_pages(kp, d, it + 1, p, pl);  // the next block's entries, in flight meanwhile
      }
      copy_rows<T>(dst, kv, src, p, Tr::part_begin(part), Tr::part_end(part));
      cp_async_mbar_arrive(smem + Tr::bar_full(s, part));
    }
    ++uses[s];
  }
}

// ---------------------------------------------------------------------------------------------
// Compute warpgroups.

// S = Q K^T over all 576 columns: 9 chunks x 4 k-steps of m64n64k16, each part's products issued
// as soon as that part of the stage has landed.
template <typename T, class Tr>
__device__ __forceinline__ void compute_s(float (&s)[32], uint32_t smem, int stage,
                                          uint32_t parity) {
  const uint32_t sk = smem + Tr::kOffStages + stage * Tr::kTileBytes;
  const uint64_t dq = make_desc(smem + Tr::kOffQ, 16, 1024), dk = make_desc(sk, 16, 1024);
  fence_regs(s);
#pragma unroll
  for (int part = 0; part < Tr::kLoadParts; ++part) {
    mbar_wait(smem + Tr::bar_full(stage, part), parity);
    fence_proxy_async();  // the part's cp.async writes, seen by wgmma
    wgmma_fence();
#pragma unroll
    for (int c = Tr::part_begin(part); c < Tr::part_end(part); ++c) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t off = static_cast<uint64_t>((c * 8192 + kk * 32) >> 4);
        wgmma_m64n64k16_ss<T>(s, dq + off, dk + off, (c | kk) != 0);
      }
    }
  }
  wgmma_commit();
}

// O[:, 256 half ...] += P V: P (64 x 64 keys) in the stage's rope chunk, V = the stage's latent
// chunks [4 half, 4 half + 4), N-major.
template <typename T, class Tr>
__device__ __forceinline__ void compute_pv(float (&o)[128], uint32_t stage, int half) {
  const uint64_t dp = make_desc(stage + Tr::kPChunk * Tr::kChunkBytes, 16, 1024);
  const uint64_t dv = make_desc(stage + 4 * half * Tr::kChunkBytes, Tr::kChunkBytes, 1024);
  fence_regs(o);  // the rescale of O happens before the fence, not sunk past it
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64n256k16_ss_tnspb<T>(o, dp + static_cast<uint64_t>((kk * 32) >> 4),
                                 dv + static_cast<uint64_t>((kk * 2048) >> 4), 1);
  }
  wgmma_commit();
}

// The same with this group's own P from registers (pk from write_p): 8 KB of shared-memory reads
// fewer a product.
template <typename T, class Tr>
__device__ __forceinline__ void compute_pv_rs(float (&o)[128], const uint32_t (&pk)[16],
                                              uint32_t stage, int half) {
  const uint64_t dv = make_desc(stage + 4 * half * Tr::kChunkBytes, Tr::kChunkBytes, 1024);
  fence_regs(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {pk[4 * kk], pk[4 * kk + 1], pk[4 * kk + 2], pk[4 * kk + 3]};
    wgmma_m64n256k16_rs_tnspb<T>(o, a, dv + static_cast<uint64_t>((kk * 2048) >> 4), 1);
  }
  wgmma_commit();
}

// What the compute threads know about their two rows: r0 = 16 w + g and r1 = r0 + 8.
struct RowInfo {
  int r0, r1;  // tile rows
  bool v0, v1;
  const uint32_t* mrow0;  // tree-mask row (32-bit words) of each row's node
  const uint32_t* mrow1;
};

// The rows of warp wq's lane group g (within its warpgroup) and their tree-mask rows.
__device__ __forceinline__ RowInfo row_info(const VerifyKernelParams& kp, const Item& d, int wq,
                                            int g) {
  RowInfo ri;
  ri.r0 = 16 * wq + g;
  ri.r1 = ri.r0 + 8;
  ri.v0 = d.row0 + ri.r0 < d.rows;
  ri.v1 = d.row0 + ri.r1 < d.rows;
  const int node0 = ri.v0 ? (d.row0 + ri.r0) / d.H : 0, node1 = ri.v1 ? (d.row0 + ri.r1) / d.H : 0;
  ri.mrow0 = reinterpret_cast<const uint32_t*>(
      kp.p.tree_mask + static_cast<int64_t>(d.rs.q_start + node0) * kp.p.mask_words);
  ri.mrow1 = reinterpret_cast<const uint32_t*>(
      kp.p.tree_mask + static_cast<int64_t>(d.rs.q_start + node1) * kp.p.mask_words);
  return ri;
}

// Visible keys of a tail block (bit c of word h: key 32 h + c) for the thread's two rows, out of
// line (mask_s<true>): with this path inlined at each S of its block loop, the TMA kernel's code
// grew enough to stall on instruction fetch (docs/verify-kernel.md).
__device__ __noinline__ uint4 tail_vis(int k0, int n_tail, uint64_t tail_bits, int q_len, bool v0,
                                       bool v1, const uint32_t* mrow0, const uint32_t* mrow1) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k = k0 + h;
    if (k < n_tail) {
      const int jb = nth_set_bit(tail_bits, k);
      const int v = min(q_len - jb * 32, 32);
      const uint32_t in_range = v >= 32 ? 0xffffffffu : ((1u << v) - 1u);
      w[h] = v0 ? in_range & __ldg(mrow0 + jb) : 0u;
      w[2 + h] = v1 ? in_range & __ldg(mrow1 + jb) : 0u;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// -inf where a key is not visible: past the block's keys, or (tail) not an ancestor. kTailCall:
// the tail's visibility from tail_vis, out of line.
template <bool kTailCall = false>
__device__ __forceinline__ void mask_s(float (&s)[32], const Item& d, int it, const RowInfo& ri,
                                       int q4) {
  uint32_t vis0[2], vis1[2];  // bit c of half h: key 32 h + c visible
  if (it >= d.n_tb) {
    const int valid = d.kend - (d.kbeg + (it - d.n_tb) * 64);
    if (valid >= 64) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int v = min(max(valid - 32 * h, 0), 32);
      vis0[h] = vis1[h] = v >= 32 ? 0xffffffffu : ((1u << v) - 1u);
    }
  } else if constexpr (kTailCall) {
    const uint4 w =
        tail_vis(2 * it, d.n_tail, d.tail_bits, d.rs.q_len, ri.v0, ri.v1, ri.mrow0, ri.mrow1);
    vis0[0] = w.x;
    vis0[1] = w.y;
    vis1[0] = w.z;
    vis1[1] = w.w;
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = 2 * it + h;
      vis0[h] = vis1[h] = 0u;
      if (k < d.n_tail) {
        const int jb = nth_set_bit(d.tail_bits, k);
        const int v = min(d.rs.q_len - jb * 32, 32);
        const uint32_t in_range = v >= 32 ? 0xffffffffu : ((1u << v) - 1u);
        vis0[h] = ri.v0 ? in_range & __ldg(ri.mrow0 + jb) : 0u;
        vis1[h] = ri.v1 ? in_range & __ldg(ri.mrow1 + jb) : 0u;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int h = i >> 2, c = (8 * i + 2 * q4) & 31;
    if (!((vis0[h] >> c) & 1u)) s[4 * i + 0] = -INFINITY;
    if (!((vis0[h] >> (c + 1)) & 1u)) s[4 * i + 1] = -INFINITY;
    if (!((vis1[h] >> c) & 1u)) s[4 * i + 2] = -INFINITY;
    if (!((vis1[h] >> (c + 1)) & 1u)) s[4 * i + 3] = -INFINITY;
  }
}

__device__ __forceinline__ void row_max(const float (&s)[32], float& mx0, float& mx1) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// P = 2^(S sc - m sc) into the rope chunk at `pbase` (64 rows x 64 keys, swizzled), for the other
// group's product; returns the thread's partial row sums and its P as the A fragments of the four
// k-steps of this group's own product (pk[4 kk .. 4 kk + 3]: keys 16 kk .. 16 kk + 15; the
// accumulator layout of S is the fragment layout of A).
template <typename T>
__device__ __forceinline__ void write_p(const float (&s)[32], float m0, float m1, float sc,
                                        uint32_t pbase, const RowInfo& ri, int q4, float& rs0,
                                        float& rs1, uint32_t (&pk)[16]) {
  const float mu0 = m0 == -INFINITY ? 0.f : m0 * sc, mu1 = m1 == -INFINITY ? 0.f : m1 * sc;
  rs0 = rs1 = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float p0 = fast_exp2(fmaf(s[4 * i + 0], sc, -mu0));
    const float p1 = fast_exp2(fmaf(s[4 * i + 1], sc, -mu0));
    const float p2 = fast_exp2(fmaf(s[4 * i + 2], sc, -mu1));
    const float p3 = fast_exp2(fmaf(s[4 * i + 3], sc, -mu1));
    rs0 += p0 + p1;
    rs1 += p2 + p3;
    const uint32_t a0 = pbase + swizzle128(ri.r0, i) + 4 * q4;
    const uint32_t a1 = pbase + swizzle128(ri.r1, i) + 4 * q4;
    pk[2 * i] = pack2<T>(p0, p1);
    pk[2 * i + 1] = pack2<T>(p2, p3);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0), "r"(pk[2 * i]) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1), "r"(pk[2 * i + 1]) : "memory");
  }
}

__device__ __forceinline__ void scale_o(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i + 0] *= a0;
    o[4 * i + 1] *= a0;
    o[4 * i + 2] *= a1;
    o[4 * i + 3] *= a1;
  }
}

// The end of an item: adds the two groups' row sums, and writes O / l (or the normalized partial)
// and the LSE. O goes through shared memory (the KV stages, free once every block of the item is
// read) in global order, padded rows, then one bulk copy a row.
template <typename T, class Tr>
__device__ __forceinline__ void store_output(const VerifyKernelParams& kp, const Item& d,
                                             uint32_t smem, float* smem_f, float (&o)[128],
                                             float m0, float m1, float l0, float l1,
                                             const RowInfo& ri, int wg, int lane, int q4) {
  const float sc = kp.scale_log2;
  float* s_l = smem_f + Tr::kOffL / 4;  // [2][64]
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (q4 == 0) {
    s_l[64 * wg + ri.r0] = l0;
    s_l[64 * wg + ri.r1] = l1;
  }
  bar_sync(kBarBoth, 256);
  l0 += s_l[64 * (1 - wg) + ri.r0];
  l1 += s_l[64 * (1 - wg) + ri.r1];

  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
  const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const float lse0 = l0 > 0.f ? m0 * sc + __log2f(l0) : -INFINITY;  // log2 domain
  const float lse1 = l1 > 0.f ? m1 * sc + __log2f(l1) : -INFINITY;
  constexpr float kLn2 = 0.69314718055994530942f;
  const int64_t grow0 = static_cast<int64_t>(d.rs.q_start) * d.H + d.row0 + ri.r0;
  const int64_t grow1 = grow0 + 8;
  // O / l goes through shared memory (the KV stages: the loop has read every block of the item
  // and the producer waits at kBarItem) in global order, padded rows, then one bulk copy a row.
  // Stores straight from the fragments (8 rows x 16 or 32 bytes a warp instruction) made a split
  // call about 9 us slower (1,16,16,131072: 170 against 159 us; docs/verify-kernel.md).
  const uint32_t ostage = smem + Tr::kOffStages;
  const bool final_out = d.slot < 0;
  const int ostride = final_out ? Tr::kOutRowBytes : Tr::kPartRowBytes;
  if (final_out) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = 256 * wg + 8 * i + 2 * q4;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ostage + ri.r0 * ostride + col * 2),
                   "r"(pack2<T>(o[4 * i] * inv0, o[4 * i + 1] * inv0))
                   : "memory");
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ostage + ri.r1 * ostride + col * 2),
                   "r"(pack2<T>(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1))
                   : "memory");
    }
    if (wg == 0 && q4 == 0) {
      if (ri.v0) kp.lse[grow0] = lse0 * kLn2;
      if (ri.v1) kp.lse[grow1] = lse1 * kLn2;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = 256 * wg + 8 * i + 2 * q4;
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(ostage + ri.r0 * ostride + col * 4),
                   "f"(o[4 * i] * inv0), "f"(o[4 * i + 1] * inv0)
                   : "memory");
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(ostage + ri.r1 * ostride + col * 4),
                   "f"(o[4 * i + 2] * inv1), "f"(o[4 * i + 3] * inv1)
                   : "memory");
    }
    if (wg == 0 && q4 == 0) {
      if (ri.v0) kp.part_lse[d.slot * kBlockM + ri.r0] = lse0;
      if (ri.v1) kp.part_lse[d.slot * kBlockM + ri.r1] = lse1;
    }
  }
  fence_proxy_async();  // the rows, seen by the bulk copies
  bar_sync(kBarBoth, 256);
  // Lanes 0-7 of compute warp w copy rows 8 w + lane that the request has.
  const int crow = 8 * (threadIdx.x >> 5) + lane;
  if (lane < 8 && d.row0 + crow < d.rows) {
    void* dst = final_out
                    ? static_cast<void*>(static_cast<T*>(kp.o) + (grow0 - ri.r0 + crow) * kHeadDimV)
                    : static_cast<void*>(kp.part_o + (d.slot * kBlockM + crow) * kHeadDimV);
    bulk_copy_s2g(dst, ostage + crow * ostride, final_out ? kHeadDimV * 2 : kHeadDimV * 4);
    bulk_commit();
    bulk_wait_read();  // before kBarItem: the next item's loads reuse the stages
  }
}

template <typename T, class Tr>
__device__ void compute_item(const VerifyKernelParams& kp, const Item& d, uint32_t smem,
                             float* smem_f, uint32_t (&uses)[2], uint32_t qphase) {
  // 0 or 1: output columns [256 wg, 256 wg + 256). Read through a shuffle so the compiler knows
  // it is warp-uniform (wgmma in a branch it thinks divergent gets serialized).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0);
  const int n_blocks = __shfl_sync(0xffffffffu, d.n_blocks, 0);
  const int wt = threadIdx.x & 127, wq = wt >> 5, lane = wt & 31;
  const int g = lane >> 2, q4 = lane & 3;
  const float sc = kp.scale_log2;
  // Frees what this group read of a stage: its V half (part wg) and, the other group's arrivals
  // with it, the rope chunk that held P (part 2).
  const uint32_t empty_base = smem + Tr::bar_empty(0, 0);
  auto release = [&](int st) {
    mbar_arrive(empty_base + 8 * (Tr::kLoadParts * st + wg));
    mbar_arrive(empty_base + 8 * (Tr::kLoadParts * st + 2));
  };
  const uint32_t stage0 = smem + Tr::kOffStages, stage1 = stage0 + Tr::kTileBytes;
  const uint32_t p0base = stage0 + Tr::kPChunk * Tr::kChunkBytes;
  const uint32_t p1base = stage1 + Tr::kPChunk * Tr::kChunkBytes;
  float* s_max = smem_f + Tr::kOffMax / 4;  // [2][64]

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
      // S_A, softmax, P_A for WG1.
      compute_s<T, Tr>(s, smem, 0, uses[0] & 1);
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
      // O_L += P_A V_A. WG0 has nothing to do until WG1's softmax of B, so it waits for the
      // product here and frees chunks 0-3 of stage 0 at once (the producer refills them while
      // the rest of the pair is computed).
      const float a0 = rescale(m0, ma0, sc), a1 = rescale(m1, ma1, sc);
      l0 = l0 * a0 + rs0;
      l1 = l1 * a1 + rs1;
      if (a0 != 1.f || a1 != 1.f) scale_o(o, a0, a1);  // most blocks of a long prefix move no max
      compute_pv_rs<T, Tr>(o, pk, stage0, 0);
      m0 = ma0;
      m1 = ma1;
      wgmma_wait<0>();
      fence_regs(o);
      release(0);
      if (has_b) {
        // O_L += P_B V_B at WG1's max. Once the row maxima settle (most blocks of a long prefix)
        // B moved none of the thread's rows, and the rescale is skipped.
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
        release(1);
        m0 = mb0;
        m1 = mb1;
      }
    } else {
      // S_B runs while WG0 works on A; the softmax of B waits for WG0's max.
      float mb0 = -INFINITY, mb1 = -INFINITY, rs0 = 0.f, rs1 = 0.f;
      uint32_t pk[16];
      if (has_b) {
        compute_s<T, Tr>(s, smem, 1, uses[1] & 1);
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
      // O_R += P_A V_A at WG0's max, then O_R += P_B V_B at this group's.
      const float a0 = rescale(m0, ma0, sc), a1 = rescale(m1, ma1, sc);
      if (a0 != 1.f || a1 != 1.f) scale_o(o, a0, a1);
      compute_pv<T, Tr>(o, stage0, 1);
      if (has_b) {
        // The vote is also the barrier after which every thread's P_B is written.
        const float b0 = rescale(ma0, mb0, sc), b1 = rescale(ma1, mb1, sc);
        if (group_any(kBarWg1, b0 != 1.f || b1 != 1.f)) {
          wgmma_wait<0>();
          fence_regs(o);
          scale_o(o, b0, b1);
        }
        compute_pv_rs<T, Tr>(o, pk, stage1, 1);
        wgmma_wait<1>();
        release(0);
        wgmma_wait<0>();
        fence_regs(o);
        release(1);
      } else {
        wgmma_wait<0>();
        fence_regs(o);
        release(0);
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

// Work item n (0, 1, ...) of this CTA: items blockIdx.x, blockIdx.x + gridDim.x, ...; false when
// the work list is done. The schedule makes near-equal items in whole waves of the grid (the last
// one refined into pieces, WorkRefine), so this fixed assignment balances as a shared counter
// would, and no thread has to wait for another to learn its item (a counter's value handed over in
// shared memory cost a barrier at every item start, or, through mbarriers, 2-8% of the whole
// kernel by shape: docs/verify-kernel.md).
__device__ __forceinline__ bool next_item(const VerifyKernelParams& kp, Item& d, uint32_t n) {
  WorkItem w;
  if (!fetch_item_issue_now(kp, static_cast<int>(blockIdx.x + n * gridDim.x), w)) return false;
  d.b = w.b;
  d.rs = w.rs;
  d.tile = w.tile;
  d.slot = w.slot;
  d.H = kp.p.num_heads;
  d.rows = d.rs.q_len * d.H;
  d.row0 = d.tile * kBlockM;
  d.kbeg = w.pb_begin * 32;
  d.kend = min(w.pb_end * 32, d.rs.prefix_len);
  d.n_pfx = d.kend > d.kbeg ? (d.kend - d.kbeg + 63) / 64 : 0;
  d.tail_bits = w.tail ? tile_tail_bits(kp, d.rs, d.tile, threadIdx.x & 31) : 0;
  d.n_tail = __popcll(d.tail_bits);
  d.n_tb = __shfl_sync(0xffffffffu, (d.n_tail + 1) / 2, 0);
  d.n_blocks = __shfl_sync(0xffffffffu, d.n_pfx + d.n_tb, 0);
  return true;
}

#endif  // TREEMLA_HAS_WGMMA

template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    verify_main_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if TREEMLA_HAS_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The swizzle needs 1024-byte-aligned chunks; the allocation has kSmemBytes - kSmemUsed spare.
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem = (raw + 1023u) & ~1023u;
  float* smem_f = reinterpret_cast<float*>(smem_raw + (smem - raw));
  if (threadIdx.x == 0) {
    for (int st = 0; st < Tr::kStages; ++st) {
      for (int part = 0; part < Tr::kLoadParts; ++part) {
        mbar_init(smem + Tr::bar_full(st, part), 128);  // the producer threads' cp.async arrivals
        mbar_init(smem + Tr::bar_empty(st, part), Tr::empty_count(part));  // readers, after waits
      }
    }
    mbar_init(smem + Tr::kBarQ, 128);
    fence_mbar_init();
  }
  __syncthreads();
  pdl_wait();  // the schedule (or the previous layer's combine) has completed
  pdl_launch_dependents();
  uint32_t uses[2] = {0u, 0u};  // fills of each stage so far (the mbarrier phases)
  Item d;
  // Warp-uniform for the compiler (a shuffle of lane 0): wgmma under a branch it thinks divergent
  // gets serialized. The roles run separate loops (setmaxnreg sizes each region on its own) over
  // the same items (next_item) and meet at the end of each (kBarItem).
  if (__shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0) == 2) {
    warpgroup_reg_dealloc<Tr::kProducerRegs>();
    for (uint32_t n = 0; next_item(kp, d, n); ++n) {
      produce_item<T, Tr>(kp, d, smem, uses);
      bar_sync(kBarItem, Tr::kThreads);  // Q and the row statistics are reused by the next item
    }
  } else {
    warpgroup_reg_alloc<Tr::kComputeRegs>();
    for (uint32_t n = 0; next_item(kp, d, n); ++n) {
      compute_item<T, Tr>(kp, d, smem, smem_f, uses, n & 1);
      bar_sync(kBarItem, Tr::kThreads);
    }
    bulk_wait_all();  // the output rows' bulk copies are written before the CTA exits
  }
#else
  __trap();  // the sm90a family runs only where sm_90a code was compiled
#endif
}

}  // namespace treemla::cuda::sm90a

namespace treemla::cuda {

template <class Tr>
KernelEntry make_sm90a_entry() {
  using T = typename Tr::Element;
  return {reinterpret_cast<const void*>(&sm90a::verify_main_kernel<T, Tr>),
          Tr::kThreads,
          Tr::kSmemBytes,
          1,
          0,
          kMinCcWgmma,
          kMaxCcWgmma};
}

}  // namespace treemla::cuda
