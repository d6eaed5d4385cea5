#include "common/cuda/driver_api.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"

namespace strata::gpu {

void* FindDriverFunction(const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return address;
}

absl::Status DriverStatus(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed with CUDA driver error ", result));
}

}  // namespace strata::gpu
