// CUDA driver functions looked up through the runtime: linking libcuda itself would keep every
// binary from starting on a machine without the NVIDIA driver (CPU-only hosts run them too).
#ifndef STRATA_COMMON_CUDA_DRIVER_API_H_
#define STRATA_COMMON_CUDA_DRIVER_API_H_

#include <cuda.h>

#include "absl/status/status.h"

namespace strata::gpu {

// The driver's `symbol` (its CUDA 12.0 version), or null where the driver lacks it.
void* FindDriverFunction(const char* symbol);

template <typename Fn>
bool FindDriverFunction(const char* symbol, Fn* fn) {
  *fn = reinterpret_cast<Fn>(FindDriverFunction(symbol));
  return *fn != nullptr;
}

// OK for CUDA_SUCCESS; otherwise INTERNAL naming `call` and the driver's error.
absl::Status DriverStatus(CUresult result, const char* call);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_DRIVER_API_H_
