// absl::Status from CUDA runtime and cuBLAS return codes, and early-return macros for them.
#ifndef STRATA_COMMON_CUDA_CUDA_STATUS_H_
#define STRATA_COMMON_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace strata::gpu {

// OK for cudaSuccess; otherwise an error naming the failed call, the CUDA error and file:line.
// Out of memory maps to RESOURCE_EXHAUSTED, invalid arguments to INVALID_ARGUMENT, a missing
// device or driver to UNAVAILABLE, everything else to INTERNAL.
absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line);
absl::Status CublasStatus(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace strata::gpu

// Returns the error status from the enclosing function if `expr` (a cudaError_t) fails.
#define CUDA_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                 \
    const cudaError_t strata_cuda_error_ = (expr);                                     \
    if (strata_cuda_error_ != cudaSuccess) {                                           \
      return ::strata::gpu::CudaStatus(strata_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

// Same for a cublasStatus_t.
#define CUBLAS_RETURN_IF_ERROR(expr)                                                        \
  do {                                                                                      \
    const cublasStatus_t strata_cublas_status_ = (expr);                                    \
    if (strata_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                   \
      return ::strata::gpu::CublasStatus(strata_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

#endif  // STRATA_COMMON_CUDA_CUDA_STATUS_H_
