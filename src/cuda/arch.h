// Architecture facts, in one place: shared memory per block, which features each compute
// capability has, and whether a kernel configuration is compiled to real code for the
// architecture being compiled. Host code uses the same numbers to pick a kernel family and a tile
// configuration (src/cuda/dispatch.cu); device code uses config_fits_arch() to compile a kernel
// body only where it fits, and traps elsewhere.
#pragma once

namespace treemla::cuda {

// Opt-in shared memory per block (bytes).
constexpr int kSmemSm80 = 166912;  // 163 KB: sm_80 (A100)
constexpr int kSmem99K = 101376;   // 99 KB: sm_86, sm_89, sm_120 (RTX PRO 6000 Blackwell)
constexpr int kSmemSm90 = 232448;  // 227 KB: sm_90 (H100/H200), sm_100 (B200)

// Host-side feature facts by compute capability (major * 10 + minor). The families' dispatch
// entries name the oldest architecture they need with these (KernelEntry::min_cc).
// mma.sync m16n8k16 bf16/fp16 and cp.async: every supported architecture (sm_80 and newer).
constexpr int kMinCcMmaSync = 80;
constexpr bool arch_has_mma_sync(int cc) { return cc >= kMinCcMmaSync; }
// Thread-block clusters, distributed shared memory, mbarrier transaction counts, bulk copies
// (cp.async.bulk) and st.async: sm_90 and newer (sm_120 included).
constexpr int kMinCcClusters = 90;
constexpr bool arch_has_clusters(int cc) { return cc >= kMinCcClusters; }
// wgmma: sm_90 only, and only in code compiled for the architecture-specific target sm_90a.
constexpr int kMinCcWgmma = 90;
constexpr int kMaxCcWgmma = 90;
// Opt-in shared memory per block for a compute capability (the device reports the same value).
constexpr int arch_smem_optin(int cc) {
  return (cc == 86 || cc == 89 || cc >= 120) ? kSmem99K : cc >= 90 ? kSmemSm90 : kSmemSm80;
}

// Device side: the shared-memory limit of the architecture being compiled (0 on the host pass).
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200
constexpr int kArchSmem = kSmem99K;
#elif __CUDA_ARCH__ >= 900
constexpr int kArchSmem = kSmemSm90;
#else
constexpr int kArchSmem = kSmemSm80;
#endif
#else
constexpr int kArchSmem = 0;
#endif

// True where a configuration using `smem_bytes` per block is compiled to real code for the
// architecture being compiled (always true on the host pass).
template <int kSmemBytes>
constexpr bool config_fits_arch() {
#if defined(__CUDA_ARCH__)
  return kSmemBytes <= kArchSmem;
#else
  return true;
#endif
}

}  // namespace treemla::cuda
