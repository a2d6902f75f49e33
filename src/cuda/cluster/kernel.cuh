// The cluster verify family: mma.sync m16n8k16 + a cp.async / mbarrier pipeline + a 2-CTA cluster,
// for sm_90 and newer (sm_120 included). Budget and measurements: docs/verify-kernel.md.
//
// Grid: a persistent grid of CTA pairs (clusters of 2). Pair p takes work items p, p + P, ...
// (P = number of pairs; the schedule makes about one item per pair). An item is one row tile
// (kBlockM = 64 folded rows (node, head) of one request) and one split of its prefix; the last
// split also does the tree tail (32-key blocks that some row of the tile can see). A tile of at
// most 32 rows in "pair" mode carries two consecutive splits, one per row group.
//
// The pair splits the 576 KV columns, not the rows: CTA c owns latent columns [256c, 256c + 256)
// and rope columns [512 + 32c, 512 + 32c + 32) (288 columns, 576 bytes per row). Each CTA reads
// only its half of every KV row, so the pair reads each row once. S = Q K^T is the sum of two
// partial products, one per CTA: the CTAs swap partial scores through distributed shared memory
// (st.async into the peer, counted on the peer's mbarrier) and both add them, so both hold the
// same S bit for bit (a + b == b + a), run the same softmax and keep the same P. CTA c then
// computes O[:, 256c : 256c + 256] = P V with V = its latent columns, already in its stages.
//
// Warps: warps 0-7 compute, warps 8-11 (the producer warpgroup) load. Compute warp w has row group
// rh = w / 4 (tile rows [32 rh, 32 rh + 32), or rows [0, 32) for both groups in pair mode), dim
// half dh = (w / 2) % 2, key half kh = w % 2, and column quarter cq = w % 4.
//   S:  warp (rh, dh, kh) multiplies its 32 rows' Q over 144 of the CTA's 288 columns (Q in
//       registers, 72 per thread) by keys [16 kh, 16 kh + 16) of the block: a 32 x 16 partial.
//       It keeps rows [16 dh, 16 dh + 16) of the group and hands the other 16 rows to its dh
//       sibling (X, shared memory), adds the sibling's half to its own, and swaps that 16 x 16
//       sum with the same warp of the peer CTA (Y). The two key halves of a row swap their
//       row maxima (a 64-thread barrier), then each writes its P (16 x 16, input dtype) and the
//       kh = 0 warp the rows' rescale factors.
//   PV: after a 128-thread barrier of the row group, warp (rh, cq) computes the group's 32 rows
//       x 64 output columns (64 fp32 registers) from P (ldmatrix, shared) and the block's V.
// Producer: per block, the producer warpgroup waits for the stage to be free, looks up each row's
//   page and copies the CTA's 576 bytes of each row with cp.async (four threads a row), zero-
//   filling rows that are not keys (V must be finite where P = 0); each thread's copies arrive on
//   the stage's full mbarrier when they land.
// Synchronization per block: stage full/empty mbarriers (producer <-> computing threads: each
// computing thread arrives on empty after its own last read of the stage), X
// (64-thread named barrier), Y (per-warp mbarrier pairs across the cluster: yfull counts the
// peer's 1024 bytes, yempty says the peer has read its slot), the key-half max swap (64-thread
// named barrier) and the row group's P barrier (128 threads). P and the max/alpha slots
// alternate between two buffers: a warp writes slot i % 2 again only after a barrier that every
// reader of the previous contents passes after reading it. X and Y have one slot per warp: X is
// written again only after the row-group barrier (or, in a work item's first iteration, an extra
// pair barrier) that its reader passed after reading it, and Y only after the peer's yempty.
// Blocks are software-pipelined: iteration i computes block i + 1's partial scores while block
// i's sum travels from the peer, so the compute warps hold two stages at a time.
//
// Output: as the cpasync family: an item covering its tile's whole key range writes O (input
// dtype) and LSE (ln); otherwise a normalized fp32 partial and a log2-domain LSE per split,
// merged by the combine kernel. CTA c writes its 256 output columns; CTA 0 writes the LSE.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/arch.h"
#include "cuda/cluster/traits.h"
#include "cuda/common/async.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/dispatch.h"

// Test builds only (docs/testing.md): 1 tail mask ignored, 2 a key dropped, 3 LSE in base 2.
#ifndef TREEMLA_KERNEL_MUTATION
#define TREEMLA_KERNEL_MUTATION 0
#endif

