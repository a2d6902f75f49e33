// The decode verify family: row tiles of at most 16 rows (q_len * H <= 16, e.g. q_len = 1 with
// H <= 16), mma.sync m16n8k16 + ldmatrix on 4 compute warps, the KV rows copied by two producer
// warps into an mbarrier ring of 16-key stages, sm_80 .. sm_120. The plan picks it when the
// caller bounds every request's q_len (VerifyLimits::max_q_len) so that q_len * H <= 16; the
// schedule then rejects longer requests on the device (kStatusQLen).
//
// Why a kernel of its own: at q_len = 1 the call only streams the KV cache (16 rows x 2,176 FLOP
// per key), so what matters is how many bytes each SM keeps in flight and that no compute warp
// waits on, or issues, a copy. The CTA is one 16-row tile (O: 16 x 512 fp32 = 64 registers a
// compute thread), so two CTAs share an SM on sm_90 / sm_100, each with three 16-key stages in
// flight while it computes the fourth (docs/verify-kernel.md, "The decode family", has the
// budget and the measurements).
//
// Grid: plan.num_ctas persistent CTAs; CTA c takes work items c, c + grid, ... of the schedule's
// list (one item: a request's 16-row tile and one split of its prefix; the last split also
// attends the tree tail). A schedule block (32 keys) is two of this kernel's 16-key blocks (but for
// the tail's last one when its second half holds no key: half_item leaves that half out). Rows past
// the tile's last row compute on zero Q and are not written.
//
// Producers (warps 4 and 5, Tr::kProducerWarps): per block, once the 128 compute threads have
// released the block's stage (empty[s]), producer warp p copies rows [8 p, 8 p + 8) of the block
// (rows padded by 32 bytes: 32-byte-aligned copies), the page-table entries loaded a block ahead,
// so each warp issues half of a block's copies. sm_90 and newer: lane r < 8 copies its row with
// one bulk copy of its 1,152 bytes, counted on full[s] with its bytes (a row that is not a key is
// zero-filled). sm_80 .. sm_89: 16-byte cp.async by the 32 lanes, 512 contiguous bytes of a row an
// instruction, and one counted arrival a lane (cp.async.mbarrier.arrive).
// VerifyKernelParams::decode_cpasync carries the choice (verify_api.cu; TREEMLA_DECODE_COPY
// forces either, a measurement and test switch). The producers run ahead
// across items (the ring's parities come from a per-CTA block count every warp keeps).
// Compute warp w, per block: a partial S[16 x 16] = Q[:, C] K^T over the 144 columns
// C = [144 w, +144) (Q fragments in registers, 36 a thread) into a double-buffered shared buffer
// (fp32); after a barrier of the compute warps every warp adds the four partials in the same
// order, so all warps hold the same S bit for bit and run the same online softmax (same m, same
// l); P stays in registers as the A operand of O[:, 128 w .. +128) = O alpha + P V[:, 128 w ..)
// (V by ldmatrix.trans out of the same stage); then each compute thread arrives on empty[s].
//
// Output: an item that covers its tile's whole key range writes O (p.dtype) and LSE (ln);
// otherwise a normalized fp32 partial and a log2-domain LSE, merged by the combine kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/async.cuh"
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

template <class Tr>
struct Smem {
  unsigned char* ptr;
  uint32_t base;
  __device__ uint32_t stage(int s) const { return base + Tr::kOffStages + s * Tr::kStageBytes; }
  __device__ float* x(int par) const {
    return reinterpret_cast<float*>(ptr + Tr::kOffX + par * Tr::kXBytes);
  }
  __device__ uint32_t full(int s) const { return base + Tr::kOffBars + 8 * s; }
  __device__ uint32_t empty(int s) const { return base + Tr::kOffBars + 8 * (Tr::kStages + s); }
};

// Byte offset in a stage of columns [col, col + 8) of row r.
template <class Tr>
__device__ __forceinline__ uint32_t stage_offset(int r, int col) {
  return (r * Tr::kRowStride + col) * 2;
}

// Whether this CTA's producers use bulk copies (sm_90 and newer, unless the measurement switch
// asks for cp.async: kp.decode_cpasync).
__device__ __forceinline__ bool use_bulk(const VerifyKernelParams& kp) {
#if __CUDA_ARCH__ >= 900
  return kp.decode_cpasync == 0;
#else
  (void)kp;
  return false;
#endif
}

