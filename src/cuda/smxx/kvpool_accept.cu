// Device-driven acceptance of verified trees (architecture-generic): for each request, the
// longest path of draft nodes whose tokens the target confirms, as tree::accept_path. The kernel
// reads every length, parent and token from device memory and has a grid fixed by the batch size,
// so a CUDA graph captured once replays with new trees; commit_accepted (kvpool_commit.cu) then
// moves the accepted rows.
#include <cuda_runtime.h>

#include <cstdint>

#include "treemla/attention.h"
#include "treemla/cuda/check.h"
#include "treemla/cuda/kvpool.h"

namespace treemla::cuda {

namespace {

constexpr int kAcceptThreads = 128;

// ---- accept_kernel ------------------------------------------------------------------------------
// Grid: one CTA per request; the CTA owns its request's outputs (row b of accepted, accept_len[b],
// bonus_tokens[b], status[b]) and no CTA reads another's, so CTAs need no ordering.
// Phase 1 (all threads): load parents, node tokens and target tokens of the request into shared
// memory and check the parent array; __syncthreads_or makes the verdict uniform.
// Phase 2 (warp 0): the walk of tree::accept_path. That function scans j = 1..n-1 once, moving to
// j when parents[j] == cur and node_tokens[j] == target[cur]; children have larger indices than
// their parent, so the first match after cur is the lowest-index child carrying the token. The
// warp checks the 32 candidates [base, base + 32) against the current cur at once: if none
// matches, the sequential scan would pass all of them with cur unchanged; otherwise its first
// match is the lowest matching lane, after which it resumes at that node + 1 -- exactly the
// warp's next base. All lanes hold the same cur/base (ballot results are uniform).
// __syncthreads, then phase 3 (all threads): write the outputs, -1 past the path.
__global__ void __launch_bounds__(kAcceptThreads) accept_kernel(const AcceptParams p) {
  __shared__ int32_t s_parent[kMaxTreeNodes], s_token[kMaxTreeNodes], s_target[kMaxTreeNodes];
  __shared__ int32_t s_path[kMaxTreeNodes];
  __shared__ int32_t s_len, s_bonus;
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int32_t q0 = __ldg(p.q_indptr + b);
  const int32_t n = __ldg(p.q_indptr + b + 1) - q0;
  KvStatus code = (q0 < 0 || n < 1 || n > kMaxTreeNodes) ? KvStatus::kBadTreeSize : KvStatus::kOk;
  if (code == KvStatus::kOk) {  // uniform
    bool bad = false;
    for (int j = tid; j < n; j += kAcceptThreads) {
      const int32_t par = __ldg(p.parents + q0 + j);
      s_parent[j] = par;
      s_token[j] = __ldg(p.node_tokens + q0 + j);
      s_target[j] = __ldg(p.target_tokens + q0 + j);
      bad |= j == 0 ? par != -1 : (par < 0 || par >= j);
    }
    if (__syncthreads_or(bad)) code = KvStatus::kBadParents;
  }
  if (code == KvStatus::kOk && tid < 32) {
    const int lane = tid;
    int32_t cur = 0, len = 1, t = s_target[0], base = 1;
    if (lane == 0) s_path[0] = 0;
    while (base < n && len < p.max_accept) {
      const int32_t j = base + lane;
      const bool hit = j < n && s_parent[j] == cur && s_token[j] == t;
      const unsigned m = __ballot_sync(0xffffffffu, hit);
      if (m) {
        cur = base + __ffs(m) - 1;
        t = s_target[cur];
        if (lane == 0) s_path[len] = cur;
        ++len;
        base = cur + 1;
      } else {
        base += 32;
      }
    }
    if (lane == 0) {
      s_len = len;
      s_bonus = t;
    }
  }
  __syncthreads();
  const int32_t len = code == KvStatus::kOk ? s_len : 0;
  int32_t* row = p.accepted + int64_t{b} * p.max_accept;
  for (int k = tid; k < p.max_accept; k += kAcceptThreads) row[k] = k < len ? s_path[k] : -1;
  if (tid == 0) {
    p.accept_len[b] = len;
    p.bonus_tokens[b] = code == KvStatus::kOk ? s_bonus : -1;
    if (p.status) p.status[b] = static_cast<int32_t>(code);
  }
}

}  // namespace

void accept_paths(const AcceptParams& p, cudaStream_t stream) {
  TREEMLA_CHECK(p.batch >= 1, "batch must be >= 1, got " << p.batch);
  TREEMLA_CHECK(
      p.max_accept >= 1 && p.max_accept <= kMaxTreeNodes,
      "max_accept must be in [1, " << kMaxTreeNodes << "] (kMaxTreeNodes), got " << p.max_accept);
  TREEMLA_CHECK(p.q_indptr != nullptr, "q_indptr is null");
  TREEMLA_CHECK(p.parents != nullptr, "parents is null");
  TREEMLA_CHECK(p.node_tokens != nullptr, "node_tokens is null");
  TREEMLA_CHECK(p.target_tokens != nullptr, "target_tokens is null");
  TREEMLA_CHECK(p.accepted != nullptr, "accepted is null");
  TREEMLA_CHECK(p.accept_len != nullptr, "accept_len is null");
  TREEMLA_CHECK(p.bonus_tokens != nullptr, "bonus_tokens is null");
  accept_kernel<<<p.batch, kAcceptThreads, 0, stream>>>(p);
  TREEMLA_CHECK_LAUNCH("accept_kernel");
}

}  // namespace treemla::cuda
