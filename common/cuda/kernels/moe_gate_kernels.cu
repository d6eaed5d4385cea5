#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/moe_gate_kernels.h"
#include "common/cuda/kernels/moe_gate_select.cuh"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

constexpr int kThreads = 128;  // one warp per token
// Scores a lane holds: 8 up to 256 experts, 12 up to 384 (Kimi-K2).
constexpr int kMaxPerLane = kMaxGateExperts / kWarpSize;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Group-limited choice: a group's merit is the sum of its two best biased scores; experts
// outside the top_k_groups best groups (ties to the lower group) get -inf, so they never win.
template <int kPerLane>
__device__ void DropWeakGroups(float (&v)[kPerLane], const MoeGateParams& p, int lane, int warp) {
  __shared__ float staged[kThreads / kWarpSize][kMaxGateExperts];
  __shared__ float merit[kThreads / kWarpSize][kMaxGateExperts];
  float* score = staged[warp];
  float* group_merit = merit[warp];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarpSize;
    if (e < p.num_experts) score[e] = v[i];
  }
  __syncwarp();
  const int per_group = p.num_experts / p.num_groups;
  for (int g = lane; g < p.num_groups; g += kWarpSize) {
    float first = -INFINITY, second = -INFINITY;
    for (int j = 0; j < per_group; ++j) {
      const float x = score[g * per_group + j];
      if (x > first) {
        second = first;
        first = x;
      } else if (x > second) {
        second = x;
      }
    }
    group_merit[g] = per_group > 1 ? first + second : first;
  }
  __syncwarp();
  // A lane's experts belong to groups it ranks on its own: rank = groups that rank before.
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarpSize;
    if (e >= p.num_experts) continue;
    const int g = e / per_group;
    int rank = 0;
    for (int o = 0; o < p.num_groups; ++o) {
      rank += RanksBefore(group_merit[o], o, group_merit[g], g) ? 1 : 0;
    }
    if (rank >= p.top_k_groups) v[i] = -INFINITY;
  }
}

// Lane l holds experts l, l + 32, ...; top k by k rounds of a warp-wide arg-max.
template <int kPerLane>
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

  const bool sigmoid = p.scoring == GateScoring::kSigmoidGrouped;
  if (sigmoid) {
    // Ranked by biased score (v); the weights are the unbiased scores, recomputed below.
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < p.num_experts) {
        v[i] = Sigmoid(v[i]) + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);
      }
    }
    if (p.top_k_groups < p.num_groups) {
      DropWeakGroups(v, p, lane, threadIdx.x / kWarpSize);
    }
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
    kept[round] = sigmoid && best_id < p.num_experts ? Sigmoid(row[best_id] / p.temperature) : best;
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
  const bool groups_ok = p.num_groups >= 1 && p.num_experts % p.num_groups == 0 &&
                         p.top_k_groups >= 1 && p.top_k_groups <= p.num_groups;
  return p.num_experts > 0 && p.num_experts <= kMaxGateExperts && p.top_k > 0 &&
         p.top_k <= kMaxGateTopK && p.top_k <= p.num_experts && p.temperature > 0.0f &&
         (p.scoring != GateScoring::kSigmoidGrouped || groups_ok);
}

cudaError_t LaunchMoeGate(const float* logits, int64_t n, const MoeGateParams& params,
                          int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (n < 0 || !ValidMoeGateParams(params)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads / kWarpSize - 1) / (kThreads / kWarpSize);
  if (params.num_experts <= 8 * kWarpSize) {
    return LaunchPdl(MoeGateKernel<8>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                     stream, logits, n, params, expert_ids, weights);
  }
  return LaunchPdl(MoeGateKernel<kMaxPerLane>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                   0, stream, logits, n, params, expert_ids, weights);
}

}  // namespace strata::gpu
