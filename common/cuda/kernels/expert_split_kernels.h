// The router's side of running one MoE layer in several expert workers that read device
// buffers (CUDA IPC): each worker's copy of the gate's routing, with the slots of experts it
// does not run set to -1, and the sum of the workers' partial outputs.
#ifndef STRATA_COMMON_CUDA_KERNELS_EXPERT_SPLIT_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_EXPERT_SPLIT_KERNELS_H_

#include "common/cuda/cuda_types.h"
#include "common/cuda/grid_signal.h"

namespace strata::gpu {

inline constexpr int kMaxSplitTargets = 16;

// Where each worker's routing goes: `worker[i]`'s slots into ids[i] / weights[i].
struct RoutingSplit {
  int count = 0;
  int32_t worker[kMaxSplitTargets] = {};
  int32_t* ids[kMaxSplitTargets] = {};
  float* weights[kMaxSplitTargets] = {};
};

// The layer's input for the workers: x ([n, hidden] bf16) copied to `input`.
struct SplitInput {
  const bf16* x = nullptr;
  bf16* input = nullptr;
  int64_t hidden = 0;
};

// Copies the input, and for every target i and slot s of [n, top_k]: ids[i][s] =
// expert_ids[s] and weights[i][s] = weights[s] when owner[expert_ids[s]] == worker[i], else -1
// and 0. `owner` has num_experts entries; ids outside [0, num_experts) go to no worker. Then
// `signal` (the workers' input flags) once all of it is visible.
cudaError_t LaunchSplitRouting(const SplitInput& in, const int32_t* expert_ids,
                               const float* weights, int64_t n, int top_k, const int32_t* owner,
                               int num_experts, const RoutingSplit& split, const GridSignal& signal,
                               cudaStream_t stream);

// Only `signal`, as a split with nothing to copy or split raises it.
cudaError_t LaunchSignal(const GridSignal& signal, cudaStream_t stream);

// The workers' partial sums, up to kMaxSplitTargets of them.
struct PartialSet {
  int count = 0;
  const bf16* parts[kMaxSplitTargets] = {};
};

// out[i] = sum over the parts of parts[p][i] (in float, rounded once), i < elements.
cudaError_t LaunchSumPartials(const PartialSet& partials, int64_t elements, bf16* out,
                              cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_EXPERT_SPLIT_KERNELS_H_
