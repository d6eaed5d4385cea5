#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/moe_gate_kernels.h"
#include "common/cuda/kernels/moe_gate_select.cuh"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

constexpr int kThreads = 128;  // one warp per token
constexpr int kPerLane = kMaxGateExperts / kWarpSize;

// Lane l holds experts l, l + 32, ...; top k by k rounds of a warp-wide arg-max.
__global__ void __launch_bounds__(kThreads)
    MoeGateKernel(const float* __restrict__ logits, int64_t n, MoeGateParams p,
                  int32_t* __restrict__ expert_ids, float* __restrict__ weights) {
  PdlLaunchDependents();
  PdlWait();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t t = int64_t{blockIdx.x} * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  if (t >= n) return;
  const float* row = logits + t * p.num_experts;
  float v[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarpSize;
    v[i] = e < p.num_experts ? row[e] / p.temperature : -INFINITY;
  }
  if (p.scoring == GateScoring::kSoftmaxThenTopK) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) m = fmaxf(m, v[i]);
    m = WarpMax(m);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      v[i] = e < p.num_experts ? expf(v[i] - m) : 0.0f;
      sum += v[i];
    }
    sum = WarpSum(sum);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) v[i] /= sum;
  }

  unsigned taken = 0;  // bit i: this lane's expert lane + 32 i is already selected
  float kept[kMaxGateTopK];
  int kept_id[kMaxGateTopK];
#pragma unroll
  for (int round = 0; round < kMaxGateTopK; ++round) {
    if (round >= p.top_k) break;
    float best = -INFINITY;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < p.num_experts && !(taken >> i & 1u) && RanksBefore(v[i], e, best, best_id)) {
        best = v[i];
        best_id = e;
      }
    }
    WarpArgmax(best, best_id);
    // No valid expert left (NaN scores) leaves best_id past the end: nothing to mark.
    if (best_id < p.num_experts && best_id % kWarpSize == lane) {
      taken |= 1u << (best_id / kWarpSize);
    }
    kept[round] = best;
    kept_id[round] = best_id;
  }

  if (lane == 0) {
    WriteGateSelection(kept, kept_id, p, expert_ids + t * p.top_k, weights + t * p.top_k);
  }
}

// One thread a token; the block sums its tokens' counts before three atomics.
__global__ void ScorePredictionKernel(const int32_t* predicted, const int32_t* actual, int64_t n,
                                      int top_k, unsigned long long* counts) {
  __shared__ unsigned long long sums[3];
  if (threadIdx.x < 3) sums[threadIdx.x] = 0;
  __syncthreads();
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t < n) {
    unsigned long long guessed = 0, right = 0, picked = 0;
    const int32_t* want = predicted + t * top_k;
    const int32_t* got = actual + t * top_k;
    for (int j = 0; j < top_k; ++j) {
      guessed += want[j] >= 0;
      picked += got[j] >= 0;
      if (got[j] < 0) continue;
      for (int i = 0; i < top_k; ++i) right += want[i] == got[j];
    }
    atomicAdd(&sums[0], guessed);
    atomicAdd(&sums[1], right);
    atomicAdd(&sums[2], picked);
  }
  __syncthreads();
  if (threadIdx.x < 3) atomicAdd(&counts[threadIdx.x], sums[threadIdx.x]);
}

}  // namespace

cudaError_t LaunchScoreRoutingPrediction(const int32_t* predicted, const int32_t* actual, int64_t n,
                                         int top_k, unsigned long long* counts,
                                         cudaStream_t stream) {
  if (n < 0 || top_k < 1 || top_k > kMaxGateTopK) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  constexpr int kScoreThreads = 128;
  ScorePredictionKernel<<<static_cast<unsigned>((n + kScoreThreads - 1) / kScoreThreads),
                          kScoreThreads, 0, stream>>>(predicted, actual, n, top_k, counts);
  return cudaGetLastError();
}

bool ValidMoeGateParams(const MoeGateParams& p) {
  return p.num_experts > 0 && p.num_experts <= kMaxGateExperts && p.top_k > 0 &&
         p.top_k <= kMaxGateTopK && p.top_k <= p.num_experts && p.temperature > 0.0f;
}

cudaError_t LaunchMoeGate(const float* logits, int64_t n, const MoeGateParams& params,
                          int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (n < 0 || !ValidMoeGateParams(params)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads / kWarpSize - 1) / (kThreads / kWarpSize);
  return LaunchPdl(MoeGateKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                   logits, n, params, expert_ids, weights);
}

}  // namespace strata::gpu
