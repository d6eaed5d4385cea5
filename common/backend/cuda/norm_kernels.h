// RMSNorm over rows (bf16 in and out, bf16 weight, float32 math), plain and fused with the
// residual add that precedes it in every transformer block.
#ifndef STRATA_COMMON_BACKEND_CUDA_NORM_KERNELS_H_
#define STRATA_COMMON_BACKEND_CUDA_NORM_KERNELS_H_

#include "common/backend/cuda/cuda_types.h"

namespace strata::gpu {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight for t < n; x, out are [n, dim] row-major.
// In place (out == x) is fine.
cudaError_t LaunchRmsNorm(const bf16* x, const bf16* weight, int64_t n, int64_t dim, float eps,
                          bf16* out, cudaStream_t stream);

// residual[t] += x[t] (rounded to bf16), then out[t] = RmsNorm(residual[t]). out may alias x
// but not residual. late_trigger: the next kernel is let in only once this one's wait is over
// (for a launch that itself comes in early, ahead of a wait that may be long).
cudaError_t LaunchAddRmsNorm(bf16* residual, const bf16* x, const bf16* weight, int64_t n,
                             int64_t dim, float eps, bf16* out, cudaStream_t stream,
                             bool late_trigger = false);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_NORM_KERNELS_H_
