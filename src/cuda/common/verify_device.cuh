// Device helpers shared by the verify kernels (schedule, main, combine): recording a device-side
// check's failure in the workspace header, finding which request a work item belongs to, and the
// small arithmetic both main-kernel families use (exp2, the k-th set bit of the tail bitmap).
#pragma once

#include <cstdint>

#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

// 2^x with the SFU (the online softmax works in the log2 domain).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The k-th set bit (k >= 0) of a 64-bit mask.
__device__ __forceinline__ int nth_set_bit(uint64_t m, int k) {
  for (int i = 0; i < k; ++i) m &= m - 1;
  return __ffsll(static_cast<long long>(m)) - 1;
}

// Record a failed device-side check in the call's status record (device_status.h); the first
// failure of a call wins and check_status reports it.
__device__ __forceinline__ void record_status(WorkspaceHeader* hdr, int code, int request,
                                              long long value, long long extra) {
  record_status(&hdr->status, code, request, value, extra);
}

// Largest b in [0, n) with base[b] <= x (base non-decreasing, base[0] <= x): the request whose
// range of an exclusive prefix sum (work items, combine groups) holds x.
__device__ __forceinline__ int find_base(const int* base, int n, int x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (base[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace treemla::cuda
