// y = W x (+ bias) for a few tokens: memory-bound, so each weight row is streamed once with
// 16-byte loads for all tokens. bf16 or FP8 E4M3 (per-row scale) weights, bf16 activations,
// float32 accumulation, bf16 or float32 output.
#ifndef STRATA_COMMON_CUDA_KERNELS_GEMV_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_GEMV_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// Tokens one launch handles; LaunchGemv loops over groups of this many.
inline constexpr int kGemvMaxTokens = 16;

// Whether 2-16 tokens of an [out, in] matrix run on the tensor cores (rows a multiple of 16,
// in of 64; 16-byte aligned rows and x as for the vector path), not the CUDA-core kernel.
bool GemvTensorCoresFit(int64_t out, int64_t in);

// y[t][o] = scale[o] * (w[o] . x[t]) + bias[o] for t < n, o < w.out. x rows are x_stride
// elements apart, y rows y_stride; y is bf16 or float by y_type. The 16-byte path needs w.in a
// multiple of the vector width and aligned rows; other shapes take a scalar path.
cudaError_t LaunchGemv(const DeviceWeight& w, const bf16* x, int64_t x_stride, int64_t n, void* y,
                       OutType y_type, int64_t y_stride, cudaStream_t stream);

// Several matrices of one format and input size applied to the same x in one launch (q, k and
// v of an attention layer): y[i] = w[i] x, each output packed ([n, w[i].out]). At most
// kGemvMaxSegments matrices; any n (loops over groups of kGemvMaxTokens tokens).
inline constexpr int kGemvMaxSegments = 4;
cudaError_t LaunchGemvMulti(const DeviceWeight* const* w, void* const* y, int count, const bf16* x,
                            int64_t n, OutType y_type, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_GEMV_KERNELS_H_
