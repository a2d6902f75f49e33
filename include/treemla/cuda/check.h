// CUDA error checks for host code: turn a cudaError_t into treemla::Error (public: engines use
// them).
#pragma once

#include <cuda_runtime_api.h>

#include "treemla/error.h"

#define TREEMLA_CUDA_CHECK(expr)                                                 \
  do {                                                                           \
    const cudaError_t treemla_err_ = (expr);                                     \
    TREEMLA_CHECK(treemla_err_ == cudaSuccess,                                   \
                  #expr << " failed: " << cudaGetErrorName(treemla_err_) << ": " \
                        << cudaGetErrorString(treemla_err_));                    \
  } while (0)

// After every launch: a launch error (bad configuration, missing kernel image) is reported here.
#define TREEMLA_CHECK_LAUNCH(what)                                                              \
  do {                                                                                          \
    const cudaError_t treemla_err_ = cudaGetLastError();                                        \
    TREEMLA_CHECK(treemla_err_ == cudaSuccess,                                                  \
                  "launch of " << what << " failed: " << cudaGetErrorName(treemla_err_) << ": " \
                               << cudaGetErrorString(treemla_err_));                            \
  } while (0)
