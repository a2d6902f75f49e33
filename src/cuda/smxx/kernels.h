// Launchers of the architecture-generic kernels (schedule, combine, merge_state).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/common/verify_kernel_params.h"
#include "treemla/dtype.h"

namespace treemla::cuda {

// The launch attribute of programmatic dependent launch (the kernel may start while the one
// before it in the stream finishes; it waits for it in pdl_wait, verify_device.cuh).
inline cudaLaunchAttribute pdl_launch_attr() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

void launch_verify_schedule(const VerifyKernelParams& kp, cudaStream_t stream);
// Merges split partials into o / lse and resets the work counter for the next call. pdl: launch
// it so that it may start while the main kernel finishes (it waits for it: pdl_wait).
cudaError_t launch_verify_combine(const VerifyKernelParams& kp, int grid, bool pdl,
                                  cudaStream_t stream);
void launch_merge_state(DType dtype, const void* v_a, const float* s_a, const void* v_b,
                        const float* s_b, void* v, float* s, int64_t tokens, int heads, int dim,
                        cudaStream_t stream);

}  // namespace treemla::cuda
