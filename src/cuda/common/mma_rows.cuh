// The per-block steps the mma.sync families (cpasync, decode) share, on the two rows a thread
// holds in the m16n8 accumulator layout: row g = lane / 4 in s[nt][0..1] and row g + 8 in
// s[nt][2..3], key (or output) columns nt * 8 + 2 (lane % 4) and the next one. Masking a block's
// keys, one online-softmax step in the log2 domain, and writing a row tile's output (final O and
// LSE, or a split's normalized fp32 partial).
#pragma once

#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/common/verify_device.cuh"
#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

// Sets to -inf the scores of keys this thread's rows may not see in a 32-key block whose keys end
// `valid` rows after its first, and, for a tail block (jb >= 0), that the rows' tree-mask words
// `mrow0[jb]` / `mrow1[jb]` do not show (v0 / v1: the row exists). key_base: the first key
// column of s[0].
template <int kNT>
__device__ __forceinline__ void mask_block(float (&s)[kNT][4], int valid, int jb,
                                           const uint32_t* mrow0, const uint32_t* mrow1, bool v0,
                                           bool v1, int key_base, int q4) {
  const uint32_t in_range = valid >= 32 ? 0xffffffffu : ((1u << max(valid, 0)) - 1u);
  uint32_t vis0 = in_range, vis1 = in_range;  // bit c: key column c visible
  if (jb >= 0) {
    vis0 &= v0 ? __ldg(mrow0 + jb) : 0u;
    vis1 &= v1 ? __ldg(mrow1 + jb) : 0u;
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int c = key_base + nt * 8 + q4 * 2;
    if (!((vis0 >> c) & 1u)) s[nt][0] = -INFINITY;
    if (!((vis0 >> (c + 1)) & 1u)) s[nt][1] = -INFINITY;
    if (!((vis1 >> c) & 1u)) s[nt][2] = -INFINITY;
    if (!((vis1 >> (c + 1)) & 1u)) s[nt][3] = -INFINITY;
  }
}

// One online-softmax step over a block's scores s (unscaled; the quad of lanes sharing a row
// holds the block's keys): the new row maxima m0 / m1, s replaced by P = exp2(s sc - m sc), the
// row sums l0 / l1 (this thread's keys only) rescaled and increased, and the factors alpha0 /
// alpha1 that O must be multiplied by. Scores stay unscaled until exp2 (one FFMA each; sc > 0, so
// the max commutes with scaling). A row that has seen nothing keeps m = -inf and subtracts 0, so
// exp2 gives 0, not NaN.
template <int kNT>
__device__ __forceinline__ void online_softmax_step(float (&s)[kNT][4], float sc, float& m0,
                                                    float& m1, float& l0, float& l1, float& alpha0,
                                                    float& alpha1) {
  float mx0 = m0, mx1 = m1;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
    mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float mu0 = mx0 == -INFINITY ? 0.f : mx0 * sc;
  const float mu1 = mx1 == -INFINITY ? 0.f : mx1 * sc;
  alpha0 = fast_exp2(fmaf(m0, sc, -mu0));
  alpha1 = fast_exp2(fmaf(m1, sc, -mu1));
  m0 = mx0;
  m1 = mx1;
  float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    s[nt][0] = fast_exp2(fmaf(s[nt][0], sc, -mu0));
    s[nt][1] = fast_exp2(fmaf(s[nt][1], sc, -mu0));
    s[nt][2] = fast_exp2(fmaf(s[nt][2], sc, -mu1));
    s[nt][3] = fast_exp2(fmaf(s[nt][3], sc, -mu1));
    rs0 += s[nt][0] + s[nt][1];
    rs1 += s[nt][2] + s[nt][3];
  }
  l0 = l0 * alpha0 + rs0;
  l1 = l1 * alpha1 + rs1;
}

// O *= alpha per row, skipped when no row of the warp needs it (alpha is exactly 1 once the
// maxima settle, most of a long prefix).
template <int kNT>
__device__ __forceinline__ void rescale_rows(float (&o)[kNT][4], float alpha0, float alpha1) {
  if (__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) {
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
      o[i][0] *= alpha0;
      o[i][1] *= alpha0;
      o[i][2] *= alpha1;
      o[i][3] *= alpha1;
    }
  }
}

// Where a thread's two rows of a row tile go: rl0 (tile row of g; g + 8 is rl0 + 8), their folded
// global rows, whether they exist, and whether this thread writes the LSE (one lane a row).
struct TileRows {
  int rl0;
  int64_t grow0;
  bool v0, v1;
  bool lse_writer;
};

