// The device side of RoutingSplit (expert_split_kernels.h), shared by the split kernel and the
// gate kernel's hand-off (norm_gate_kernels.h). Included by .cu files only.
#ifndef STRATA_COMMON_CUDA_KERNELS_EXPERT_SPLIT_CUH_
#define STRATA_COMMON_CUDA_KERNELS_EXPERT_SPLIT_CUH_

#include "common/cuda/kernels/expert_split_kernels.h"

namespace strata::gpu {

// Slot s of every target's routing: expert e and its weight where e's worker (`owner`, -1 for
// none) is the target's, else -1 and 0.
__device__ __forceinline__ void WriteSplitSlot(const RoutingSplit& split, int64_t s, int32_t e,
                                               float weight, int32_t owner) {
  for (int i = 0; i < split.count; ++i) {
    const bool mine = owner == split.worker[i];
    split.ids[i][s] = mine ? e : -1;
    split.weights[i][s] = mine ? weight : 0.0f;
  }
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_EXPERT_SPLIT_CUH_
