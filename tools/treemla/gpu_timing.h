// Timing for the GPU benchmarks: the median of many launches, each bracketed by CUDA events.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "treemla/cuda/check.h"

namespace treemla::tool {

// launch(i) enqueues the work of repetition i (warm-ups first) on `stream`; returns the median
// time in milliseconds of `reps` timed repetitions.
template <typename F>
double median_ms(cudaStream_t stream, F&& launch, int warmup, int reps) {
  cudaEvent_t e0, e1;
  TREEMLA_CUDA_CHECK(cudaEventCreate(&e0));
  TREEMLA_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) launch(i);
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    TREEMLA_CUDA_CHECK(cudaEventRecord(e0, stream));
    launch(warmup + i);
    TREEMLA_CUDA_CHECK(cudaEventRecord(e1, stream));
    TREEMLA_CUDA_CHECK(cudaEventSynchronize(e1));
    TREEMLA_CUDA_CHECK(cudaEventElapsedTime(&t[i], e0, e1));
  }
  TREEMLA_CUDA_CHECK(cudaEventDestroy(e0));
  TREEMLA_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

}  // namespace treemla::tool
