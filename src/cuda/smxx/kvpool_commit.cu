// Device-driven commit of the accepted rows (architecture-generic), after accept_paths
// (kvpool_accept.cu). The kernel reads every length, index and path from device memory and has a
// grid fixed by the batch size, so a CUDA graph captured once replays with new lengths and
// accepted paths.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/smxx/kvpool_common.h"
#include "treemla/attention.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/kvpool.h"

namespace treemla::cuda {

const char* kv_status_name(KvStatus s) {
  switch (s) {
    case KvStatus::kOk:
      return "ok";
    case KvStatus::kBadTreeSize:
      return "bad tree size";
    case KvStatus::kBadParents:
      return "bad parents";
    case KvStatus::kBadAcceptLen:
      return "bad accept_len";
    case KvStatus::kBadPath:
      return "bad accepted path";
    case KvStatus::kBadPrefixLen:
      return "bad prefix_len";
    case KvStatus::kBadPage:
      return "bad page";
  }
  return "unknown";
}

namespace {

constexpr int kCommitThreads = 128;
constexpr int kCommitBatch = 16;  // rows in flight per thread

// ---- commit_kernel ------------------------------------------------------------------------------
// Grid: one CTA per request. The CTA owns every row of its request's pages (page tables of
// different requests hold different pages), so CTAs need no ordering.
// Phase 1 (all threads, k strided): check the path (accepted[0] == 0, strictly increasing) and
// the page of every row a move touches, and stage the byte offsets of move k (source row
// prefix + accepted[k], destination row prefix + k; -1 for identities) in shared memory; the
// first error (smallest code) is reduced in shared memory. __syncthreads.
// Phase 2: thread c owns the 16-byte column c of every row (c = tid, tid + 128, ...): it is the
// only thread that reads or writes those bytes of any row of the request, so no barrier is
// needed between rows -- only this thread's program order, and a thread's accesses to one
// address stay in program order.
// Why that order is correct: accepted strictly increases from accepted[0] = 0, so accepted[j] >=
// j for all j. Move j writes row prefix + j and reads row prefix + accepted[j].
//  - A write never clobbers a source still to be read: move j's destination prefix + j is below
//    every later source prefix + accepted[j'] >= prefix + j' > prefix + j (j' > j). So all
//    sources can even be read before any destination is written, which the thread does for a
//    batch of kCommitBatch rows at once (loads in flight together, then the stores).
//  - A read never sees a row already overwritten: a row read by move j' (prefix + accepted[j'])
//    is written only by move accepted[j'] >= j'; if that is a later move, the read came first
//    (same batch: loads before stores; earlier batch: program order); if accepted[j'] == j' it
//    is the skipped identity.
// So the result equals the moves applied one by one in increasing k, which is what
// KvPool::commit_accepted and tree::plan_commit specify. Loads are plain coherent loads (never
// the read-only path: the kernel writes the same buffer).
// Phase 3: thread 0 writes new_seq_lens[b] (and status[b]). Every thread read prefix_lens[b] in
// phase 1, before the barrier, so the write may alias prefix_lens.
struct CommitArgs {
  CommitParams p;
  int32_t row_bytes;
  int32_t chunks;  // row_bytes / 16
};

__global__ void __launch_bounds__(kCommitThreads) commit_kernel(const CommitArgs a) {
  __shared__ int64_t s_src[kMaxTreeNodes], s_dst[kMaxTreeNodes];
  __shared__ int s_code;
  const CommitParams& p = a.p;
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int32_t prefix = p.prefix_lens[b];  // plain load: may alias new_seq_lens
  const int32_t n = p.accept_len[b];
  if (tid == 0) s_code = INT_MAX;
  __syncthreads();
  int code = INT_MAX;
  if (prefix < 0) {
    code = static_cast<int>(KvStatus::kBadPrefixLen);
  } else if (n < 1 || n > p.max_accept) {
    code = static_cast<int>(KvStatus::kBadAcceptLen);
  } else {
    const int32_t* acc = p.accepted + int64_t{b} * p.max_accept;
    const int32_t* table = p.page_table + int64_t{b} * p.page_table_stride;
    // Byte offset of logical row `row`, or -1 if it has no valid page.
    auto row_offset = [&](int64_t row) -> int64_t {
      const int64_t idx = row / p.cache.page_size;
      if (idx >= p.page_table_stride) return -1;
      const int32_t page = table[idx];
      if (page < 0 || page >= p.cache.num_pages) return -1;
      return (int64_t{page} * p.cache.page_size + row % p.cache.page_size) * a.row_bytes;
    };
    for (int32_t k = tid; k < n; k += kCommitThreads) {
      const int32_t u = acc[k];
      const bool ok_path = k == 0 ? u == 0 : u > acc[k - 1];
      if (!ok_path) {
        code = min(code, static_cast<int>(KvStatus::kBadPath));
        continue;
      }
      int64_t src = -1, dst = -1;
      if (u != k) {  // u > k here: identities are only the leading k with accepted[k] == k
        src = row_offset(int64_t{prefix} + u);
        dst = row_offset(int64_t{prefix} + k);
        if (src < 0 || dst < 0) code = min(code, static_cast<int>(KvStatus::kBadPage));
      }
      s_src[k] = src;
      s_dst[k] = dst;
    }
  }
  if (code != INT_MAX) atomicMin(&s_code, code);
  __syncthreads();
  const int final_code = s_code == INT_MAX ? 0 : s_code;
  if (final_code == 0) {
    uint8_t* data = static_cast<uint8_t*>(p.cache.data);
    for (int32_t c = tid; c < a.chunks; c += kCommitThreads) {
      for (int32_t k0 = 1; k0 < n; k0 += kCommitBatch) {
        uint4 v[kCommitBatch];
#pragma unroll
        for (int r = 0; r < kCommitBatch; ++r) {
          const int32_t k = k0 + r;
          if (k < n && s_src[k] >= 0) v[r] = *(reinterpret_cast<const uint4*>(data + s_src[k]) + c);
        }
#pragma unroll
        for (int r = 0; r < kCommitBatch; ++r) {
          const int32_t k = k0 + r;
          if (k < n && s_src[k] >= 0) *(reinterpret_cast<uint4*>(data + s_dst[k]) + c) = v[r];
        }
      }
    }
  }
  if (tid == 0) {
    p.new_seq_lens[b] = final_code == 0 ? prefix + n : prefix;
    if (p.status) p.status[b] = final_code;
  }
}

}  // namespace

void commit_accepted(const CommitParams& p, cudaStream_t stream) {
  kvpool_detail::check_device_cache(p.cache, p.page_table_stride);
  TREEMLA_CHECK(p.batch >= 1, "batch must be >= 1, got " << p.batch);
  TREEMLA_CHECK(
      p.max_accept >= 1 && p.max_accept <= kMaxTreeNodes,
      "max_accept must be in [1, " << kMaxTreeNodes << "] (kMaxTreeNodes), got " << p.max_accept);
  TREEMLA_CHECK(
      p.cache.row_bytes() <= (int64_t{1} << 30),
      "cache.row_width * elem_size = " << p.cache.row_bytes() << " bytes must be <= 1 GiB");
  TREEMLA_CHECK(p.page_table != nullptr, "page_table is null");
  TREEMLA_CHECK(p.prefix_lens != nullptr, "prefix_lens is null");
  TREEMLA_CHECK(p.accepted != nullptr, "accepted is null");
  TREEMLA_CHECK(p.accept_len != nullptr, "accept_len is null");
  TREEMLA_CHECK(p.new_seq_lens != nullptr, "new_seq_lens is null");
  CommitArgs a{p, static_cast<int32_t>(p.cache.row_bytes()),
               static_cast<int32_t>(p.cache.row_bytes() / 16)};
  commit_kernel<<<p.batch, kCommitThreads, 0, stream>>>(a);
  TREEMLA_CHECK_LAUNCH("commit_kernel");
}

}  // namespace treemla::cuda