// Whether an item's tile has more rows than this kernel's tile (the schedule admits only
// requests with q_len <= limits.max_q_len, and the plan picks this family only when
// max_q_len * H <= 16, so this is a device-side check that never fires in a valid call).
__device__ __forceinline__ bool tile_too_long(const VerifyKernelParams& kp, const HalfItem& it) {
  return kp.sched[it.b].q_len * kp.p.num_heads - it.tile * kBlockM > kDecodeRows;
}

// The page-table entry of row r of block h of an item (-1 past the keys or past the page-table
// row).
__device__ __forceinline__ int row_entry(const VerifyKernelParams& kp, const HalfItem& it, int h,
                                         int r) {
  const KeyBlock d = half_block(kp, it, h);
  const int t = d.t0 + 16 * (h & 1) + r;
  const int entry = t >> kp.page_shift;
  if (t >= d.limit || entry >= kp.p.page_table_stride) return -1;
  return __ldg(kp.p.page_table + static_cast<int64_t>(it.b) * kp.p.page_table_stride + entry);
}
// Row r of block h: its row in the cache (-1: zero-filled, the row is not a key or its page is
// bad), from its page-table entry `page` (row_entry). A lane with `record` set reports a bad page
// index or a row past the page-table row (one lane a row).
__device__ __forceinline__ int64_t row_source(const VerifyKernelParams& kp, const HalfItem& it,
                                              int h, int r, int page, bool record) {
  const KeyBlock d = half_block(kp, it, h);
  const int t = d.t0 + 16 * (h & 1) + r;
  if (t >= d.limit) return -1;
  if ((t >> kp.page_shift) >= kp.p.page_table_stride) {
    if (record) record_status(kp.hdr, kStatusStride, it.b, t, kp.p.page_table_stride);
    return -1;  // row not mapped
  }
  if (page < 0 || page >= kp.p.num_pages) {
    if (record) record_status(kp.hdr, kStatusPage, it.b, page, t);
    return -1;  // zero-filled instead of read
  }
  return static_cast<int64_t>(page) * kp.p.page_size + (t & (kp.p.page_size - 1));
}

// Producer warp pw: rows [pw kProducerRows, +kProducerRows) of every block of this CTA's items
// into the ring. Lane l < kProducerRows owns row pw kProducerRows + l (its page-table entry, its
// bulk copy); the other lanes shadow row l % kProducerRows and issue nothing of their own but
// their share of the cp.async chunks.
template <typename T, class Tr>
__device__ void producer_role(const VerifyKernelParams& kp, const Smem<Tr>& sm, int pw) {
  constexpr int kRows = Tr::kProducerRows;
  const int lane = threadIdx.x & 31;
  const int row0 = pw * kRows;
  const int my_row = row0 + lane % kRows;
  const bool owner = lane < kRows;
  const T* kv = static_cast<const T*>(kp.p.kv_cache);
  const bool bulk = use_bulk(kp);
  uint32_t blk = 0;  // 16-key blocks this CTA has run, across items (the ring's position)
  WorkItem w;
  for (int item = blockIdx.x; fetch_item(kp, item, w); item += gridDim.x) {
    const HalfItem it = half_item(kp, w, lane, kDecodeRows);
    if (tile_too_long(kp, it)) continue;
    int page = it.n_blocks > 0 ? row_entry(kp, it, 0, my_row) : -1;
    for (int h = 0; h < it.n_blocks; ++h, ++blk) {
      const int st = blk % Tr::kStages;
      const int64_t src = row_source(kp, it, h, my_row, page, owner);
      if (h + 1 < it.n_blocks) page = row_entry(kp, it, h + 1, my_row);  // lands during the wait
      mbar_wait(sm.empty(st), ((blk / Tr::kStages) & 1) ^ 1);
      const uint32_t dst = sm.stage(st);
      if (bulk) {
#if __CUDA_ARCH__ >= 900
        if (owner) {
          const uint32_t drow = dst + stage_offset<Tr>(my_row, 0);
          if (src >= 0) {
            mbar_arrive_expect_tx(sm.full(st), kHeadDimQK * 2);
            bulk_copy_g2s(drow, kv + src * kHeadDimQK, kHeadDimQK * 2, sm.full(st));
          } else {
            for (int i = 0; i < kHeadDimQK * 2 / 16; ++i)
              asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(drow + 16 * i), "r"(0)
                           : "memory");
            fence_proxy_async_smem();  // before a later bulk copy into the same bytes
            mbar_arrive(sm.full(st));
          }
        }
#endif
      } else {
        // Row row0 + r: 16-byte chunks lane, lane + 32 and (lanes < 8) lane + 64 of its 72.
#pragma unroll 4
        for (int r = 0; r < kRows; ++r) {
          const long long row = __shfl_sync(0xffffffffu, static_cast<long long>(src), r);
          const int bytes = row >= 0 ? 16 : 0;
          const T* s = kv + (row >= 0 ? row : 0) * kHeadDimQK + lane * 8;
          const uint32_t d = dst + stage_offset<Tr>(row0 + r, lane * 8);
          cp_async_16(d, s, bytes);
          cp_async_16(d + 512, s + 256, bytes);
          if (lane < 8) cp_async_16(d + 1024, s + 512, bytes);
        }
        cp_async_mbar_arrive(sm.full(st));
      }
    }
  }
  if (!bulk) cp_async_wait<0>();
}

