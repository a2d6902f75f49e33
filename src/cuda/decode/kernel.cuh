// The decode verify family: row tiles of at most 16 rows (q_len * H <= 16, e.g. q_len = 1 with
// H <= 16), mma.sync m16n8k16 + ldmatrix + cp.async, sm_80 .. sm_120. The plan picks it when the
// caller bounds every request's q_len (VerifyLimits::max_q_len) so that q_len * H <= 16; the
// schedule then rejects longer requests on the device (kStatusQLen).
//
// Why a kernel of its own: at q_len = 1 the call only streams the KV cache (16 rows x 2,176 FLOP
// per key), so what matters is how fast each SM can take in bytes. The 64-row families hold a
// whole SM per CTA (O and Q fill the register file). This kernel's CTA is one 16-row tile on 8
// warps (O: 16 x 512 fp32 = 32 registers a thread), so two CTAs share an SM on sm_90 / sm_100
// (docs/verify-kernel.md, "The decode family", has the budget and the measurements).
//
// Grid: plan.num_ctas persistent CTAs; CTA c takes work items c, c + grid, ... of the schedule's
// list (one item: a request's 16-row tile and one split of its prefix; the last split also
// attends the tree tail). Rows past the tile's last row compute on zero Q and are not written.
//
// Per 32-key KV block, warp w = 4 kg + dq:
//   a partial S[16 x 16] = Q[:, C] K[keys, C]^T over the 144 columns C = [144 dq, 144 dq + 144) of
//   the 576 (Q fragments in registers, 36 a thread) for the keys [16 kg, 16 kg + 16), written to
//   shared memory (fp32); after a barrier every warp adds the four column groups' partials of all
//   32 keys in the same order, so all warps hold the same S bit for bit and run the same online
//   softmax (same m, same l); P stays in registers as the A operand of
//   O[:, 64 w .. 64 w + 64) = O alpha + P V[:, 64 w ..) (V by ldmatrix.trans out of the same KV
//   block). Two barriers per block: the partials, and the top of the loop (the stage ring, the
//   partial buffer and the page ring are free again).
//
// Output: an item that covers its tile's whole key range writes O (p.dtype) and LSE (ln);
// otherwise a normalized fp32 partial and a log2-domain LSE, merged by the combine kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/common/mma_rows.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/decode/traits.h"
#include "cuda/dispatch.h"

// Deliberately broken builds for the test checks (docs/testing.md, "Kernel mutations"); 0 in
// every normal build: 1 tail mask ignored, 2 the first key of every split after the first
// dropped, 3 the LSE written in base 2 (common/mma_rows.cuh).
#ifndef TREEMLA_KERNEL_MUTATION
#define TREEMLA_KERNEL_MUTATION 0
#endif

namespace treemla::cuda::decode {

// The page-table entries of a block's 32 rows are copied into a ring in shared memory with
// 4-byte cp.async, kStages - 1 blocks before the block's KV copies are issued and in the same
// cp.async group as an earlier block's KV: the wait that makes that block's KV visible also
// makes these entries visible, and no thread waits on a dependent global load before it can
// issue a copy. (Loaded one block ahead into registers instead, each iteration waited out the
// page-table load's latency under full HBM traffic, ~2 us.)
// Thread t < 32 copies the entry of row t of block `d`; rows past the keys or past the
// page-table row copy nothing (load_block checks them again and does not read the slot).
__device__ __forceinline__ void load_pages(const VerifyKernelParams& kp, int b, const KeyBlock& d,
                                           int* slot) {
  const int r = threadIdx.x;
  if (r < 32) {
    const int t = d.t0 + r;
    const int entry = t >> kp.page_shift;
    if (t < d.limit && entry < kp.p.page_table_stride) {
      const int* src = kp.p.page_table + static_cast<int64_t>(b) * kp.p.page_table_stride + entry;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(slot + r)),
                   "l"(src));
    }
  }
}

