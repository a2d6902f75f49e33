// Host side of the device status record (device_status.h): read back, clear, hand to the check.
#include "cuda/common/device_status.h"
#include "treemla/cuda/check.h"

namespace treemla::cuda {

DeviceStatus take_device_status(DeviceStatus* status, cudaStream_t stream) {
  DeviceStatus h{};
  TREEMLA_CUDA_CHECK(cudaMemcpyAsync(&h, status, sizeof h, cudaMemcpyDeviceToHost, stream));
  TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (h.code == kStatusOk) return h;
  TREEMLA_CUDA_CHECK(cudaMemsetAsync(status, 0, sizeof h, stream));
  TREEMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

}  // namespace treemla::cuda