namespace treemla::cuda::cluster {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// One work item as every warp of both CTAs sees it. Per sub-split values are kept as scalar
// pairs and read through sub() with a select, never an array indexed at run time (which would
// put the item in local memory).
struct Item {
  int b, tile, pair;
  RequestSched rs;
  int split0, split1;        // split index of each sub-split (only 0 unless pair)
  int pb_begin0, pb_begin1;  // first prefix block
  int n_pb0, n_pb1;          // prefix blocks
  // tail blocks (32-node blocks some row of the tile can see), last split only
  uint64_t tail0, tail1;
  int n0, n1;  // blocks: n_pb + tail blocks
};

template <typename V>
__device__ __forceinline__ V sub(int g, V a, V b) {
  return g ? b : a;
}

__device__ __forceinline__ Item decode_item(const VerifyKernelParams& kp, int item, int lane) {
  Item it;
  const ItemPos pos = locate_item(kp, item);
  it.b = pos.b;
  it.rs = kp.sched[it.b];
  it.tile = pos.tile;
  it.pair = it.rs.pair;
  const int nsub = it.pair ? 2 : 1;
  const int first = pos.index * nsub;
  // The item's last split is the request's last (a pair item covers two).
  const bool tail_item = split_has_tail(kp, it.rs, first + nsub - 1);
  const uint64_t tbits = tail_item ? tile_tail_bits(kp, it.rs, it.tile, lane) : 0;
  auto range = [&](int s, int& pb_begin, int& n_pb) {
    int pb_end;
    split_range(it.rs, s, pb_begin, pb_end);
    n_pb = max(0, pb_end - pb_begin);
  };
  it.split0 = first;
  range(first, it.pb_begin0, it.n_pb0);
  it.tail0 = first == it.rs.splits - 1 ? tbits : 0;
  it.split1 = first + 1;
  if (it.pair) {
    range(first + 1, it.pb_begin1, it.n_pb1);
    it.tail1 = first + 1 == it.rs.splits - 1 ? tbits : 0;
  } else {
    it.pb_begin1 = it.n_pb1 = 0;
    it.tail1 = 0;
  }
  it.n0 = it.n_pb0 + __popcll(it.tail0);
  it.n1 = it.n_pb1 + __popcll(it.tail1);
  return it;
}

// Where block k of sub-split g starts and ends, in logical rows of the request.
struct BlockDesc {
  int t0;     // first logical row
  int limit;  // rows at or past this are not keys of this block
  int jb;     // tail block index (tail node 32 jb is the block's first), -1 for prefix blocks
};

__device__ __forceinline__ BlockDesc block_desc(const Item& it, int g, int k) {
  BlockDesc d;
  const int n_pb = sub(g, it.n_pb0, it.n_pb1);
  if (k < n_pb) {
    d.t0 = (sub(g, it.pb_begin0, it.pb_begin1) + k) * 32;
    d.limit = it.rs.prefix_len;
    d.jb = -1;
  } else {
    d.jb = nth_set_bit(sub(g, it.tail0, it.tail1), k - n_pb);
    d.t0 = it.rs.prefix_len + d.jb * 32;
    d.limit = it.rs.prefix_len + it.rs.q_len;
  }
  return d;
}

// Position of block k of sub-split g in the producer's order: in pair mode the two sub-splits
// alternate while both have blocks left.
__device__ __forceinline__ int block_seq(const Item& it, int g, int k) {
  if (!it.pair) return k;
  const int m = min(it.n0, it.n1);
  return k < m ? 2 * k + g : 2 * m + (k - m);
}

template <class Tr>
struct Smem {
  uint32_t base;
  __device__ __forceinline__ uint32_t stage(int s) const {
    return base + Tr::kOffStages + s * Tr::kStageBytes;
  }
  __device__ __forceinline__ uint32_t full(int s) const { return base + Tr::kOffBars + 8 * s; }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return base + Tr::kOffBars + 8 * (Tr::kStages + s);
  }
  __device__ __forceinline__ uint32_t yfull(int w) const {
    return base + Tr::kOffBars + 8 * (2 * Tr::kStages + w);
  }
  __device__ __forceinline__ uint32_t yempty(int w) const {
    return base + Tr::kOffBars + 8 * (2 * Tr::kStages + 8 + w);
  }
  __device__ __forceinline__ uint32_t x(int w) const {
    return base + Tr::kOffX + w * Tr::kExchBytes;
  }
  __device__ __forceinline__ uint32_t y(int w) const {
    return base + Tr::kOffY + w * Tr::kExchBytes;
  }
  __device__ __forceinline__ uint32_t p(int slot) const {
    return base + Tr::kOffP + slot * Tr::kPSlotBytes;
  }
};