// The log2-domain LSE of two rows from their maxima and sums (-inf for a row that saw nothing);
// the final LSE is that times kFinalLseScale (ln 2).
__device__ __forceinline__ void rows_lse(const VerifyKernelParams& kp, float m0, float m1, float l0,
                                         float l1, float& lse0, float& lse1) {
  const float sc = kp.scale_log2;
  lse0 = l0 > 0.f ? m0 * sc + __log2f(l0) : -INFINITY;
  lse1 = l1 > 0.f ? m1 * sc + __log2f(l1) : -INFINITY;
}
#if defined(TREEMLA_KERNEL_MUTATION) && TREEMLA_KERNEL_MUTATION == 3
constexpr float kFinalLseScale = 1.f;  // mutation (docs/testing.md): the final LSE in base 2
#else
constexpr float kFinalLseScale = 0.69314718055994530942f;
#endif

// The LSE of rows rl0 and rl0 + 8 of a tile (global rows grow0, grow0 + 8): for slot -1 the final
// natural-log LSE, else the partial's log2-domain one (the warpspec family's epilogue;
// write_tile_rows writes the same).
__device__ __forceinline__ void write_row_lse(const VerifyKernelParams& kp, int64_t slot, int rl0,
                                              int64_t grow0, bool v0, bool v1, float m0, float m1,
                                              float l0, float l1) {
  float lse0, lse1;
  rows_lse(kp, m0, m1, l0, l1, lse0, lse1);
  if (slot < 0) {
    if (v0) kp.lse[grow0] = lse0 * kFinalLseScale;
    if (v1) kp.lse[grow0 + 8] = lse1 * kFinalLseScale;
  } else {
    if (v0) kp.part_lse[slot * kBlockM + rl0] = lse0;
    if (v1) kp.part_lse[slot * kBlockM + rl0 + 8] = lse1;
  }
}

// Writes a row tile's output columns col_base + nt * 8 + 2 (lane % 4) (+1) from O (rows' sums
// l0 / l1 complete, maxima m0 / m1): for slot -1 (the tile's only work item, WorkItem), O / l in
// the output dtype and the LSE (ln); otherwise the normalized fp32 partial and log2-domain LSE in
// partial slot `slot` for the combine kernel.
template <typename T, int kNT>
__device__ __forceinline__ void write_tile_rows(const VerifyKernelParams& kp, int64_t slot,
                                                const float (&o)[kNT][4], float m0, float m1,
                                                float l0, float l1, const TileRows& tr,
                                                int col_base, int q4) {
  // l >= 1 when a row saw anything (its maximum's own term is 1): the SFU reciprocal is within an
  // ulp there and, unlike 1.f / l, calls no slow-path subroutine (ptxas saves the live registers
  // around a call; the warpspec family's output warps have none to spare).
  const float inv0 = l0 > 0.f ? fast_rcp(l0) : 0.f;
  const float inv1 = l1 > 0.f ? fast_rcp(l1) : 0.f;
  float lse0, lse1;
  rows_lse(kp, m0, m1, l0, l1, lse0, lse1);
  constexpr float kLn2 = kFinalLseScale;
  const int64_t grow1 = tr.grow0 + 8;
  if (slot < 0) {
    T* out = static_cast<T*>(kp.o);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = col_base + nt * 8 + q4 * 2;
      if (tr.v0)
        *reinterpret_cast<uint32_t*>(out + tr.grow0 * kHeadDimV + col) =
            pack2<T>(o[nt][0] * inv0, o[nt][1] * inv0);
      if (tr.v1)
        *reinterpret_cast<uint32_t*>(out + grow1 * kHeadDimV + col) =
            pack2<T>(o[nt][2] * inv1, o[nt][3] * inv1);
    }
    if (tr.lse_writer) {
      if (tr.v0) kp.lse[tr.grow0] = lse0 * kLn2;
      if (tr.v1) kp.lse[grow1] = lse1 * kLn2;
    }
  } else {
    float* po = kp.part_o + slot * kBlockM * kHeadDimV;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = col_base + nt * 8 + q4 * 2;
      if (tr.v0)
        *reinterpret_cast<float2*>(po + tr.rl0 * kHeadDimV + col) =
            make_float2(o[nt][0] * inv0, o[nt][1] * inv0);
      if (tr.v1)
        *reinterpret_cast<float2*>(po + (tr.rl0 + 8) * kHeadDimV + col) =
            make_float2(o[nt][2] * inv1, o[nt][3] * inv1);
    }
    if (tr.lse_writer) {
      if (tr.v0) kp.part_lse[slot * kBlockM + tr.rl0] = lse0;
      if (tr.v1) kp.part_lse[slot * kBlockM + tr.rl0 + 8] = lse1;
    }
  }
}

}  // namespace treemla::cuda
