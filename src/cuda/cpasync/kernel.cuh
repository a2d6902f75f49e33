// The cpasync verify family: mma.sync m16n8k16 + ldmatrix + cp.async, sm_80 .. sm_120. The plan
// picks it where the cluster family cannot run (sm_80, sm_86, sm_89) or when asked for it.
//
// Grid: a persistent grid (plan.num_ctas CTAs of 256 threads). Each CTA takes work items from
// a counter in the workspace. Items are ordered (request, split, tile) so that the CTAs running
// at the same time read the same KV range for different row tiles: the range is fetched from
// HBM once and served to the other tiles from L2.
//
// A work item owns one row tile -- kBlockM = 64 consecutive folded rows of one request, where
// folded row r is (tree node r / H, head r % H), exactly the memory order of q, o and lse --
// and one split of the request's prefix (a range of 32-row KV blocks, see schedule.cu). The last
// split of a tile also attends the tree tail: the 32-row blocks of tail nodes that at least one row
// of the tile can see (ancestor bitmask), masked per row.
//
// Warps: warp w owns rows 16 * (w / 2) .. +15 of the tile and "half" h = w % 2.
//   S = Q K^T: each warp keeps its rows' Q columns [288 h, 288 h + 288) in registers (72 regs)
//     and computes a partial S over that half of the 576 columns. The two warps of a row group
//     swap partials through shared memory (one 64-thread named barrier) and add them, so both
//     hold the same full S (float addition is commutative, so bit-identical), run the same
//     online softmax and keep P in registers as the A operand of the next product.
//   O += P V: warp h accumulates output columns [256 h, 256 h + 256) (128 fp32 registers).
// Shared memory: kStages KV blocks [32][576 + 8] (V is the first 512 columns of the same rows)
// and the S exchange buffer. One __syncthreads per KV block guards the stage ring.
//
// Output: an item that covers its tile's whole key range writes O (p.dtype) and LSE (ln);
// otherwise it writes a normalized fp32 partial and a log2-domain LSE, merged by the combine
// kernel.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/common/mma_rows.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"
#include "cuda/cpasync/traits.h"
#include "cuda/dispatch.h"

namespace treemla::cuda::cpasync {

// Where KV block `it` of an item starts and ends, in logical rows of the request.
struct BlockDesc {
  int t0;     // first logical row
  int limit;  // rows at or past this are not keys of this block
  int jb;     // tail block index (tail node jb * 32 is the block's first), -1 for prefix blocks
};

__device__ __forceinline__ BlockDesc block_desc(int it, int pb_begin, int n_pb, uint64_t tail_bits,
                                                int prefix_len, int q_len, int block_n) {
  BlockDesc d;
  if (it < n_pb) {
    d.t0 = (pb_begin + it) * block_n;
    d.limit = prefix_len;
    d.jb = -1;
  } else {
    d.jb = nth_set_bit(tail_bits, it - n_pb);
    d.t0 = prefix_len + d.jb * block_n;
    d.limit = prefix_len + q_len;
  }
  return d;
}

// Thread t copies row t / 8 of a block, 16-byte chunks t % 8, t % 8 + 8, ..., so each thread
// looks up one page per block and each warp instruction moves 4 rows x 128 contiguous bytes.
// The page lookup (a dependent global load) is done one block ahead: fetch_row_page() starts
// it, issue_kv_block() uses its result an iteration later, so its latency hides behind compute.
constexpr int kNoRow = INT_MIN;  // not a page index: -1 in a page table is an error, not "no row"

struct RowPage {
  int t;     // logical row this thread copies
  int page;  // its page, or kNoRow when the row is past the block's keys or unmapped
};

template <class Tr>
__device__ __forceinline__ RowPage fetch_row_page(const VerifyKernelParams& kp, int b,
                                                  const BlockDesc& d) {
  static_assert(Tr::kThreads == Tr::kBlockN * 8, "one row per 8 threads");
  RowPage rp;
  rp.t = d.t0 + (threadIdx.x >> 3);
  rp.page = kNoRow;
  if (rp.t < d.limit) {
    const int entry = rp.t >> kp.page_shift;
    if (entry < kp.p.page_table_stride) {
      rp.page = __ldg(kp.p.page_table + static_cast<int64_t>(b) * kp.p.page_table_stride + entry);
    } else {
      record_status(kp.hdr, kStatusStride, b, rp.t, kp.p.page_table_stride);  // row not mapped
    }
  }
  return rp;
}

template <typename T, class Tr>
__device__ __forceinline__ void issue_kv_block(const VerifyKernelParams& kp, int b, T* dst,
                                               const RowPage& rp, bool in_block) {
  constexpr int kChunksPerThread = kHeadDimQK / 8 / 8;  // 9
  const int sub = threadIdx.x & 7;
  const T* src = static_cast<const T*>(kp.p.kv_cache);
  int bytes = 0;
  if (in_block && rp.page != kNoRow) {
    if (rp.page >= 0 && rp.page < kp.p.num_pages) {
      src += (static_cast<int64_t>(rp.page) * kp.p.page_size + (rp.t & (kp.p.page_size - 1))) *
                 kHeadDimQK +
             sub * 8;
      bytes = 16;
    } else {
      record_status(kp.hdr, kStatusPage, b, rp.page, rp.t);  // zero-filled instead of read
    }
  }
  const uint32_t s0 = smem_u32(dst + (threadIdx.x >> 3) * Tr::kRowStride + sub * 8);
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i)
    cp_async_16(s0 + i * 128, bytes ? src + i * 64 : src, bytes);
  cp_async_commit();
}

