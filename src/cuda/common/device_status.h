// Device-side argument checks: the first violation wins, a host check names the argument.
//
// A kernel that finds an index or length it must not use skips that work (never reads or writes
// out of bounds) and records the violation with record_status() in a DeviceStatus that lives in
// the caller's workspace. Only the first record of a launch sticks: atomicCAS on `code` elects
// one writer, which then fills in the rest. The host check of the call (cuda::check_status for
// verify, cuda::check_move_status for the page moves and page-table updates) reads the record back
// with take_device_status(), clears it, and throws treemla::Error with a message that names the
// argument, the index and the value; the codes below say what each record's fields hold.
//
// This is for violations of a launch's argument contract. The per-request outcome of the GPU
// acceptance and commit (cuda::KvStatus, include/treemla/cuda/kvpool.h) is not one of them: it
// is a result, one per request, written to the caller's array, and a request that fails does not
// make the launch fail (the other requests are accepted and committed).
//
// The record layout is plain data, shared by host and device code; the record function is
// compiled only by nvcc.
#pragma once

#include <cuda_runtime_api.h>

namespace treemla::cuda {

// What a record means; 0 is "nothing recorded". index / value / extra per code:
enum StatusCode : int {
  kStatusOk = 0,
  // verify attention (schedule, main kernels; check_status)
  kStatusBadIndptr = 1,  // q_indptr[0] != 0: 0, q_indptr[0], 0; or decreasing: request,
                         // q_indptr[b], q_indptr[b + 1]
  kStatusQLen = 2,       // a request's q_len > the plan's bound: request, q_len, bound
  kStatusTotalQ = 3,     // q_indptr[b + 1] > limits.max_total_q: request, q_indptr[b + 1], bound
  kStatusPrefix = 4,     // prefix_len < 0 or > kMaxPrefixLen: request, prefix_len, kMaxPrefixLen
  kStatusPage = 5,       // a page the call reads is outside [0, num_pages): request, page, row
  kStatusPartials = 6,   // the schedule needs more partial slots than the plan holds (a bug)
  kStatusStride = 7,     // a row past page_table_stride * page_size: request, row, stride
  // page moves and page-table updates (check_move_status)
  kStatusBadPageMove = 8,      // moves[index] names a page outside [0, num_pages)
  kStatusBadRowMove = 9,       // moves[index] names a page or slot outside the cache
  kStatusBadTableUpdate = 10,  // update index: bad row, list longer than stride, or a bad page
};

struct DeviceStatus {
  int code;         // StatusCode of the first violation; kStatusOk while none
  int index;        // the request, move or update it concerns
  long long value;  // the offending value
  long long extra;  // the bound it broke, or a second coordinate
};
static_assert(sizeof(DeviceStatus) == 24, "a record is 24 bytes, 8-byte aligned");

#ifdef __CUDACC__
// Records a violation unless an earlier one of this launch (or an unchecked earlier launch) holds
// the record.
__device__ __forceinline__ void record_status(DeviceStatus* s, int code, int index, long long value,
                                              long long extra) {
  if (atomicCAS(&s->code, 0, code) == 0) {
    s->index = index;
    s->value = value;
    s->extra = extra;
  }
}
#endif

// Host: synchronizes the stream, reads the record at `status` (device memory) and, if it holds a
// violation, clears it (so the next check starts clean) before returning it.
DeviceStatus take_device_status(DeviceStatus* status, cudaStream_t stream);

}  // namespace treemla::cuda
