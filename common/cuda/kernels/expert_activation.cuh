// The gated activation of the grouped expert kernels (the CUDA-core and the tensor-core ones),
// and the work item a tensor-core block takes and the stores of its MMA sums. Included by .cu
// files only.
#ifndef STRATA_COMMON_CUDA_KERNELS_EXPERT_ACTIVATION_CUH_
#define STRATA_COMMON_CUDA_KERNELS_EXPERT_ACTIVATION_CUH_

#include "common/cuda/device_utils.cuh"
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

// The work item of block row y: expert, first sorted slot, token count (0 past the plan's).
struct Item {
  int expert, first, count;
};
__device__ __forceinline__ Item ItemAt(const ExpertWorkspace& ws) {
  if (static_cast<int>(blockIdx.y) >= *ws.num_work) return {0, 0, 0};
  const int32_t* item = ws.work + 4 * blockIdx.y;
  return {item[0], item[1], item[2]};
}

// Calls store(n, i, row, slot) for each of one warp's MMA sums acc[.][n][i] for 16 rows from
// row0 and kNt x 8 tokens of item `it`: row row0 + lane / 4 + 8 (i / 2), token
// 8 n + 2 (lane % 4) + i % 2 of the item (its sorted slot); tokens past its count are dropped.
template <int kNt, typename Store>
__device__ __forceinline__ void ForEachSum(int64_t row0, const Item& it, const ExpertWorkspace& ws,
                                           Store&& store) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = 8 * n + 2 * t + i % 2;
      if (tok < it.count) store(n, i, row0 + g + 8 * (i / 2), ws.sorted_slots[it.first + tok]);
    }
  }
}

// The sums scaled per row (FP8) and biased: h[slot] = act(gate, up) ...
template <typename WT, int kNt>
__device__ __forceinline__ void StoreGateUp(const float (&acc)[2][kNt][4], int64_t row0,
                                            const Item& it, const ExpertWeightTable& w,
                                            const GluParams& act, const ExpertWorkspace& ws) {
  const bool gate_biased = w.gate_bias != nullptr && w.gate_bias[it.expert] != nullptr;
  const bool up_biased = w.up_bias != nullptr && w.up_bias[it.expert] != nullptr;
  ForEachSum<kNt>(row0, it, ws, [&](int n, int i, int64_t row, int64_t slot) {
    float gv = acc[0][n][i], uv = acc[1][n][i];
    if constexpr (sizeof(WT) == 1) {
      gv *= w.gate_scale[it.expert][row];
      uv *= w.up_scale[it.expert][row];
    }
    if (gate_biased) gv += __bfloat162float(w.gate_bias[it.expert][row]);
    if (up_biased) uv += __bfloat162float(w.up_bias[it.expert][row]);
    ws.h[slot * w.intermediate + row] = __float2bfloat16(Activate(gv, uv, act));
  });
}

// ... or y[slot] = down.
template <typename WT, int kNt>
__device__ __forceinline__ void StoreDown(const float (&acc)[1][kNt][4], int64_t row0,
                                          const Item& it, const ExpertWeightTable& w,
                                          const ExpertWorkspace& ws) {
  const bool biased = w.down_bias != nullptr && w.down_bias[it.expert] != nullptr;
  ForEachSum<kNt>(row0, it, ws, [&](int n, int i, int64_t row, int64_t slot) {
    float v = acc[0][n][i];
    if constexpr (sizeof(WT) == 1) v *= w.down_scale[it.expert][row];
    if (biased) v += __bfloat162float(w.down_bias[it.expert][row]);
    ws.y[slot * w.hidden + row] = v;
  });
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_EXPERT_ACTIVATION_CUH_
