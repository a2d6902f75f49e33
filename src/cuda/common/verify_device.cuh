// Device helpers shared by the verify kernels (schedule, main, combine): recording a device-side
// check's failure in the workspace header, and finding which request a work item belongs to.
#pragma once

#include "cuda/common/verify_kernel_params.h"

namespace treemla::cuda {

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
