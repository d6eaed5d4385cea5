// The MoE gate's selection: gate logits -> (expert id, weight) for the top k experts of each
// token, in either scoring order the supported models use.
#ifndef STRATA_COMMON_CUDA_KERNELS_MOE_GATE_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_MOE_GATE_KERNELS_H_

#include "common/cuda/cuda_types.h"
#include "common/cuda/kernels/moe_gate_limits.h"

namespace strata::gpu {

enum class GateScoring : int {
  kSoftmaxThenTopK = 0,  // softmax over all experts, keep the top k (optionally renormalized)
  kTopKThenSoftmax = 1,  // keep the top k logits, softmax over those (gpt-oss)
  // Sigmoid scores; the top k by score + correction_bias among the best top_k_groups groups
  // (a group's merit: the sum of its two best biased scores), weighted by the unbiased scores,
  // renormalized (+1e-20) when asked, times `scaling` (DeepSeek-V3, GLM-4.5).
  kSigmoidGrouped = 2,
};

struct MoeGateParams {
  int num_experts = 0;       // <= kMaxGateExperts
  int top_k = 0;             // <= kMaxGateTopK and <= num_experts
  float temperature = 1.0f;  // logits are divided by it first; > 0
  GateScoring scoring = GateScoring::kSoftmaxThenTopK;
  bool renormalize = false;  // SoftmaxThenTopK, SigmoidGrouped: kept weights sum to 1
  // kSigmoidGrouped only:
  const float* correction_bias = nullptr;  // [num_experts], device, or null (zeros)
  int num_groups = 1;                      // divides num_experts
  int top_k_groups = 1;                    // <= num_groups
  float scaling = 1.0f;                    // routed_scaling_factor
};

// The limits above, and a positive temperature.
bool ValidMoeGateParams(const MoeGateParams& params);

// logits: [n, num_experts] float; expert_ids, weights: [n, top_k], in order of decreasing
// score, ties to the lower expert id.
cudaError_t LaunchMoeGate(const float* logits, int64_t n, const MoeGateParams& params,
                          int32_t* expert_ids, float* weights, cudaStream_t stream);

// How well `predicted` [n, top_k] guessed `actual` [n, top_k] (expert ids, -1 for none): adds
// to counts[0] the predicted picks, to counts[1] those of them the token's actual picks hold,
// to counts[2] the actual picks.
cudaError_t LaunchScoreRoutingPrediction(const int32_t* predicted, const int32_t* actual, int64_t n,
                                         int top_k, unsigned long long* counts,
                                         cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_MOE_GATE_KERNELS_H_