// Thread t copies row t / kRowThreads of block `d`, 16-byte chunks t % kRowThreads,
// t % kRowThreads + kRowThreads, ... (kRowChunks of them),
// with the row's page from the ring slot `pages` (landed and visible: see load_pages); rows that
// are not keys are zero-filled. Bad page indices and rows past the page-table row are recorded
// and zero-filled, never read.
template <typename T, class Tr>
__device__ __forceinline__ void load_block(const VerifyKernelParams& kp, int b, T* dst,
                                           const KeyBlock& d, const int* pages) {
  const int r = threadIdx.x / Tr::kRowThreads, sub = threadIdx.x % Tr::kRowThreads;
  const int t = d.t0 + r;
  const T* src = static_cast<const T*>(kp.p.kv_cache);
  int bytes = 0;
  if (t < d.limit) {
    if ((t >> kp.page_shift) >= kp.p.page_table_stride) {
      record_status(kp.hdr, kStatusStride, b, t, kp.p.page_table_stride);  // row not mapped
    } else {
      const int page = pages[r];
      if (page >= 0 && page < kp.p.num_pages) {
        src += (static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1))) *
                   kHeadDimQK +
               sub * 8;
        bytes = 16;
      } else {
        record_status(kp.hdr, kStatusPage, b, page, t);  // zero-filled instead of read
      }
    }
  }
  const uint32_t s0 = smem_u32(dst + r * Tr::kRowStride + sub * 8);
  constexpr int kStep = Tr::kRowThreads * 8;  // elements between a thread's chunks
#pragma unroll
  for (int i = 0; i < Tr::kRowChunks; ++i)
    cp_async_16(s0 + i * kStep * 2, bytes ? src + i * kStep : src, bytes);
}

template <typename T, class Tr>
__device__ void decode_item(const VerifyKernelParams& kp, unsigned char* smem, int b, int split,
                            int tile) {
  constexpr int kStages = Tr::kStages;
  constexpr int kStageElems = Tr::kBlockN * Tr::kRowStride;
  T* sKV = reinterpret_cast<T*>(smem);
  float* sX = reinterpret_cast<float*>(smem + Tr::kKVBytes);  // [4 warps][16][kXStride]
  int* sPages = reinterpret_cast<int*>(smem + Tr::kKVBytes + Tr::kXBytes);  // [slots][32]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q4 = lane & 3;
  const int dq = warp & 3, kg = warp >> 2;  // column group of S, key group of S

  const RequestSched rs = kp.sched[b];
  const int H = kp.p.num_heads;
  const int row0 = tile * kBlockM;
  const int rows = min(rs.q_len * H - row0, kDecodeRows);  // rows of this tile

  int pb_begin, pb_end;
  split_range(rs, split, pb_begin, pb_end);
  const int n_pb = max(0, pb_end - pb_begin);
  const uint64_t tail_bits = split_has_tail(kp, rs, split) ? tile_tail_bits(kp, rs, tile, lane) : 0;
  const int n_blocks = n_pb + __popcll(tail_bits);
  auto block = [&](int it) {
    return key_block_at(it, pb_begin, n_pb, tail_bits, rs.prefix_len, rs.q_len);
  };

  // Prologue: the page-table entries of blocks 0 .. kStages - 2 (waited for here), then one
  // cp.async group per block s < kStages - 1: its KV rows and the entries of block
  // s + kStages - 1. Block j's entries are in the group of block j - (kStages - 1) from then on.
  auto ring = [&](int j) { return sPages + (j % Tr::kPageSlots) * 32; };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < n_blocks) load_pages(kp, b, block(s), ring(s));
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_blocks) load_block<T, Tr>(kp, b, sKV + s * kStageElems, block(s), ring(s));
    if (s + kStages - 1 < n_blocks)
      load_pages(kp, b, block(s + kStages - 1), ring(s + kStages - 1));
    cp_async_commit();
  }

  // This thread's two rows, g and g + 8.
  const bool v0 = g < rows, v1 = g + 8 < rows;
  const int64_t grow0 = static_cast<int64_t>(rs.q_start) * H + row0 + g;  // folded global row
  const int64_t grow1 = grow0 + 8;

  // A fragments of Q for this warp's 144 columns [144 dq, 144 dq + 144): 9 k-steps.
  uint32_t qf[9][4];
  {
    const T* q = static_cast<const T*>(kp.p.q);
    const int c0 = 144 * dq + q4 * 2;
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(q + grow0 * kHeadDimQK + c0);
    const uint32_t* q1 = reinterpret_cast<const uint32_t*>(q + grow1 * kHeadDimQK + c0);
#pragma unroll
    for (int ks = 0; ks < 9; ++ks) {
      qf[ks][0] = v0 ? __ldg(q0 + ks * 8) : 0u;
      qf[ks][1] = v1 ? __ldg(q1 + ks * 8) : 0u;
      qf[ks][2] = v0 ? __ldg(q0 + ks * 8 + 4) : 0u;
      qf[ks][3] = v1 ? __ldg(q1 + ks * 8 + 4) : 0u;
    }
  }
  const int node0 = v0 ? (row0 + g) / H : 0, node1 = v1 ? (row0 + g + 8) / H : 0;
  const uint32_t* mrow0 = reinterpret_cast<const uint32_t*>(
      kp.p.tree_mask + static_cast<int64_t>(rs.q_start + node0) * kp.p.mask_words);
  const uint32_t* mrow1 = reinterpret_cast<const uint32_t*>(
      kp.p.tree_mask + static_cast<int64_t>(rs.q_start + node1) * kp.p.mask_words);

  constexpr int kQT = Tr::kQKTiles, kOT = Tr::kOTiles;
  float o[kOT][4];
