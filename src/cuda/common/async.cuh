// mbarrier and cluster primitives. sm_80 and newer: mbarrier initialisation, arrivals, waits and
// counted cp.async completions (the decode family's ring). sm_90 and newer (sm_120 included):
// arrivals with transaction bytes and on a peer CTA of the cluster, try_wait with a suspend hint,
// bulk copies, st.async stores into a peer CTA's shared memory, cluster barriers; and setmaxnreg
// where it exists. Only kernels guarded for the matching __CUDA_ARCH__ call them.
//
// Two things measured on the H200 and sm_120a builds shape what is here (docs/verify-kernel.md):
// waits and arrivals are CTA-scoped or relaxed (cluster-scoped acquire / release compile to an
// L1 invalidation and a GPU-scope fence); and how a family copies KV rows is measured per family:
// the cluster family's cp.async beat one bulk copy per 576-byte row half (~40 ns each there),
// while the decode and warpspec families' one bulk copy per 1,152-byte row, issued by lanes that
// do nothing else, beat their cp.async versions.
#pragma once

#include <cstdint>

namespace treemla::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival (release at CTA scope: the default semantics of mbarrier.arrive); sm_90 and newer
// can arrive `count` times at once.
__device__ __forceinline__ void mbar_arrive(uint32_t bar, uint32_t count = 1) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count)
               : "memory");
#else
  (void)count;  // always 1 here
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}

__device__ __forceinline__ bool mbar_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
      "p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

// The barrier counts one arrival of the executing thread once all its earlier cp.async copies
// have landed (the arrival is part of the barrier's expected count: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}

#endif  // __CUDA_ARCH__ >= 800

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The address of the same shared-memory location in CTA `rank` of this cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// Makes barrier initialisation visible to the cluster (before the first cluster_sync).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// Arrive on a barrier of another CTA of the cluster (remote_bar from map_to_rank), without
// release semantics: a release at cluster scope costs a GPU-scope fence (MEMBAR.ALL.GPU and
// ERRBAR in SASS, measured at ~20% of the kernel's stall samples). Use it to say "I have read
// what you sent" only after the values read are consumed by arithmetic, so the reads are done.
__device__ __forceinline__ void mbar_arrive_remote_relaxed(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar)
               : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
      "p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// Spin on test_wait (no suspension) until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_spin(uint32_t bar, uint32_t parity) {
  while (!mbar_test_wait(bar, parity)) {
  }
}

// As mbar_wait, but each try_wait may suspend the thread for up to `ns` nanoseconds (it resumes
// as soon as the phase completes), so that a waiting warp leaves the issue slots to the warps it
// shares a scheduler with. In a profile of the warpspec family without the hint, a waiting warp
// retried ~95 times per wait; with it the kernel measured the same (776 against 778 us,
// bench/results/2026-12-01_h200_warpspec-notes.md).
__device__ __forceinline__ void mbar_wait_suspend(uint32_t bar, uint32_t parity,
                                                  uint32_t ns = 1000000) {
  uint32_t ok = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 "
        "%0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity), "r"(ns)
        : "memory");
  } while (!ok);
}

// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to this
// CTA's shared memory, counted on barrier `bar` as transaction bytes when it lands (the
// .shared::cta destination: the .shared::cluster form compiles to a subroutine call on sm_120a).
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from this CTA's shared
// memory to global memory, in the thread's current bulk group (bulk_commit, bulk_wait_read).
__device__ __forceinline__ void bulk_copy_s2g(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's committed bulk copies have read their shared-memory source (it may
// then be overwritten); bulk_wait_all waits until their writes are done as well.
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Orders this thread's earlier generic-proxy writes to shared memory before later async-proxy
// accesses (bulk copies) to it.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 16-byte store into another CTA's shared memory (remote_dst, remote_bar from map_to_rank),
// counted on that CTA's barrier as 16 transaction bytes.
__device__ __forceinline__ void st_async_v4(uint32_t remote_dst, float4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(remote_dst),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(remote_bar)
      : "memory");
}

#endif  // __CUDA_ARCH__ >= 900

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Wait until the phase with the given parity has completed (try_wait on sm_90 and newer, a
// test_wait spin before). With TREEMLA_WAIT_LIMIT defined (a debugging build), a wait that
// spins that many times traps instead of hanging.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef TREEMLA_WAIT_LIMIT
  long long n = 0;
#endif
#if __CUDA_ARCH__ >= 900
  while (!mbar_try_wait(bar, parity)) {
#else
  while (!mbar_test_wait(bar, parity)) {
#endif
#ifdef TREEMLA_WAIT_LIMIT
    if (++n > TREEMLA_WAIT_LIMIT) __trap();
#endif
  }
}
#endif  // __CUDA_ARCH__ >= 800

// setmaxnreg (a warpgroup changes its per-thread register count) exists on the
// architecture-specific targets sm_90a, sm_100a and sm_120a; elsewhere it is a no-op and every
// warp keeps the count the launch bounds give.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_SPECIFIC__)
#define TREEMLA_HAS_SETMAXNREG 1
#else
#define TREEMLA_HAS_SETMAXNREG 0
#endif

template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
#if TREEMLA_HAS_SETMAXNREG
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
#if TREEMLA_HAS_SETMAXNREG
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace treemla::cuda
