// RMSNorm over rows (bf16 in and out, bf16 weight, float32 math), plain and fused with the
// residual add that precedes it in every transformer block.
#ifndef STRATA_COMMON_CUDA_KERNELS_NORM_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_NORM_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight for t < n; x, out are [n, dim] row-major.
// In place (out == x) is fine.
cudaError_t LaunchRmsNorm(const bf16* x, const bf16* weight, int64_t n, int64_t dim, float eps,
                          bf16* out, cudaStream_t stream);

// residual[t] += x[t] (rounded to bf16), then out[t] = RmsNorm(residual[t]). out may alias x
// but not residual. ready_flag: x is behind a device flag (another process's output, ready once
// *ready_flag >= 1): each block waits for it itself, after the kernels before are done (they
// may lower it), and lets the next kernel in only then, so the launch may come in early and
// wait on the SMs with a block a row instead of a polling kernel and a launch after it.
cudaError_t LaunchAddRmsNorm(bf16* residual, const bf16* x, const bf16* weight, int64_t n,
                             int64_t dim, float eps, bf16* out, cudaStream_t stream,
                             const uint32_t* ready_flag = nullptr);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_NORM_KERNELS_H_