// The compute warps: S, softmax and P V of every block, and each item's output.
template <typename T, class Tr>
__device__ void compute_role(const VerifyKernelParams& kp, const Smem<Tr>& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q4 = lane & 3, mat = lane >> 3;
  const int H = kp.p.num_heads;
  const float sc = kp.scale_log2;
  // K fragments, one k-step (16 columns) a load: keys 8 (mat >> 1) + lane % 8, columns
  // 144 w + 8 (mat & 1) + 16 ks. V fragments (ldmatrix.trans): keys 8 (mat & 1) + lane % 8,
  // columns kOCols w + 8 (mat >> 1) + 16 np.
  uint32_t k_off[9], v_off[Tr::kOTiles / 2];
#pragma unroll
  for (int ks = 0; ks < 9; ++ks)
    k_off[ks] = stage_offset<Tr>(8 * (mat >> 1) + (lane & 7), 144 * warp + 8 * (mat & 1) + 16 * ks);
#pragma unroll
  for (int np = 0; np < Tr::kOTiles / 2; ++np)
    v_off[np] =
        stage_offset<Tr>(8 * (mat & 1) + (lane & 7), Tr::kOCols * warp + 8 * (mat >> 1) + 16 * np);
  float* const x_own = sm.x(0) + warp * kDecodeRows * Tr::kXStride;  // this warp's partial

  constexpr int kOT = Tr::kOTiles;
  uint32_t blk = 0;
  WorkItem w;
  for (int item = blockIdx.x; fetch_item(kp, item, w); item += gridDim.x) {
    const HalfItem it = half_item(kp, w, lane, kDecodeRows);
    const RequestSched& rs = kp.sched[it.b];
    if (tile_too_long(kp, it)) {
      if (threadIdx.x == 0) record_status(kp.hdr, kStatusQLen, it.b, rs.q_len, kDecodeRows / H);
      continue;
    }
    const int row0 = it.tile * kBlockM;
    const bool v0 = g < it.rows, v1 = g + 8 < it.rows;
    const int64_t grow0 = static_cast<int64_t>(rs.q_start) * H + row0 + g;  // folded global row

    // A fragments of Q for this warp's 144 columns [144 w, 144 w + 144): 9 k-steps.
    uint32_t qf[9][4];
    {
      const T* q = static_cast<const T*>(kp.p.q) + grow0 * kHeadDimQK + 144 * warp + q4 * 2;
      const uint32_t* q0 = reinterpret_cast<const uint32_t*>(q);
      const uint32_t* q1 = reinterpret_cast<const uint32_t*>(q + 8 * kHeadDimQK);
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

    float o[kOT][4];
#pragma unroll
    for (int i = 0; i < kOT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int h = 0; h < it.n_blocks; ++h, ++blk) {
      const int st = blk % Tr::kStages;
      const uint32_t stage = sm.stage(st);
      mbar_wait(sm.full(st), (blk / Tr::kStages) & 1);

      // ---- partial S over this warp's 144 columns, all 16 keys; even / odd k-steps apart ----
      float sa[2][4], sb[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        sa[nt][0] = sa[nt][1] = sa[nt][2] = sa[nt][3] = sb[nt][0] = sb[nt][1] = sb[nt][2] =
            sb[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < 9; ++ks) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(b0, b1, b2, b3, stage + k_off[ks]);
        mma_16816<T>((ks & 1) ? sb[0] : sa[0], qf[ks], b0, b1);
        mma_16816<T>((ks & 1) ? sb[1] : sa[1], qf[ks], b2, b3);
      }
      const int xpar = (blk & 1) * (Tr::kXBytes / 4);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float* xn = x_own + xpar + nt * 8 + q4 * 2;
        *reinterpret_cast<float2*>(xn + g * Tr::kXStride) =
            make_float2(sa[nt][0] + sb[nt][0], sa[nt][1] + sb[nt][1]);
        *reinterpret_cast<float2*>(xn + (g + 8) * Tr::kXStride) =
            make_float2(sa[nt][2] + sb[nt][2], sa[nt][3] + sb[nt][3]);
      }
      // Every warp's partial written. The buffer of this parity was last read in block h - 2,
      // before every compute warp arrived here in block h - 1.
      named_barrier(1, Tr::kComputeThreads);
      // ---- S = the sum of the four partials, in the same order in every warp (bit-identical) ----
      const float* x = sm.x(blk & 1);
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = nt * 8 + q4 * 2;
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float* xw = x + w * kDecodeRows * Tr::kXStride;
          const float2 a = *reinterpret_cast<const float2*>(xw + g * Tr::kXStride + col);
          const float2 c = *reinterpret_cast<const float2*>(xw + (g + 8) * Tr::kXStride + col);
          s[nt][0] += a.x;
          s[nt][1] += a.y;
          s[nt][2] += c.x;
          s[nt][3] += c.y;
        }
      }

      // ---- mask: tail blocks and the last, partial prefix block ----
      const KeyBlock d = half_block(kp, it, h);
      const int hh = h & 1;
#if TREEMLA_KERNEL_MUTATION == 1
      const int mask_jb = -1;  // mutation: every node sees every tail row
#else
      const int mask_jb = d.jb;
#endif
      if (d.jb >= 0 || d.limit - d.t0 - 16 * hh < Tr::kBlockN)
        mask_block<2>(s, d.limit - d.t0, mask_jb, mrow0, mrow1, v0, v1, 16 * hh, q4);
#if TREEMLA_KERNEL_MUTATION == 2
      if (h == 0 && d.jb < 0 && it.pb_begin > 0 &&
          q4 == 0)  // mutation: the split's first key dropped
        s[0][0] = s[0][2] = -INFINITY;
#endif

      // ---- online softmax (every warp the same) ----
      float alpha0, alpha1;
      online_softmax_step<2>(s, sc, m0, m1, l0, l1, alpha0, alpha1);
      rescale_rows<kOT>(o, alpha0, alpha1);

      // ---- O[:, kOCols warp ..) += P V; P from registers (S's C layout is P's A layout) ----
      uint32_t a[4];
      a[0] = pack2<T>(s[0][0], s[0][1]);
      a[1] = pack2<T>(s[0][2], s[0][3]);
      a[2] = pack2<T>(s[1][0], s[1][1]);
      a[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
      for (int np = 0; np < kOT / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(b0, b1, b2, b3, stage + v_off[np]);
        mma_16816<T>(o[2 * np], a, b0, b1);
        mma_16816<T>(o[2 * np + 1], a, b2, b3);
      }
      mbar_arrive(sm.empty(st));  // this thread is done with the stage
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

    // ---- epilogue: warp w writes output columns [kOCols w, kOCols w + kOCols) ----
    const TileRows tr{g, grow0, v0, v1, warp == 0 && q4 == 0};
    write_tile_rows<T, kOT>(kp, it.slot, o, m0, m1, l0, l1, tr, Tr::kOCols * warp, q4);
  }
}

#endif  // __CUDA_ARCH__ >= 800

template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kCtasPerSm)
    decode_main_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (config_fits_arch<Tr::kSmemBytes>()) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Smem<Tr> sm{smem, smem_u32(smem)};
    if (threadIdx.x == 0) {
      for (int s = 0; s < Tr::kStages; ++s) {
        // Bulk copies: one arrival a row (with its bytes); cp.async: one a producer lane.
        mbar_init(sm.full(s), use_bulk(kp) ? Tr::kBlockN : 32 * Tr::kProducerWarps);
        mbar_init(sm.empty(s), Tr::kComputeThreads);  // every compute thread, after reading
      }
    }
    __syncthreads();
    pdl_wait();  // the schedule (or the previous layer's combine) has completed
    pdl_launch_dependents();
    if (threadIdx.x < Tr::kComputeThreads)
      compute_role<T, Tr>(kp, sm);
    else
      producer_role<T, Tr>(kp, sm, (threadIdx.x - Tr::kComputeThreads) >> 5);
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
