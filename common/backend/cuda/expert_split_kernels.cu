#include "common/backend/cuda/device_utils.cuh"
#include "common/backend/cuda/expert_split_kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

__global__ void __launch_bounds__(kThreads)
    SplitRoutingKernel(const int32_t* __restrict__ expert_ids, const float* __restrict__ weights,
                       int64_t slots, const int32_t* __restrict__ owner, int num_experts,
                       RoutingSplit split) {
  for (int64_t s = int64_t{blockIdx.x} * kThreads + threadIdx.x; s < slots;
       s += int64_t{gridDim.x} * kThreads) {
    const int32_t e = expert_ids[s];
    const int32_t w = e >= 0 && e < num_experts ? owner[e] : -1;
    const float weight = weights[s];
    for (int i = 0; i < split.count; ++i) {
      const bool mine = w == split.worker[i];
      split.ids[i][s] = mine ? e : -1;
      split.weights[i][s] = mine ? weight : 0.0f;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    SumPartialsKernel(PartialSet partials, int64_t elements, bf16* __restrict__ out) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < elements;
       i += int64_t{gridDim.x} * kThreads) {
    float sum = 0.0f;
    for (int p = 0; p < partials.count; ++p) sum += __bfloat162float(partials.parts[p][i]);
    out[i] = __float2bfloat16(sum);
  }
}

}  // namespace

cudaError_t LaunchSplitRouting(const int32_t* expert_ids, const float* weights, int64_t n,
                               int top_k, const int32_t* owner, int num_experts,
                               const RoutingSplit& split, cudaStream_t stream) {
  if (n < 0 || top_k <= 0 || num_experts <= 0 || split.count < 0 ||
      split.count > kMaxSplitTargets) {
    return cudaErrorInvalidValue;
  }
  const int64_t slots = n * top_k;
  if (slots == 0 || split.count == 0) return cudaSuccess;
  SplitRoutingKernel<<<GridFor(slots), kThreads, 0, stream>>>(expert_ids, weights, slots, owner,
                                                              num_experts, split);
  return cudaGetLastError();
}

cudaError_t LaunchSumPartials(const PartialSet& partials, int64_t elements, bf16* out,
                              cudaStream_t stream) {
  if (elements < 0 || partials.count < 0 || partials.count > kMaxSplitTargets) {
    return cudaErrorInvalidValue;
  }
  if (elements == 0) return cudaSuccess;
  SumPartialsKernel<<<GridFor(elements), kThreads, 0, stream>>>(partials, elements, out);
  return cudaGetLastError();
}

}  // namespace strata::gpu
