// One device's stream, cuBLASLt handle and cuBLASLt workspace, created together and released
// together. The kernels' launchers take plain cudaStream_t; this only owns what they share.
#ifndef STRATA_COMMON_CUDA_CUDA_CONTEXT_H_
#define STRATA_COMMON_CUDA_CUDA_CONTEXT_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace strata::gpu {

// CUDA devices usable by this process; 0 (not an error) when there is no driver or device.
int CudaDeviceCount();

// The 16 bytes that name device's GPU (cudaDeviceProp::uuid): the same in every process,
// whatever CUDA_VISIBLE_DEVICES numbers it.
absl::StatusOr<std::string> GpuUuid(int device);

class CudaContext {
 public:
  struct Options {
    int device = 0;
    size_t cublas_workspace_bytes = size_t{32} << 20;  // cuBLASLt's suggestion for Hopper
  };

  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(const Options& options);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  int num_sms() const { return num_sms_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  void* cublas_workspace() { return workspace_.data(); }
  size_t cublas_workspace_bytes() const { return workspace_.bytes(); }

  // Waits for everything queued on stream().
  absl::Status Synchronize();

 private:
  CudaContext() = default;

  int device_ = 0;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_CUDA_CONTEXT_H_
