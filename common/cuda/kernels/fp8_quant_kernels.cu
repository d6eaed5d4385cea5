#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/fp8_quant.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

// One block per row: absmax, then quantize with the same division as the host version.
__global__ void __launch_bounds__(kThreads)
    QuantizeFp8Kernel(const bf16* __restrict__ w, int64_t in, uint8_t* __restrict__ q,
                      float* __restrict__ scales) {
  __shared__ float scratch[kThreads / kWarpSize];
  const int64_t o = blockIdx.x;
  const bf16* row = w + o * in;
  float absmax = 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += kThreads) {
    absmax = fmaxf(absmax, fabsf(__bfloat162float(row[i])));
  }
  absmax = WarpMax(absmax);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = absmax;
  __syncthreads();
  absmax = 0.0f;
  for (int i = 0; i < kThreads / kWarpSize; ++i) absmax = fmaxf(absmax, scratch[i]);
  const float scale = absmax > 0.0f ? absmax / kFp8E4M3Max : 1.0f;
  if (threadIdx.x == 0) scales[o] = scale;
  for (int64_t i = threadIdx.x; i < in; i += kThreads) {
    q[o * in + i] =
        __nv_cvt_float_to_fp8(__bfloat162float(row[i]) / scale, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

cudaError_t LaunchQuantizeFp8PerChannel(const bf16* w, int64_t out, int64_t in, uint8_t* q,
                                        float* scales, cudaStream_t stream) {
  if (out < 0 || in <= 0 || out > 0x7fffffff) return cudaErrorInvalidValue;
  if (out == 0) return cudaSuccess;
  QuantizeFp8Kernel<<<static_cast<unsigned>(out), kThreads, 0, stream>>>(w, in, q, scales);
  return cudaGetLastError();
}

}  // namespace strata::gpu