// kSplitKeys (tiles of at most 16 rows, i.e. decode): the four row groups all take the same 16
// rows and split each 32-row KV block among themselves, 8 keys each, instead of leaving three
// of them idle; their partial states are merged through shared memory at the end.
template <typename T, class Tr, bool kSplitKeys>
__device__ void verify_item(const VerifyKernelParams& kp, unsigned char* smem, const WorkItem& w) {
  const int b = w.b, tile = w.tile;
  constexpr int kBlockN = Tr::kBlockN;
  constexpr int kNT = kSplitKeys ? 1 : Tr::kNTiles;  // n8 tiles of S per warp
  constexpr int kStages = Tr::kStages;
  T* sKV = reinterpret_cast<T*>(smem);
  float* sS = reinterpret_cast<float*>(smem + Tr::kKVBytes);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp >> 1, half = warp & 1;  // a row group's two halves sit on two schedulers
  const int g = lane >> 2, q4 = lane & 3;

  // Loaded here rather than held from the work item: w.rs kept live through the main loop spills.
  const RequestSched rs = kp.sched[b];
  const int H = kp.p.num_heads;
  const int rows = rs.q_len * H;
  const int row0 = tile * kBlockM;

  // This item's prefix blocks, and the tail blocks some row of the tile can see.
  const int pb_begin = w.pb_begin;
  const int n_pb = max(0, w.pb_end - w.pb_begin);
  const uint64_t tail_bits = w.tail ? tile_tail_bits(kp, rs, tile, lane) : 0;
  const int n_blocks = n_pb + __popcll(tail_bits);

  auto desc = [&](int it) {
    return block_desc(it, pb_begin, n_pb, tail_bits, rs.prefix_len, rs.q_len, kBlockN);
  };
  // Prologue: start the first kStages - 1 loads, and the page lookup of the next one.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const bool in = s < n_blocks;
    issue_kv_block<T, Tr>(kp, b, sKV + s * kBlockN * Tr::kRowStride,
                          in ? fetch_row_page<Tr>(kp, b, desc(s)) : RowPage{0, kNoRow}, in);
  }
  RowPage next_rp =
      kStages - 1 < n_blocks ? fetch_row_page<Tr>(kp, b, desc(kStages - 1)) : RowPage{0, kNoRow};

  // This thread's two rows (g and g + 8 of the warp's 16).
  const int row_rg = kSplitKeys ? 0 : rg;        // whose rows this warp computes
  const int key_base = kSplitKeys ? 8 * rg : 0;  // first key column of this warp in a block
  const int rl0 = row_rg * 16 + g, rl1 = rl0 + 8;
  const int r0 = row0 + rl0, r1 = row0 + rl1;
  const bool v0 = r0 < rows, v1 = r1 < rows;
  const int64_t grow0 = static_cast<int64_t>(rs.q_start) * H + r0;  // folded global row
  const int64_t grow1 = grow0 + 8;
  // Row groups past the last row only help load (never with kSplitKeys).
  const bool active = row0 + row_rg * 16 < rows;
  const bool writer = !kSplitKeys || rg == 0;  // who writes the tile's outputs

  // Q fragments for columns [288 half, 288 half + 288), kept for the whole item.
  uint32_t qf[18][4];
  {
    const T* q = static_cast<const T*>(kp.p.q);
    const uint32_t* q0 =
        reinterpret_cast<const uint32_t*>(q + grow0 * kHeadDimQK + half * 288 + q4 * 2);
    const uint32_t* q1 =
        reinterpret_cast<const uint32_t*>(q + grow1 * kHeadDimQK + half * 288 + q4 * 2);
#pragma unroll
    for (int ks = 0; ks < 18; ++ks) {
      qf[ks][0] = v0 ? __ldg(q0 + ks * 8) : 0u;
      qf[ks][1] = v1 ? __ldg(q1 + ks * 8) : 0u;
      qf[ks][2] = v0 ? __ldg(q0 + ks * 8 + 4) : 0u;
      qf[ks][3] = v1 ? __ldg(q1 + ks * 8 + 4) : 0u;
    }
  }
  // Tree-mask rows of this thread's two rows (tail blocks only).
  const uint32_t* mrow0 = reinterpret_cast<const uint32_t*>(
      kp.p.tree_mask + static_cast<int64_t>(rs.q_start + (v0 ? r0 / H : 0)) * kp.p.mask_words);
  const uint32_t* mrow1 = reinterpret_cast<const uint32_t*>(
      kp.p.tree_mask + static_cast<int64_t>(rs.q_start + (v1 ? r1 / H : 0)) * kp.p.mask_words);

  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sc = kp.scale_log2;

  float* my_s = sS + (half * kBlockM + rg * 16) * Tr::kSStride;
  const float* other_s = sS + ((1 - half) * kBlockM + rg * 16) * Tr::kSStride;

  for (int it = 0; it < n_blocks; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block `it` visible to all; stage (it - 1) % kStages free for reuse
    {
      // Always commit a group (possibly empty) so the wait count above stays right.
      const int nxt = it + kStages - 1;
      issue_kv_block<T, Tr>(kp, b, sKV + (nxt % kStages) * kBlockN * Tr::kRowStride, next_rp,
                            nxt < n_blocks);
      if (nxt + 1 < n_blocks) next_rp = fetch_row_page<Tr>(kp, b, desc(nxt + 1));
    }
    if (!active) continue;
    const T* sK = sKV + (it % kStages) * kBlockN * Tr::kRowStride;
    const BlockDesc d = desc(it);

    // ---- partial S over this warp's half of the 576 columns ----
    // Two accumulator sets (even and odd k-steps) double the independent mma chains, which
    // hides more of the mma.sync latency; measured 3-7% faster on the H200.
    float s[kNT][4], s2[kNT][4];
#pragma unroll
    for (int i = 0; i < kNT; ++i)
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = s2[i][0] = s2[i][1] = s2[i][2] = s2[i][3] = 0.f;
    {
      const int mat = lane >> 3;
      const uint32_t base = smem_u32(sK + ((mat >> 1) * 8 + (lane & 7)) * Tr::kRowStride +
                                     half * 288 + (mat & 1) * 8);
      if constexpr (kSplitKeys) {
        // One n8 tile (this warp's 8 keys); each x4 load covers two k-steps of it.
        const uint32_t kbase =
            smem_u32(sK + (key_base + (lane & 7)) * Tr::kRowStride + half * 288 + mat * 8);
#pragma unroll
        for (int ks = 0; ks < 18; ks += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(b0, b1, b2, b3, kbase + ks * 16 * 2);
          mma_16816<T>(s[0], qf[ks], b0, b1);
          mma_16816<T>(s2[0], qf[ks + 1], b2, b3);
        }
      }
#pragma unroll
      for (int ks = 0; ks < (kSplitKeys ? 0 : 18); ks += 2) {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b0, b1, b2, b3, c0, c1, c2, c3;
          ldmatrix_x4(b0, b1, b2, b3, base + (np * 16 * Tr::kRowStride + ks * 16) * 2);
          ldmatrix_x4(c0, c1, c2, c3, base + (np * 16 * Tr::kRowStride + (ks + 1) * 16) * 2);
          mma_16816<T>(s[2 * np], qf[ks], b0, b1);
          mma_16816<T>(s[2 * np + 1], qf[ks], b2, b3);
          mma_16816<T>(s2[2 * np], qf[ks + 1], c0, c1);
          mma_16816<T>(s2[2 * np + 1], qf[ks + 1], c2, c3);
        }
      }
#pragma unroll
      for (int i = 0; i < kNT; ++i) {
        s[i][0] += s2[i][0];
        s[i][1] += s2[i][1];
        s[i][2] += s2[i][2];
        s[i][3] += s2[i][3];
      }
    }
    // ---- swap partial S with the other half of the row group ----
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = nt * 8 + q4 * 2;
      *reinterpret_cast<float2*>(my_s + g * Tr::kSStride + col) = make_float2(s[nt][0], s[nt][1]);
      *reinterpret_cast<float2*>(my_s + (g + 8) * Tr::kSStride + col) =
          make_float2(s[nt][2], s[nt][3]);
    }
    named_barrier(1 + rg, 64);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = nt * 8 + q4 * 2;
      const float2 a = *reinterpret_cast<const float2*>(other_s + g * Tr::kSStride + col);
      const float2 c = *reinterpret_cast<const float2*>(other_s + (g + 8) * Tr::kSStride + col);
      s[nt][0] += a.x;
      s[nt][1] += a.y;
      s[nt][2] += c.x;
      s[nt][3] += c.y;
    }

    // ---- mask (only tail blocks and the last, partial prefix block need one) ----
    if (d.jb >= 0 || d.limit - d.t0 < kBlockN)
      mask_block<kNT>(s, d.limit - d.t0, d.jb, mrow0, mrow1, v0, v1, key_base, q4);

    // ---- online softmax ----
    float alpha0, alpha1;
    online_softmax_step<kNT>(s, sc, m0, m1, l0, l1, alpha0, alpha1);
    rescale_rows<32>(o, alpha0, alpha1);

    // ---- O += P V over this warp's 256 output columns ----
    if constexpr (kSplitKeys) {
      // One 16-key k-step holding this warp's 8 keys in its lower (even row group) or upper
      // (odd) half, P = 0 in the other half, whose V rows are the sibling's (finite) keys.
      const int mat = lane >> 3;
      const uint32_t vbase =
          smem_u32(sK + (16 * (rg >> 1) + (mat & 1) * 8 + (lane & 7)) * Tr::kRowStride +
                   half * 256 + (mat >> 1) * 8);
      const uint32_t p0 = pack2<T>(s[0][0], s[0][1]), p1 = pack2<T>(s[0][2], s[0][3]);
      const uint32_t a[4] = {(rg & 1) ? 0u : p0, (rg & 1) ? 0u : p1, (rg & 1) ? p0 : 0u,
                             (rg & 1) ? p1 : 0u};
#pragma unroll
      for (int np = 0; np < 16; ++np) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(b0, b1, b2, b3, vbase + np * 16 * 2);
        mma_16816<T>(o[2 * np], a, b0, b1);
        mma_16816<T>(o[2 * np + 1], a, b2, b3);
      }
    } else {
      const int mat = lane >> 3;
      const uint32_t base = smem_u32(sK + ((mat & 1) * 8 + (lane & 7)) * Tr::kRowStride +
                                     half * 256 + (mat >> 1) * 8);
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        uint32_t a[4];
        a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < 16; ++np) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(b0, b1, b2, b3, base + (kk * 16 * Tr::kRowStride + np * 16) * 2);
          mma_16816<T>(o[2 * np], a, b0, b1);
          mma_16816<T>(o[2 * np + 1], a, b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

  if constexpr (kSplitKeys) {
    // Merge the four row groups' states of the same 16 rows through the idle KV stages, in two
    // rounds: 1 -> 0 and 3 -> 2, then 2 -> 0. Row group 0 then holds the whole tile.
    static_assert(2 * 16 * kHeadDimV * 4 + 4 * 16 * 4 <= Tr::kKVBytes,
                  "merge buffer must fit the stages");
    float* xo = reinterpret_cast<float*>(smem);  // [2][16][512] O
    float* xm = xo + 2 * 16 * kHeadDimV;         // [2][16] row max (unscaled)
    float* xl = xm + 2 * 16;                     // [2][16] row sum
    __syncthreads();                             // every warp is done with the stages
#pragma unroll
    for (int round = 0; round < 2; ++round) {
      const bool sender = round == 0 ? (rg & 1) != 0 : rg == 2;
      const bool receiver = round == 0 ? (rg & 1) == 0 : rg == 0;
      const int slot = round == 0 ? (rg >> 1) : 0;
      float* so = xo + slot * 16 * kHeadDimV;
      if (sender) {
#pragma unroll
        for (int nt = 0; nt < 32; ++nt) {
          const int col = half * 256 + nt * 8 + q4 * 2;
          *reinterpret_cast<float2*>(so + g * kHeadDimV + col) = make_float2(o[nt][0], o[nt][1]);
          *reinterpret_cast<float2*>(so + (g + 8) * kHeadDimV + col) =
              make_float2(o[nt][2], o[nt][3]);
        }
        if (half == 0 && q4 == 0) {
          xm[slot * 16 + g] = m0;
          xm[slot * 16 + g + 8] = m1;
          xl[slot * 16 + g] = l0;
          xl[slot * 16 + g + 8] = l1;
        }
      }
      __syncthreads();
      if (receiver) {
        const float om0 = xm[slot * 16 + g], om1 = xm[slot * 16 + g + 8];
        const float nm0 = fmaxf(m0, om0), nm1 = fmaxf(m1, om1);
        // Guard rows where both parts are empty (max -inf): weights 0, not NaN.
        const float u0 = nm0 == -INFINITY ? 0.f : nm0 * sc, u1 = nm1 == -INFINITY ? 0.f : nm1 * sc;
        const float wa0 = fast_exp2(fmaf(m0, sc, -u0)), wb0 = fast_exp2(fmaf(om0, sc, -u0));
        const float wa1 = fast_exp2(fmaf(m1, sc, -u1)), wb1 = fast_exp2(fmaf(om1, sc, -u1));
        l0 = l0 * wa0 + xl[slot * 16 + g] * wb0;
        l1 = l1 * wa1 + xl[slot * 16 + g + 8] * wb1;
        m0 = nm0;
        m1 = nm1;
#pragma unroll
        for (int nt = 0; nt < 32; ++nt) {
          const int col = half * 256 + nt * 8 + q4 * 2;
          const float2 x0 = *reinterpret_cast<const float2*>(so + g * kHeadDimV + col);
          const float2 x1 = *reinterpret_cast<const float2*>(so + (g + 8) * kHeadDimV + col);
          o[nt][0] = o[nt][0] * wa0 + x0.x * wb0;
          o[nt][1] = o[nt][1] * wa0 + x0.y * wb0;
          o[nt][2] = o[nt][2] * wa1 + x1.x * wb1;
          o[nt][3] = o[nt][3] * wa1 + x1.y * wb1;
        }
      }
      __syncthreads();
    }
  }

  // ---- epilogue ----
  const TileRows tr{rl0, grow0, writer && v0, writer && v1, writer && half == 0 && q4 == 0};
  write_tile_rows<T, 32>(kp, w.slot, o, m0, m1, l0, l1, tr, half * 256, q4);
}

