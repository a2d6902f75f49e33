// Host-side handles of the main kernel instantiations (one .cu file each, compiled in parallel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm80/verify_traits.h"

namespace treemla::cuda {

// Address of verify_main_kernel<T, Tr>, for cudaLaunchKernel / cudaFuncSetAttribute.
template <typename T, class Tr>
const void* verify_main_kernel_ptr();

}  // namespace treemla::cuda