// Stage rows are 576 bytes: chunks 0-31 (latent) XOR-swizzled with the row's low three bits,
// chunks 32-35 (rope) with its low two bits. ldmatrix reads one chunk of 8 consecutive rows:
// 36 r + (c ^ (r & 7)) covers the 8 bank groups once (rope chunks: twice, 2 of 18 k-steps).
__device__ __forceinline__ uint32_t stage_offset(int row, int chunk) {
  const int phys = chunk < 32 ? (chunk ^ (row & 7)) : (32 + ((chunk - 32) ^ (row & 3)));
  return row * 576 + phys * 16;
}

__device__ __forceinline__ float4 lds_f4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a));
  return v;
}
__device__ __forceinline__ void sts_f4(uint32_t a, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(a), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w));
}
__device__ __forceinline__ void sts_u32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v));
}

// P rows are 64 bytes (32 keys); the 16-byte chunk index is XOR-swizzled with bits 1-2 of the row
// so that ldmatrix (8 rows, one chunk) and the fragment stores hit 32 distinct banks.
__device__ __forceinline__ uint32_t p_offset(int row, int chunk) {
  return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
}

// ---- producer ------------------------------------------------------------------------------

// The producer warpgroup (128 threads) loads each block: thread pt copies row pt / 4 of the block,
// 16-byte chunks pt % 4 + 4 k (k = 0..8) of the CTA's 576 bytes (chunks 0-31 latent, 32-35 rope),
// with cp.async (zero-filled where the row is not a key: V must be finite where P = 0), and
// cp.async.mbarrier.arrive.noinc makes the stage's full barrier count the thread once its copies
// have landed. (One bulk copy per row half was measured at ~40 ns per copy on the H200: the copy
// engine, not the memory, bounded the kernel; see docs/verify-kernel.md.)
template <typename T, class Tr>
__device__ __forceinline__ void producer(const VerifyKernelParams& kp, const Smem<Tr>& sm,
                                         uint32_t crank, int cluster_id, int num_clusters) {
  const int pt = threadIdx.x - 256, lane = threadIdx.x & 31;
  const int row = pt >> 2, sub = pt & 3;
  const int num_items = kp.hdr->num_items;
  const T* kv = static_cast<const T*>(kp.p.kv_cache);
  int seq = 0;
  for (int item = cluster_id; item < num_items; item += num_clusters) {
    const Item it = decode_item(kp, item, lane);
    const int total = it.n0 + it.n1;
    const int m = min(it.n0, it.n1);
    for (int j = 0; j < total; ++j, ++seq) {
      int g = 0, k = j;
      if (it.pair) {
        if (j < 2 * m) {
          g = j & 1;
          k = j >> 1;
        } else {
          g = it.n0 > it.n1 ? 0 : 1;
          k = m + (j - 2 * m);
        }
      }
      const BlockDesc d = block_desc(it, g, k);
      const int t = d.t0 + row;
      int page = -1;
      if (t < d.limit) {
        const int entry = t >> kp.page_shift;
        if (entry < kp.p.page_table_stride) {
          const int pg =
              __ldg(kp.p.page_table + static_cast<int64_t>(it.b) * kp.p.page_table_stride + entry);
          if (pg >= 0 && pg < kp.p.num_pages)
            page = pg;
          else if (sub == 0)
            record_status(kp.hdr, kStatusPage, it.b, pg, t);  // zero-filled instead of read
        } else if (sub == 0) {
          record_status(kp.hdr, kStatusStride, it.b, t, kp.p.page_table_stride);
        }
      }
      const T* src = kv;  // not read when the copy is a zero fill
      if (page >= 0)
        src +=
            (static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1))) * kHeadDimQK;
      const int bytes = page >= 0 ? 16 : 0;
      const int stage = seq % Tr::kStages;
      if (kp.wait_mode & 1)
        mbar_spin(sm.empty(stage), ((seq / Tr::kStages) & 1) ^ 1);
      else
        mbar_wait(sm.empty(stage), ((seq / Tr::kStages) & 1) ^ 1);
      const uint32_t dst = sm.stage(stage);
#pragma unroll
      for (int c = 0; c < 8; ++c) {  // latent columns [256 c_rank, +256): chunks sub + 4 c
        const int ci = sub + 4 * c;
        cp_async_16(dst + stage_offset(row, ci), src + 256 * crank + 8 * ci, bytes);
      }
      cp_async_16(dst + stage_offset(row, 32 + sub), src + 512 + 32 * crank + 8 * sub,
                  bytes);  // rope
      cp_async_mbar_arrive(sm.full(stage));
    }
  }
}

// ---- compute warps -------------------------------------------------------------------------

