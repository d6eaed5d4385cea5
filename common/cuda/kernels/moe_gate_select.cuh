// The last step of the MoE gate's selection, shared by the gate kernels: the top k scores of a
// token in rank order -> the weights LaunchMoeGate documents. Included by .cu files only.
#ifndef STRATA_COMMON_CUDA_KERNELS_MOE_GATE_SELECT_CUH_
#define STRATA_COMMON_CUDA_KERNELS_MOE_GATE_SELECT_CUH_

#include "common/cuda/kernels/moe_gate_kernels.h"

namespace strata::gpu {

// kept[0, top_k): the selected scores (probabilities for kSoftmaxThenTopK, scaled logits for
// kTopKThenSoftmax, unbiased sigmoid scores for kSigmoidGrouped), best first; kept_id the experts.
// Writes ids[i], weights[i] for i < top_k.
__device__ __forceinline__ void WriteGateSelection(float (&kept)[kMaxGateTopK],
                                                   const int (&kept_id)[kMaxGateTopK],
                                                   const MoeGateParams& p,
                                                   int32_t* __restrict__ ids,
                                                   float* __restrict__ weights) {
  if (p.scoring == GateScoring::kTopKThenSoftmax) {
    const float m = kept[0];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxGateTopK; ++i) {
      if (i < p.top_k) {
        kept[i] = expf(kept[i] - m);
        sum += kept[i];
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxGateTopK; ++i) kept[i] /= sum;
  } else if (p.scoring == GateScoring::kSigmoidGrouped) {
    // routing.cc's order of operations, with its guard against a zero sum.
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxGateTopK; ++i) sum += i < p.top_k ? kept[i] : 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxGateTopK; ++i) {
      if (p.renormalize) kept[i] /= sum + 1e-20f;
      kept[i] *= p.scaling;
    }
  } else if (p.renormalize) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxGateTopK; ++i) sum += i < p.top_k ? kept[i] : 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxGateTopK; ++i) kept[i] /= sum;
  }
#pragma unroll
  for (int i = 0; i < kMaxGateTopK; ++i) {
    if (i < p.top_k) {
      ids[i] = kept_id[i];
      weights[i] = kept[i];
    }
  }
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_MOE_GATE_SELECT_CUH_
