// treemla info: build configuration and visible GPUs.
#include <iostream>

#include "cli.h"
#include "commands.h"
#include "treemla/attention.h"

#ifdef TREEMLA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "treemla/cuda/verify.h"
#endif

namespace treemla::tool {

int cmd_info(int argc, char** argv) {
  CLI::App app("Prints the build configuration and the GPUs this build can use.", "treemla info");
  cli::configure(app);
  if (const auto rc = cli::parse(app, argc, argv)) return *rc;
  std::cout << "treemla 0.1.0\n"
            << "  MLA widths: q/k " << kHeadDimQK << ", v " << kHeadDimV << "; heads 1.."
            << kMaxHeads << "; tree nodes per request 1.." << kMaxTreeNodes << "\n";
#ifdef TREEMLA_WITH_CUDA
  std::cout << "  CUDA kernels: built for " << cuda::compiled_architectures() << "\n";
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  std::cout << "  visible GPUs: " << n << "\n";
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d);
    std::cout << "    " << d << ": " << p.name << " sm_" << p.major << p.minor << ", "
              << p.multiProcessorCount << " SMs, " << optin << " B shared memory per block\n";
  }
#else
  std::cout << "  CUDA kernels: not built (CPU-only build)\n";
#endif
  return 0;
}

}  // namespace treemla::tool
