// The routed experts of one MoE layer for a batch of tokens, in one launch per stage however
// many experts are selected:
//   plan:     group the (token, slot) pairs by expert into work items of <= 16 slots
//   gate_up:  h[slot] = act(gate_e x + bg, up_e x + bu)         (bf16 [n * k, inter])
//   down:     y[slot] = down_e h[slot] + bd                       (float [n * k, hidden])
//   combine:  out[t] = sum over slots s in order of weight * y   (bf16 [n, hidden])
// Each expert's weights are read once per work item, i.e. once per up to 16 of its tokens (see
// ChunkTokens).
#ifndef STRATA_COMMON_CUDA_KERNELS_GROUPED_EXPERT_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_GROUPED_EXPERT_KERNELS_H_

#include <cstddef>

#include "common/cuda/cuda_types.h"
#include "common/cuda/grid_signal.h"

namespace strata::gpu {

inline constexpr int kMaxGroupedExperts = 1024;

// Device arrays indexed by expert id, each entry a device pointer to that expert's matrix in
// the standard row-major [out, in] layout (16-byte aligned). Experts that no slot selects may
// hold null.
struct ExpertWeightTable {
  WeightFormat format = WeightFormat::kBf16;
  int num_experts = 0;
  int64_t hidden = 0;                        // gate/up input and down output size
  int64_t intermediate = 0;                  // gate/up output and down input size
  const void* const* gate = nullptr;         // [inter, hidden] each
  const void* const* up = nullptr;           // [inter, hidden] each
  const void* const* down = nullptr;         // [hidden, inter] each
  const float* const* gate_scale = nullptr;  // FP8 only: [inter] each
  const float* const* up_scale = nullptr;    // FP8 only: [inter] each
  const float* const* down_scale = nullptr;  // FP8 only: [hidden] each
  const bf16* const* gate_bias = nullptr;    // null array or null entries: no bias
  const bf16* const* up_bias = nullptr;
  const bf16* const* down_bias = nullptr;
  // When set, [num_experts]: each launch adds 1 for every expert it runs (a tiered worker learns
  // what its replayed steps used without the host seeing the routing).
  uint32_t* use_counts = nullptr;
};

enum class GluActivation : int {
  kSwiGlu = 0,         // silu(g) * u
  kClampedSwiGlu = 1,  // gpt-oss: g = min(g, limit), u = clamp(u, +-limit),
                       //          (u + 1) * g * sigmoid(alpha * g)
};

struct GluParams {
  GluActivation activation = GluActivation::kSwiGlu;
  float alpha = 1.702f;
  float limit = 7.0f;
};

// Scratch of one call, carved from one allocation by CarveExpertWorkspace.
struct ExpertWorkspace {
  int32_t* sorted_slots = nullptr;  // [n * k] slot indices grouped by expert
  int32_t* work = nullptr;          // [max_work][4]: expert, first sorted slot, count, unused
  int32_t* num_work = nullptr;      // [1]
  bf16* h = nullptr;                // [n * k, intermediate]
  float* y = nullptr;               // [n * k, hidden]
};

size_t ExpertWorkspaceBytes(int64_t n, int top_k, int64_t hidden, int64_t intermediate);
// Splits `base` (ExpertWorkspaceBytes long, 256-byte aligned) into the workspace's arrays.
ExpertWorkspace CarveExpertWorkspace(void* base, int64_t n, int top_k, int64_t hidden,
                                     int64_t intermediate);

// expert_ids, weights: [n, top_k] routing (an id outside [0, experts.num_experts) skips the
// slot). The plan's work items are sized for the table's shape and the tensor-core switch
// below, so the gate-up and down stages that follow must be given the same table, with the
// switch unchanged (LaunchGroupedExperts reads it once for all of its stages). Launched apart,
// the stages of a prefill-sized step need x 16-byte aligned.
cudaError_t LaunchExpertPlan(const int32_t* expert_ids, int64_t n, int top_k,
                             const ExpertWeightTable& experts, const ExpertWorkspace& ws,
                             cudaStream_t stream);
// x: [n, hidden] bf16, packed.
cudaError_t LaunchExpertGateUp(const bf16* x, int64_t n, int top_k,
                               const ExpertWeightTable& experts, const GluParams& act,
                               const ExpertWorkspace& ws, cudaStream_t stream);
cudaError_t LaunchExpertDown(int64_t n, int top_k, const ExpertWeightTable& experts,
                             const ExpertWorkspace& ws, cudaStream_t stream);
// out: [n, hidden] bf16; tokens with no valid slot get zeros. `signal` once out is written.
cudaError_t LaunchExpertCombine(const int32_t* expert_ids, const float* weights, int64_t n,
                                int top_k, int num_experts, int64_t hidden,
                                const ExpertWorkspace& ws, bf16* out, cudaStream_t stream,
                                const GridSignal& signal = {});

// Steps of two tokens or more run gate/up and down on the tensor cores where the shapes allow
// (grouped_expert_mma.h), unless the tunable tensor_core_experts is off (STRATA_MMA_EXPERTS=0).
// Tests and benchmarks switch between the two kernels; a captured graph keeps the kernels it was
// captured with.
void SetTensorCoreExperts(bool on);
bool TensorCoreExperts();
// Prefill-sized steps on the tensor cores take 64-token shared-memory tiles
// (grouped_expert_mma.h) unless switched off here (benchmarks compare the two).
void SetTiledExperts(bool on);

// The four stages in order (two for one token); the last raises `signal` once out is written.
cudaError_t LaunchGroupedExperts(const bf16* x, const int32_t* expert_ids, const float* weights,
                                 int64_t n, int top_k, const ExpertWeightTable& experts,
                                 const GluParams& act, const ExpertWorkspace& ws, bf16* out,
                                 cudaStream_t stream, const GridSignal& signal = {});

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_GROUPED_EXPERT_KERNELS_H_
