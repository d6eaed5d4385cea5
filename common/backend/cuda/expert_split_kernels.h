// The router's side of running one MoE layer in several expert workers that read device
// buffers (CUDA IPC): each worker's copy of the gate's routing, with the slots of experts it
// does not run set to -1, and the sum of the workers' partial outputs.
#ifndef STRATA_COMMON_BACKEND_CUDA_EXPERT_SPLIT_KERNELS_H_
#define STRATA_COMMON_BACKEND_CUDA_EXPERT_SPLIT_KERNELS_H_

#include "common/backend/cuda/cuda_types.h"

namespace strata::gpu {

inline constexpr int kMaxSplitTargets = 16;

// Where each worker's routing goes: `worker[i]`'s slots into ids[i] / weights[i].
struct RoutingSplit {
  int count = 0;
  int32_t worker[kMaxSplitTargets] = {};
  int32_t* ids[kMaxSplitTargets] = {};
  float* weights[kMaxSplitTargets] = {};
};

// For every target i and slot s of [n, top_k]: ids[i][s] = expert_ids[s] and weights[i][s] =
// weights[s] when owner[expert_ids[s]] == worker[i], else -1 and 0. `owner` has num_experts
// entries; ids outside [0, num_experts) go to no worker.
cudaError_t LaunchSplitRouting(const int32_t* expert_ids, const float* weights, int64_t n,
                               int top_k, const int32_t* owner, int num_experts,
                               const RoutingSplit& split, cudaStream_t stream);

// The workers' partial sums, up to kMaxSplitTargets of them.
struct PartialSet {
  int count = 0;
  const bf16* parts[kMaxSplitTargets] = {};
};

// out[i] = sum over the parts of parts[p][i] (in float, rounded once), i < elements.
cudaError_t LaunchSumPartials(const PartialSet& partials, int64_t elements, bf16* out,
                              cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_EXPERT_SPLIT_KERNELS_H_
