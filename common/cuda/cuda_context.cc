#include "common/cuda/cuda_context.h"

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"

namespace strata::gpu {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls do not see it
    return 0;
  }
  return count;
}

absl::StatusOr<std::string> GpuUuid(int device) {
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes));
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(const Options& options) {
  const int count = CudaDeviceCount();
  if (options.device < 0 || options.device >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", options.device, " requested, ", count, " present"));
  }
  std::unique_ptr<CudaContext> context(new CudaContext());
  context->device_ = options.device;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&context->num_sms_, cudaDevAttrMultiProcessorCount, options.device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&context->stream_, cudaStreamNonBlocking));
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&context->cublaslt_));
  absl::StatusOr<DeviceBuffer<unsigned char>> workspace =
      DeviceBuffer<unsigned char>::Allocate(options.cublas_workspace_bytes);
  if (!workspace.ok()) return workspace.status();
  context->workspace_ = std::move(*workspace);
  return context;
}

CudaContext::~CudaContext() {
  // Best effort: pending work must finish before the workspace and stream go away.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  workspace_.Reset();
  if (cublaslt_ != nullptr) cublasLtDestroy(cublaslt_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaContext::Synchronize() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace strata::gpu
