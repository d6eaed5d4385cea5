#include <algorithm>

#include "common/cuda/device_utils.cuh"
#include "common/cuda/grid_signal.cuh"
#include "common/cuda/kernels/expert_split.cuh"
#include "common/cuda/kernels/expert_split_kernels.h"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

__global__ void __launch_bounds__(kThreads)
    SplitRoutingKernel(const uint4* __restrict__ x, uint4* __restrict__ input, int64_t vectors,
                       const int32_t* __restrict__ expert_ids, const float* __restrict__ weights,
                       int64_t slots, const int32_t* __restrict__ owner, int num_experts,
                       RoutingSplit split, GridSignal signal) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < vectors;
       i += int64_t{gridDim.x} * kThreads) {
    input[i] = x[i];
  }
  for (int64_t s = int64_t{blockIdx.x} * kThreads + threadIdx.x; s < slots;
       s += int64_t{gridDim.x} * kThreads) {
    const int32_t e = expert_ids[s];
    WriteSplitSlot(split, s, e, weights[s], e >= 0 && e < num_experts ? owner[e] : -1);
  }
  SignalGridDone(signal);
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

cudaError_t LaunchSplitRouting(const SplitInput& in, const int32_t* expert_ids,
                               const float* weights, int64_t n, int top_k, const int32_t* owner,
                               int num_experts, const RoutingSplit& split, const GridSignal& signal,
                               cudaStream_t stream) {
  // The copy moves 16-byte vectors: both buffers are allocations (256-byte aligned) and a
  // hidden size that is a multiple of 8 keeps every row whole.
  const bool aligned = reinterpret_cast<uintptr_t>(in.x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(in.input) % 16 == 0 && in.hidden % 8 == 0;
  if (n < 0 || top_k <= 0 || num_experts <= 0 || split.count < 0 ||
      split.count > kMaxSplitTargets || !ValidSignal(signal) ||
      (n > 0 && (in.x == nullptr || in.input == nullptr || in.hidden <= 0 || !aligned))) {
    return cudaErrorInvalidValue;
  }
  const int64_t slots = n * top_k;
  const int64_t vectors = n * in.hidden / 8;
  if (slots == 0 && signal.count == 0) return cudaSuccess;
  return LaunchPdl(SplitRoutingKernel, dim3(GridFor(std::max(slots, vectors))), dim3(kThreads), 0,
                   stream, reinterpret_cast<const uint4*>(in.x), reinterpret_cast<uint4*>(in.input),
                   vectors, expert_ids, weights, slots, owner, num_experts, split, signal);
}

cudaError_t LaunchSignal(const GridSignal& signal, cudaStream_t stream) {
  if (signal.count == 0 || !ValidSignal(signal)) return cudaErrorInvalidValue;
  SplitRoutingKernel<<<1, kThreads, 0, stream>>>(nullptr, nullptr, 0, nullptr, nullptr, 0, nullptr,
                                                 0, RoutingSplit(), signal);
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