#pragma unroll
  for (int i = 0; i < kOT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sc = kp.scale_log2;

  const int mat = lane >> 3;
  // K fragments: keys (mat >> 1) * 8 + lane % 8 of a 16-key pair of this warp's key group,
  // columns 144 dq + (mat & 1) * 8.
  const uint32_t k_off =
      smem_u32(sKV + (kg * 8 * kQT + (mat >> 1) * 8 + (lane & 7)) * Tr::kRowStride + 144 * dq +
               (mat & 1) * 8);
  // V fragments (ldmatrix.trans) of this warp's output columns.
  const uint32_t v_off = smem_u32(sKV + ((mat & 1) * 8 + (lane & 7)) * Tr::kRowStride +
                                  Tr::kOCols * warp + (mat >> 1) * 8);
  float* my_x = sX + dq * kDecodeRows * Tr::kXStride + kg * 8 * kQT;

  for (int it = 0; it < n_blocks; ++it) {
    cp_async_wait<kStages - 2>();
    // Block `it` and the page-table entries of block it + kStages - 1 visible; every warp is
    // done with block it - 1 (its stage, sX, its ring slot).
    __syncthreads();
    {
      const int nxt = it + kStages - 1;
      if (nxt < n_blocks)
        load_block<T, Tr>(kp, b, sKV + (nxt % kStages) * kStageElems, block(nxt), ring(nxt));
      if (nxt + kStages - 1 < n_blocks)
        load_pages(kp, b, block(nxt + kStages - 1), ring(nxt + kStages - 1));
      cp_async_commit();  // always, so the wait count above stays right
    }
    const uint32_t stage = (it % kStages) * kStageElems * 2;
    const KeyBlock d = block(it);

    // ---- partial S over this warp's 144 columns, its key group's keys ----
    // Two accumulator sets (even and odd k-steps): twice the independent mma chains.
    float s[4][4], s2[kQT][4];
#pragma unroll
    for (int i = 0; i < kQT; ++i)
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = s2[i][0] = s2[i][1] = s2[i][2] = s2[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 9; ++ks) {
#pragma unroll
      for (int np = 0; np < kQT / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(b0, b1, b2, b3, k_off + stage + (np * 16 * Tr::kRowStride + ks * 16) * 2);
        if (ks & 1) {
          mma_16816<T>(s2[2 * np], qf[ks], b0, b1);
          mma_16816<T>(s2[2 * np + 1], qf[ks], b2, b3);
        } else {
          mma_16816<T>(s[2 * np], qf[ks], b0, b1);
          mma_16816<T>(s[2 * np + 1], qf[ks], b2, b3);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt) {
      const int col = nt * 8 + q4 * 2;
      *reinterpret_cast<float2*>(my_x + g * Tr::kXStride + col) =
          make_float2(s[nt][0] + s2[nt][0], s[nt][1] + s2[nt][1]);
      *reinterpret_cast<float2*>(my_x + (g + 8) * Tr::kXStride + col) =
          make_float2(s[nt][2] + s2[nt][2], s[nt][3] + s2[nt][3]);
    }
    __syncthreads();  // the four partials of S written
    // ---- S = the sum of the four partials, in the same order in every warp (bit-identical) ----
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int col = nt * 8 + q4 * 2;
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float* x = sX + w * kDecodeRows * Tr::kXStride;
        const float2 a = *reinterpret_cast<const float2*>(x + g * Tr::kXStride + col);
        const float2 c = *reinterpret_cast<const float2*>(x + (g + 8) * Tr::kXStride + col);
        s[nt][0] += a.x;
        s[nt][1] += a.y;
        s[nt][2] += c.x;
        s[nt][3] += c.y;
      }
    }

    // ---- mask: tail blocks and the last, partial prefix block ----
#if TREEMLA_KERNEL_MUTATION == 1
    const int mask_jb = -1;  // mutation: every node sees every tail row
#else
    const int mask_jb = d.jb;
#endif
    if (d.jb >= 0 || d.limit - d.t0 < Tr::kBlockN)
      mask_block<4>(s, d.limit - d.t0, mask_jb, mrow0, mrow1, v0, v1, 0, q4);
#if TREEMLA_KERNEL_MUTATION == 2
    if (it == 0 && d.jb < 0 && split > 0 && q4 == 0)  // mutation: the split's first key dropped
      s[0][0] = s[0][2] = -INFINITY;
#endif

    // ---- online softmax (every warp the same) ----
    float alpha0, alpha1;
    online_softmax_step<4>(s, sc, m0, m1, l0, l1, alpha0, alpha1);
    rescale_rows<kOT>(o, alpha0, alpha1);

    // ---- O[:, kOCols warp ..) += P V; P from registers (S's C layout is P's A layout) ----
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t a[4];
      a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < kOT / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(b0, b1, b2, b3, v_off + stage + (kk * 16 * Tr::kRowStride + np * 16) * 2);
        mma_16816<T>(o[2 * np], a, b0, b1);
        mma_16816<T>(o[2 * np + 1], a, b2, b3);
      }
    }
  }
  cp_async_wait<0>();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

  // ---- epilogue: warp w writes output columns [kOCols w, kOCols w + kOCols) ----
  const TileRows tr{g, grow0, v0, v1, warp == 0 && q4 == 0};
  write_tile_rows<T, kOT>(kp, rs, split, tile, o, m0, m1, l0, l1, tr, Tr::kOCols * warp, q4);
}

