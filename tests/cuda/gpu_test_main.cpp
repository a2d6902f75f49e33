// main() of treemla_gpu_tests. Without a usable CUDA device it runs nothing and exits with
// kNoGpuExitCode, which CTest reports as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt);
// with one it runs the tests, so a failing GPU test always fails, whatever it prints.
// --gtest_list_tests works without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

namespace {
constexpr int kNoGpuExitCode = 77;
}  // namespace

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    listing = listing || std::strcmp(argv[i], "--gtest_list_tests") == 0;
  if (!listing) {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "treemla_gpu_tests: no CUDA device (%s); exiting with %d (skipped)\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "device count 0", kNoGpuExitCode);
      return kNoGpuExitCode;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
