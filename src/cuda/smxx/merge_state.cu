// merge_state (architecture-generic): merge two attention states per (token, head) with
// natural-log LSEs, merge_state_v2 semantics. One warp per (token, head): every lane reads both
// LSEs before lane 0 writes s, so s may alias s_a or s_b; each lane reads its columns of v_a and
// v_b before writing them, so v may alias too.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/common/mma.cuh"
#include "cuda/smxx/kernels.h"

namespace treemla::cuda {

namespace {

constexpr int kMergeThreads = 256;

__device__ __forceinline__ float empty_to_neg_inf(float s) {
  return (isinf(s) || isnan(s)) ? -INFINITY : s;
}

template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    merge_state_kernel(const T* v_a, const float* s_a, const T* v_b, const float* s_b, T* v,
                       float* s, int64_t pairs, int dim) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMergeThreads / 32);
  for (int64_t pr = blockIdx.x * (kMergeThreads / 32) + (threadIdx.x >> 5); pr < pairs;
       pr += warps) {
    const float a = empty_to_neg_inf(s_a[pr]);
    const float b = empty_to_neg_inf(s_b[pr]);
    const float m = fmaxf(a, b);
    float wa = 0.f, wb = 0.f, lse = -INFINITY;
    if (m != -INFINITY) {
      wa = expf(a - m);
      wb = expf(b - m);
      const float sum = wa + wb;
      lse = m + logf(sum);
      wa /= sum;
      wb /= sum;
    }
    __syncwarp();
    if (lane == 0) s[pr] = lse;
    const T* pa = v_a + pr * dim;
    const T* pb = v_b + pr * dim;
    T* po = v + pr * dim;
    for (int c = lane; c < dim; c += 32) {
      const float x =
          wa == 0.f ? 0.f : wa * to_float<T>(pa[c]);  // an empty part's v may be garbage
      const float y = wb == 0.f ? 0.f : wb * to_float<T>(pb[c]);
      po[c] = from_float<T>(x + y);
    }
  }
}

template <typename T>
void launch(const void* v_a, const float* s_a, const void* v_b, const float* s_b, void* v, float* s,
            int64_t pairs, int dim, cudaStream_t stream) {
  const int64_t blocks64 = (pairs + kMergeThreads / 32 - 1) / (kMergeThreads / 32);
  const int blocks = static_cast<int>(blocks64 < 65535 ? (blocks64 > 0 ? blocks64 : 1) : 65535);
  merge_state_kernel<T><<<blocks, kMergeThreads, 0, stream>>>(static_cast<const T*>(v_a), s_a,
                                                              static_cast<const T*>(v_b), s_b,
                                                              static_cast<T*>(v), s, pairs, dim);
}

}  // namespace

void launch_merge_state(DType dtype, const void* v_a, const float* s_a, const void* v_b,
                        const float* s_b, void* v, float* s, int64_t tokens, int heads, int dim,
                        cudaStream_t stream) {
  const int64_t pairs = tokens * heads;
  switch (dtype) {
    case DType::kBF16:
      launch<__nv_bfloat16>(v_a, s_a, v_b, s_b, v, s, pairs, dim, stream);
      break;
    case DType::kFP16:
      launch<__half>(v_a, s_a, v_b, s_b, v, s, pairs, dim, stream);
      break;
    case DType::kFP32:
      launch<float>(v_a, s_a, v_b, s_b, v, s, pairs, dim, stream);
      break;
  }
}

}  // namespace treemla::cuda