template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    verify_main_kernel(const __grid_constant__ VerifyKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (config_fits_arch<Tr::kSmemBytes>()) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_item;
    pdl_wait();  // the schedule (or the previous layer's combine) has completed
    pdl_launch_dependents();
    for (;;) {
      if (threadIdx.x == 0) s_item = atomicAdd(&kp.hdr->counter, 1);
      __syncthreads();
      const int item = s_item;
      const int4 first_row = header_row(kp.hdr);
      const ListCounts lc = list_counts(first_row);
      if (item >= lc.num_items) break;
      // The lookup from the schedule's entries rather than the item table (fetch_item): with the
      // table this 255-register kernel ran 7-9% slower in its large configuration at the
      // compute-bound shapes on the H200 (3-5% faster at 99 KB; docs/verify-kernel.md, "The
      // item table"). A dynamic item's lookup also overlaps the previous item's stores.
      const WorkItem w = resolve_work_item(kp, item, lc.refine_first);
      if (w.rs.q_len * kp.p.num_heads - w.tile * kBlockM <= 16) {
        verify_item<T, Tr, true>(kp, smem, w);
      } else {
        verify_item<T, Tr, false>(kp, smem, w);
      }
      __syncthreads();  // smem and s_item are reused by the next item
    }
  } else {
    __trap();  // this tile configuration does not fit this architecture's shared memory
  }
#else
  __trap();  // treemla needs sm_80 or newer
#endif
}

}  // namespace treemla::cuda::cpasync

namespace treemla::cuda {

template <class Tr>
KernelEntry make_cpasync_entry() {
  using T = typename Tr::Element;
  return {reinterpret_cast<const void*>(&cpasync::verify_main_kernel<T, Tr>),
          Tr::kThreads,
          Tr::kSmemBytes,
          1,
          0,
          kMinCcMmaSync};
}

}  // namespace treemla::cuda
