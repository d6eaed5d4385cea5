// Small per-element kernels: bias add after a GEMM, a float add into bf16, FP8 weight
// dequantization, and the shared expert's sigmoid-gated add (Qwen2-MoE).
#ifndef STRATA_COMMON_CUDA_KERNELS_ELEMENTWISE_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_ELEMENTWISE_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// y[t][o] += bias[o] for y [n, out] row-major, bf16 or float by y_type.
cudaError_t LaunchAddBias(void* y, OutType y_type, const bf16* bias, int64_t n, int64_t out,
                          cudaStream_t stream);

// y[i] += x[i] for i < count (a host tier's float partial sums into the device's bf16 ones).
cudaError_t LaunchAddFloat(bf16* y, const float* x, int64_t count, cudaStream_t stream);

// w[o][i] = scale[o] * fp8[o][i] as bf16, for [out, in] row-major.
cudaError_t LaunchDequantizeFp8(const uint8_t* fp8, const float* scale, int64_t out, int64_t in,
                                bf16* w, cudaStream_t stream);

// out[t] += sigmoid(x[t] . gate_weight) * shared_out[t] for t < n; x, shared_out and out are
// [n, hidden] row-major, gate_weight [hidden] (the [1, hidden] shared_expert_gate) or null: an
// ungated shared expert, added whole.
cudaError_t LaunchSharedExpertGateAdd(const bf16* x, const bf16* gate_weight,
                                      const bf16* shared_out, int64_t n, int64_t hidden, bf16* out,
                                      cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_ELEMENTWISE_KERNELS_H_