template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kCtasPerSm)
    decode_main_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (config_fits_arch<Tr::kSmemBytes>()) {
    extern __shared__ __align__(128) unsigned char smem[];
    pdl_wait();  // the schedule (or the previous layer's combine) has completed
    pdl_launch_dependents();
    const int num_items = kp.hdr->num_items;
    for (int item = blockIdx.x; item < num_items; item += gridDim.x) {
      const ItemPos pos = locate_item(kp, item);
      const RequestSched& rs = kp.sched[pos.b];
      // The schedule admits only requests with q_len <= limits.max_q_len, and the plan picks
      // this family only when max_q_len * H <= 16; a longer tile cannot get here.
      if (rs.q_len * kp.p.num_heads - pos.tile * kBlockM > kDecodeRows) {
        if (threadIdx.x == 0)
          record_status(kp.hdr, kStatusQLen, pos.b, rs.q_len, kDecodeRows / kp.p.num_heads);
        continue;
      }
      decode_item<T, Tr>(kp, smem, pos.b, pos.index, pos.tile);
      __syncthreads();  // the next item's prologue refills the stages
    }
  } else {
    __trap();  // this tile configuration does not fit this architecture's shared memory
  }
#else
  __trap();  // treemla needs sm_80 or newer
#endif
}

}  // namespace treemla::cuda::decode

namespace treemla::cuda {

template <class Tr>
KernelEntry make_decode_entry() {
  using T = typename Tr::Element;
  KernelEntry e{reinterpret_cast<const void*>(&decode::decode_main_kernel<T, Tr>),
                Tr::kThreads,
                Tr::kSmemBytes,
                1,
                0,
                kMinCcMmaSync};
  e.max_tile_rows = kDecodeRows;
  return e;
}

}  // namespace treemla::cuda
