// The MoE gate kernels' limits, in plain C++ without CUDA headers: CPU builds check a model
// against them (cuda_model_support.cc) before a GPU is ever asked to run it.
#ifndef STRATA_COMMON_CUDA_KERNELS_MOE_GATE_LIMITS_H_
#define STRATA_COMMON_CUDA_KERNELS_MOE_GATE_LIMITS_H_

namespace strata::gpu {

// A token's scores live in registers and shared memory sized for this many experts.
inline constexpr int kMaxGateExperts = 384;  // Kimi-K2's
inline constexpr int kMaxGateTopK = 8;

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_MOE_GATE_LIMITS_H_