template <typename T, class Tr>
__device__ __forceinline__ void compute(const VerifyKernelParams& kp, const Smem<Tr>& sm,
                                        unsigned char* smem, uint32_t crank, int cluster_id,
                                        int num_clusters) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rh = warp >> 2, dh = (warp >> 1) & 1, kh = warp & 1, cq = warp & 3;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int H = kp.p.num_heads;
  const float sc = kp.scale_log2;
  const uint32_t peer = crank ^ 1u;
  float* max_x = reinterpret_cast<float*>(smem + Tr::kOffMax);      // [2][8][16]
  float* alpha_x = reinterpret_cast<float*>(smem + Tr::kOffAlpha);  // [2][64]
  float* epi_l = reinterpret_cast<float*>(smem + Tr::kOffEpiL);     // [8][16]
  float* epi_m = reinterpret_cast<float*>(smem + Tr::kOffEpiM);     // [64]
  const int bar_x = 1 + rh * 2 + kh;                                // dh pair
  const int bar_max = 5 + rh * 2 + dh;                              // kh pair
  const int bar_grp = 9 + rh;                                       // row group
  const int num_items = kp.hdr->num_items;
  int seq_base = 0;  // producer sequence number of this item's first block
  int cnt = 0;       // blocks this warp has processed (exchange slots and Y phases)

  for (int item = cluster_id; item < num_items; item += num_clusters) {
    const Item it = decode_item(kp, item, lane);
    const int g = it.pair ? rh : 0;  // the sub-split this row group computes
    const int nb = sub(g, it.n0, it.n1);
    const RequestSched& rs = it.rs;
    const int rows = rs.q_len * H;
    const int row0 = it.tile * kBlockM;
    const int grp_row0 = it.pair ? 0 : 32 * rh;  // this group's first row within the tile

    // Q fragments: group rows [grp_row0, +32) (two m16 tiles), k-steps [9 dh, 9 dh + 9) of the
    // CTA's 288 columns: k-step kk < 16 is latent column 256 c + 16 kk, else rope 512 + 32 c + 16
    // (kk - 16).
    uint32_t qf[2][9][4];
    {
      const T* q = static_cast<const T*>(kp.p.q);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int ra = grp_row0 + 16 * mt + g8, rb = ra + 8;
        const bool va = row0 + ra < rows, vb = row0 + rb < rows;
        const int64_t ga = static_cast<int64_t>(rs.q_start) * H + row0 + ra;
        const uint32_t* pa = reinterpret_cast<const uint32_t*>(q + ga * kHeadDimQK + q4 * 2);
        const uint32_t* pb = reinterpret_cast<const uint32_t*>(q + (ga + 8) * kHeadDimQK + q4 * 2);
#pragma unroll
        for (int j = 0; j < 9; ++j) {
          const int kk = 9 * dh + j;
          const int col = kk < 16 ? 256 * static_cast<int>(crank) + 16 * kk
                                  : 512 + 32 * static_cast<int>(crank) + 16 * (kk - 16);
          qf[mt][j][0] = va ? __ldg(pa + col / 2) : 0u;
          qf[mt][j][1] = vb ? __ldg(pb + col / 2) : 0u;
          qf[mt][j][2] = va ? __ldg(pa + col / 2 + 4) : 0u;
          qf[mt][j][3] = vb ? __ldg(pb + col / 2 + 4) : 0u;
        }
      }
    }
    // Rows this warp owns for the softmax: group rows 16 dh + g8 and + 8.
    const int own0 = grp_row0 + 16 * dh + g8, own1 = own0 + 8;
    const bool ov0 = row0 + own0 < rows, ov1 = row0 + own1 < rows;
    const uint32_t* mrow0 = reinterpret_cast<const uint32_t*>(
        kp.p.tree_mask +
        static_cast<int64_t>(rs.q_start + (ov0 ? (row0 + own0) / H : 0)) * kp.p.mask_words);
    const uint32_t* mrow1 = reinterpret_cast<const uint32_t*>(
        kp.p.tree_mask +
        static_cast<int64_t>(rs.q_start + (ov1 ? (row0 + own1) / H : 0)) * kp.p.mask_words);

    float o[2][8][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int n = 0; n < 8; ++n) o[a][n][0] = o[a][n][1] = o[a][n][2] = o[a][n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    // Software pipeline over the blocks: iteration i computes the partial scores of block i + 1
    // (and swaps them inside the CTA) while block i's sum is on its way from the peer, then
    // finishes block i (softmax, P V). So the warps hold two stages at once, and the peer
    // exchange of a block has a whole QK^T of the next to arrive in.
    const int mat = lane >> 3;
    // This warp's K rows: keys 16 kh + (mat / 2) * 8 + lane % 8, chunks 2 kk + mat % 2.
    const int krow = 16 * kh + (mat >> 1) * 8 + (lane & 7);
    // Partial scores of one block: 32 rows x 16 keys over this warp's 144 columns.
    auto qk = [&](uint32_t st, float(&acc)[2][2][4]) {
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int n = 0; n < 2; ++n) acc[a][n][0] = acc[a][n][1] = acc[a][n][2] = acc[a][n][3] = 0.f;
#pragma unroll
      for (int j = 0; j < 9; ++j) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(b0, b1, b2, b3, st + stage_offset(krow, 2 * (9 * dh + j) + (mat & 1)));
        if (kp.wait_mode & 64) continue;  // timing ablation only (wrong results)
        mma_16816<T>(acc[0][0], qf[0][j], b0, b1);
        mma_16816<T>(acc[0][1], qf[0][j], b2, b3);
        mma_16816<T>(acc[1][0], qf[1][j], b0, b1);
        mma_16816<T>(acc[1][1], qf[1][j], b2, b3);
      }
    };
    // X, first half: hand m-tile 1 - dh of the partial to the dh sibling. (Selects, not
    // acc[dh]: a register array indexed at run time would go to local memory.)
    auto x_write = [&](const float(&acc)[2][2][4]) {
      const uint32_t xo = sm.x(warp) + lane * 16;
#pragma unroll
      for (int n = 0; n < 2; ++n)
        sts_f4(xo + 512 * n,
               make_float4(dh ? acc[0][n][0] : acc[1][n][0], dh ? acc[0][n][1] : acc[1][n][1],
                           dh ? acc[0][n][2] : acc[1][n][2], dh ? acc[0][n][3] : acc[1][n][3]));
    };
    // X, second half (after the pair's barrier): own m-tile dh plus the sibling's half of it.
    auto x_read = [&](const float(&acc)[2][2][4], float(&x)[2][4]) {
      const uint32_t xi = sm.x(warp ^ 2) + lane * 16;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float4 v = lds_f4(xi + 512 * n);
        x[n][0] = (dh ? acc[1][n][0] : acc[0][n][0]) + v.x;
        x[n][1] = (dh ? acc[1][n][1] : acc[0][n][1]) + v.y;
        x[n][2] = (dh ? acc[1][n][2] : acc[0][n][2]) + v.z;
        x[n][3] = (dh ? acc[1][n][3] : acc[0][n][3]) + v.w;
      }
    };
    // Y: send the CTA's sum to the same warp of the peer, once the peer has read the last one.
    // The waits are CTA-scoped: barrier and data are in this CTA's shared memory, and st.async
    // completes with release semantics on them; an acquire at cluster scope would invalidate L1
    // (CCTL.IVALL) on every block.
    int ycnt = cnt;  // exchanges this warp has made (one per block), the Y barriers' phase
    auto y_send = [&](const float(&x)[2][4]) {
      if (kp.wait_mode & 8) return;  // timing ablation only (wrong results)
      if (kp.wait_mode & 4)
        mbar_spin(sm.yempty(warp), (ycnt & 1) ^ 1);
      else
        mbar_wait(sm.yempty(warp), (ycnt & 1) ^ 1);
      const uint32_t ry = map_to_rank(sm.y(warp) + lane * 16, peer);
      const uint32_t rbar = map_to_rank(sm.yfull(warp), peer);
      st_async_v4(ry, make_float4(x[0][0], x[0][1], x[0][2], x[0][3]), rbar);
      st_async_v4(ry + 512, make_float4(x[1][0], x[1][1], x[1][2], x[1][3]), rbar);
    };

    float acc[2][2][4], x[2][4];
    if (nb > 0) {
      const int seq = seq_base + block_seq(it, g, 0);
      mbar_wait(sm.full(seq % Tr::kStages), (seq / Tr::kStages) & 1);
      qk(sm.stage(seq % Tr::kStages), acc);
      x_write(acc);
      named_barrier(bar_x, 64);
      x_read(acc, x);
      y_send(x);
    }
    for (int i = 0; i < nb; ++i, ++cnt) {
      const int seq = seq_base + block_seq(it, g, i);
      const int stage = seq % Tr::kStages;
      const uint32_t st = sm.stage(stage);
      const BlockDesc d = block_desc(it, g, i);
      const int slot = cnt & 1;
      const bool has_next = i + 1 < nb;

      // ---- block i + 1: partial scores, first half of the X swap ----
      if (has_next) {
        const int seq1 = seq_base + block_seq(it, g, i + 1);
        if (kp.wait_mode & 2)
          mbar_spin(sm.full(seq1 % Tr::kStages), (seq1 / Tr::kStages) & 1);
        else
          mbar_wait(sm.full(seq1 % Tr::kStages), (seq1 / Tr::kStages) & 1);
        qk(sm.stage(seq1 % Tr::kStages), acc);
        // The sibling read the previous X before the last row-group barrier; in the first
        // iteration no such barrier lies between its read (prologue) and this write: add one.
        if (i == 0) named_barrier(bar_x, 64);
        x_write(acc);
      }
      // ---- block i: the peer's sum ----
      float s[2][4];
      if (kp.wait_mode & 8) {  // timing ablation only (wrong results)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = x[n][e];
      } else {
        if (kp.wait_mode & 4)
          mbar_spin(sm.yfull(warp), cnt & 1);
        else
          mbar_wait(sm.yfull(warp), cnt & 1);
        const uint32_t yi = sm.y(warp) + lane * 16;
        const float4 a = lds_f4(yi), c = lds_f4(yi + 512);
        s[0][0] = x[0][0] + a.x;
        s[0][1] = x[0][1] + a.y;
        s[0][2] = x[0][2] + a.z;
        s[0][3] = x[0][3] + a.w;
        s[1][0] = x[1][0] + c.x;
        s[1][1] = x[1][1] + c.y;
        s[1][2] = x[1][2] + c.z;
        s[1][3] = x[1][3] + c.w;
      }
      // ---- block i + 1: second half of the X swap ----
      if (has_next) {
        named_barrier(bar_x, 64);
        x_read(acc, x);
      }
      // ---- mask (tail blocks and the last, partial prefix block) ----
      bool need_mask = d.jb >= 0 || d.limit - d.t0 < 32;
#if TREEMLA_KERNEL_MUTATION == 2
      const bool drop_first =
          d.jb < 0 && i == 0 &&
          sub(g, it.pb_begin0, it.pb_begin1) > 0;  // mutation: the split's first key
      need_mask = need_mask || drop_first;
#endif
      if (need_mask) {
        const int valid = d.limit - d.t0;
        const uint32_t in_range = valid >= 32 ? 0xffffffffu : ((1u << max(valid, 0)) - 1u);
        uint32_t vis0 = in_range, vis1 = in_range;
#if TREEMLA_KERNEL_MUTATION != 1
        if (d.jb >= 0) {
          vis0 &= ov0 ? __ldg(mrow0 + d.jb) : 0u;
          vis1 &= ov1 ? __ldg(mrow1 + d.jb) : 0u;
        }
#endif
#if TREEMLA_KERNEL_MUTATION == 2
        if (drop_first) {
          vis0 &= ~1u;
          vis1 &= ~1u;
        }
#endif
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int c = 16 * kh + 8 * n + 2 * q4;
          if (!((vis0 >> c) & 1u)) s[n][0] = -INFINITY;
          if (!((vis0 >> (c + 1)) & 1u)) s[n][1] = -INFINITY;
          if (!((vis1 >> c) & 1u)) s[n][2] = -INFINITY;
          if (!((vis1 >> (c + 1)) & 1u)) s[n][3] = -INFINITY;
        }
      }
      // ---- online softmax over the 32 keys (two key halves swap their maxima) ----
      {
        float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float* mxs = max_x + slot * 128;
        if (q4 == 0) {
          mxs[warp * 16 + g8] = mx0;
          mxs[warp * 16 + g8 + 8] = mx1;
        }
        named_barrier(bar_max, 64);
        mx0 = fmaxf(fmaxf(mx0, mxs[(warp ^ 1) * 16 + g8]), m0);
        mx1 = fmaxf(fmaxf(mx1, mxs[(warp ^ 1) * 16 + g8 + 8]), m1);
        // Scores stay unscaled until exp2(s * sc - m * sc); a row that has seen nothing keeps
        // max -inf and subtracts 0, so exp2 gives 0, not NaN.
        const float mu0 = mx0 == -INFINITY ? 0.f : mx0 * sc;
        const float mu1 = mx1 == -INFINITY ? 0.f : mx1 * sc;
        const float al0 = fast_exp2(fmaf(m0, sc, -mu0)), al1 = fast_exp2(fmaf(m1, sc, -mu1));
        m0 = mx0;
        m1 = mx1;
        float rs0 = 0.f, rs1 = 0.f;
        const uint32_t pbase = sm.p(slot);
        const int prow0 = 32 * rh + 16 * dh + g8, prow1 = prow0 + 8;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float p0 = fast_exp2(fmaf(s[n][0], sc, -mu0)),
                      p1 = fast_exp2(fmaf(s[n][1], sc, -mu0));
          const float p2 = fast_exp2(fmaf(s[n][2], sc, -mu1)),
                      p3 = fast_exp2(fmaf(s[n][3], sc, -mu1));
          rs0 += p0 + p1;
          rs1 += p2 + p3;
          const int chunk = 2 * kh + n;
          sts_u32(pbase + p_offset(prow0, chunk) + 4 * q4, pack2<T>(p0, p1));
          sts_u32(pbase + p_offset(prow1, chunk) + 4 * q4, pack2<T>(p2, p3));
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
        if (kh == 0 && q4 == 0) {
          alpha_x[slot * 64 + prow0] = al0;
          alpha_x[slot * 64 + prow1] = al1;
        }
      }
      named_barrier(bar_grp, 128);  // the group's P and rescale factors are in shared memory
      // The barrier also completes this warp's reads of Y: re-arm its barrier for the next
      // phase, tell the peer the slot is free, and send the next block's sum.
      if (lane == 0 && !(kp.wait_mode & 8)) {
        mbar_arrive_expect_tx(sm.yfull(warp), Tr::kExchBytes);
        mbar_arrive_remote_relaxed(map_to_rank(sm.yempty(warp), peer));
      }
      ++ycnt;
      if (has_next) y_send(x);

      // ---- O[32 rows, 64 columns] = O * alpha + P V ----
      {
        const float* al = alpha_x + slot * 64 + 32 * rh;
        const float a00 = al[g8], a01 = al[g8 + 8], a10 = al[16 + g8], a11 = al[24 + g8];
        // Once a row's max settles (most of a long prefix) alpha is exactly 1: skip the rescale.
        if (__any_sync(0xffffffffu, a00 != 1.f || a01 != 1.f || a10 != 1.f || a11 != 1.f)) {
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            o[0][n][0] *= a00;
            o[0][n][1] *= a00;
            o[0][n][2] *= a01;
            o[0][n][3] *= a01;
            o[1][n][0] *= a10;
            o[1][n][1] *= a10;
            o[1][n][2] *= a11;
            o[1][n][3] *= a11;
          }
        }
        const uint32_t pbase = sm.p(slot);
        // V rows: keys 16 kk + (mat % 2) * 8 + lane % 8; columns 64 cq + 16 np + (mat / 2) * 8.
        const int vrow = (mat & 1) * 8 + (lane & 7);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          uint32_t pa[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const int prow = 32 * rh + 16 * mt + (lane & 15);
            ldmatrix_x4(pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3],
                        pbase + p_offset(prow, 2 * kk + (lane >> 4)));
          }
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4_trans(b0, b1, b2, b3,
                              st + stage_offset(16 * kk + vrow, 8 * cq + 2 * np + (mat >> 1)));
            if (kp.wait_mode & 32) continue;  // timing ablation only (wrong results)
            mma_16816<T>(o[0][2 * np], pa[0], b0, b1);
            mma_16816<T>(o[0][2 * np + 1], pa[0], b2, b3);
            mma_16816<T>(o[1][2 * np], pa[1], b0, b1);
            mma_16816<T>(o[1][2 * np + 1], pa[1], b2, b3);
          }
        }
      }
      // Free the stage after this thread's last read of it (its keys in the previous iteration or
      // the prologue, its V here). Every thread arrives, not one lane per warp, so that each
      // lane's reads are ordered before the producer's refill (racecheck sees the order only for
      // the thread that arrives). In pair mode only the row group of sub-split g (128 threads)
      // reads the stage: each arrives twice, for the other group's share of the 256.
      mbar_arrive(sm.empty(stage), it.pair ? 2 : 1);
    }
    seq_base += it.n0 + it.n1;

    // ---- epilogue: row sums over both key halves, then O / l and the LSE ----
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (q4 == 0) {
      epi_l[warp * 16 + g8] = l0;
      epi_l[warp * 16 + g8 + 8] = l1;
      if (kh == 0) {
        epi_m[32 * rh + 16 * dh + g8] = m0;
        epi_m[32 * rh + 16 * dh + g8 + 8] = m1;
      }
    }
    named_barrier(bar_grp, 128);
    constexpr float kLn2 = 0.69314718055994530942f;
    const int split = sub(g, it.split0, it.split1);
    const bool final_out = rs.splits == 1;
    const int64_t pslot = rs.part_base + static_cast<int64_t>(split) * rs.tiles + it.tile;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8) {
        const int gr = 16 * mt + 8 * h8 + g8;  // row within the group
        const int rl = grp_row0 + gr;          // row within the tile
        if (row0 + rl >= rows) continue;
        const int ow = rh * 4 + mt * 2;  // the owner warps (kh = 0, 1) of this row
        const float l = epi_l[ow * 16 + 8 * h8 + g8] + epi_l[(ow + 1) * 16 + 8 * h8 + g8];
        const float mrow = epi_m[32 * rh + gr];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse2 = l > 0.f ? mrow * sc + __log2f(l) : -INFINITY;  // log2 domain
        const int64_t grow = static_cast<int64_t>(rs.q_start) * H + row0 + rl;
        if (final_out) {
          T* out = static_cast<T*>(kp.o) + grow * kHeadDimV + 256 * crank + 64 * cq + 2 * q4;
#pragma unroll
          for (int n = 0; n < 8; ++n)
            *reinterpret_cast<uint32_t*>(out + 8 * n) =
                pack2<T>(o[mt][n][2 * h8] * inv, o[mt][n][2 * h8 + 1] * inv);
#if TREEMLA_KERNEL_MUTATION == 3
          if (crank == 0 && cq == 0 && q4 == 0) kp.lse[grow] = lse2;  // mutation: LSE in base 2
#else
          if (crank == 0 && cq == 0 && q4 == 0) kp.lse[grow] = lse2 * kLn2;
#endif
        } else {
          float* po =
              kp.part_o + (pslot * kBlockM + rl) * kHeadDimV + 256 * crank + 64 * cq + 2 * q4;
#pragma unroll
          for (int n = 0; n < 8; ++n)
            *reinterpret_cast<float2*>(po + 8 * n) =
                make_float2(o[mt][n][2 * h8] * inv, o[mt][n][2 * h8 + 1] * inv);
          if (crank == 0 && cq == 0 && q4 == 0) kp.part_lse[pslot * kBlockM + rl] = lse2;
        }
      }
    }
    named_barrier(bar_grp, 128);  // epi_l / epi_m are read before the next item writes them
  }
}

