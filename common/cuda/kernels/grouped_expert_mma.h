// Grouped experts of a batch on the tensor cores: the gate/up and down stages of
// LaunchGroupedExperts for steps of two tokens or more, on the same plan and workspace as the
// CUDA-core kernels (grouped_expert_kernels.h). A warp computes 16 rows of one expert's matrix
// for up to 16 tokens of a work item with bf16 MMAs (m16n8k16, f32 accumulators); FP8 weights
// are converted to bf16 in registers and scaled per row after the sum. Internal to the CUDA
// backend: grouped_expert_kernels.cu decides when it applies.
#ifndef STRATA_COMMON_CUDA_KERNELS_GROUPED_EXPERT_MMA_H_
#define STRATA_COMMON_CUDA_KERNELS_GROUPED_EXPERT_MMA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/kernels/grouped_expert_kernels.h"

namespace strata::gpu {

// Whether the tensor-core kernels can take this table's shapes: both dims multiples of the
// 64-element slab a warp loads a row at a time (hence of the MMA's 16 rows); x and h rows
// 16-byte aligned follow from the dims (the caller checks x's base).
bool MmaExpertShapesFit(const ExpertWeightTable& w);

// Work items of up to `chunk` tokens (8 or 16); max_work as the plan's bound.
cudaError_t LaunchExpertGateUpMma(const bf16* x, int top_k, int chunk, int64_t max_work,
                                  const ExpertWeightTable& w, const GluParams& act,
                                  const ExpertWorkspace& ws, cudaStream_t stream);
cudaError_t LaunchExpertDownMma(int chunk, int64_t max_work, const ExpertWeightTable& w,
                                const ExpertWorkspace& ws, cudaStream_t stream);

// Prefill-sized steps (an active expert averaging kTiledChunkTokens / 2 slots or more): work
// items of up to kTiledChunkTokens tokens, a block computing 64 rows of an expert's matrices
// for all of them, the weights and the gathered token rows staged through shared memory (three
// stages, copied asynchronously), so each weight is read once per 64 tokens. Both dims
// multiples of 64; FP8 weights converted to bf16 as the MMA fragments are built.
inline constexpr int kTiledChunkTokens = 64;
bool TiledExpertShapesFit(const ExpertWeightTable& w);
cudaError_t LaunchExpertGateUpTiled(const bf16* x, int top_k, int64_t max_work,
                                    const ExpertWeightTable& w, const GluParams& act,
                                    const ExpertWorkspace& ws, cudaStream_t stream);
cudaError_t LaunchExpertDownTiled(int64_t max_work, const ExpertWeightTable& w,
                                  const ExpertWorkspace& ws, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_GROUPED_EXPERT_MMA_H_
