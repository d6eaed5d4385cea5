// The gated activation of the grouped expert kernels (both the CUDA-core and the tensor-core
// ones). Included by .cu files only.
#ifndef STRATA_COMMON_CUDA_KERNELS_EXPERT_ACTIVATION_CUH_
#define STRATA_COMMON_CUDA_KERNELS_EXPERT_ACTIVATION_CUH_

#include "common/cuda/kernels/grouped_expert_kernels.h"

namespace strata::gpu {

__device__ __forceinline__ float Activate(float g, float u, const GluParams& act) {
  if (act.activation == GluActivation::kClampedSwiGlu) {
    g = fminf(g, act.limit);
    u = fminf(fmaxf(u, -act.limit), act.limit);
    return (u + 1.0f) * (g / (1.0f + expf(-act.alpha * g)));
  }
  return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ bool ValidExpert(int32_t e, int num_experts) {
  return e >= 0 && e < num_experts;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_EXPERT_ACTIVATION_CUH_