#endif  // __CUDA_ARCH__ >= 900

// The kernel. Launched with a cluster dimension of 2 (verify_api.cu); one CTA pair per cluster.
template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    verify_cluster_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (config_fits_arch<Tr::kSmemBytes>()) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Smem<Tr> sm{smem_u32(smem)};
    const uint32_t crank = cluster_ctarank();
    if (threadIdx.x == 0) {
      for (int s = 0; s < Tr::kStages; ++s) {
        mbar_init(sm.full(s), 128);  // the producer warpgroup's threads, when their copies land
        // Every computing thread that read the stage, after its last read: 256 arrivals of 1, or
        // in pair mode 128 (the row group of its sub-split) of 2.
        mbar_init(sm.empty(s), 256);
      }
      for (int w = 0; w < 8; ++w) {
        mbar_init(sm.yfull(w), 1);
        mbar_init(sm.yempty(w), 1);
      }
      fence_mbar_init();
      // Arm phase 0 of every yfull: one arrival now, completion when the peer's bytes land.
      for (int w = 0; w < 8; ++w) mbar_arrive_expect_tx(sm.yfull(w), Tr::kExchBytes);
    }
    cluster_sync();  // barriers of both CTAs are initialised before anyone touches them
    pdl_wait();      // the schedule (or the previous layer's combine) has completed
    pdl_launch_dependents();
    const int cluster_id = blockIdx.x / 2, num_clusters = gridDim.x / 2;
    if (threadIdx.x >= 256) {  // warpgroup 2 loads the KV blocks
      warpgroup_reg_dealloc<Tr::kProducerRegs>();
      producer<T, Tr>(kp, sm, crank, cluster_id, num_clusters);
    } else {
      warpgroup_reg_alloc<Tr::kComputeRegs>();
      compute<T, Tr>(kp, sm, smem, crank, cluster_id, num_clusters);
    }
    cluster_sync();  // no CTA leaves while its peer may still write into its shared memory
  } else {
    __trap();  // this configuration does not fit this architecture's shared memory
  }
#else
  __trap();  // the cluster family needs sm_90 or newer
#endif
}

}  // namespace treemla::cuda::cluster

namespace treemla::cuda {

template <class Tr>
KernelEntry make_cluster_entry() {
  using T = typename Tr::Element;
  return {reinterpret_cast<const void*>(&cluster::verify_cluster_kernel<T, Tr>),
          Tr::kThreads,
          Tr::kSmemBytes,
          Tr::kClusterSize,
          32,
          kMinCcClusters};
}

}  // namespace treemla::cuda
