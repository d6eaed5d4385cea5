#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/elementwise_kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    AddBiasKernel(T* __restrict__ y, const bf16* __restrict__ bias, int64_t total, int64_t out) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    if constexpr (sizeof(T) == 4) {
      y[i] += __bfloat162float(bias[i % out]);
    } else {
      y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(bias[i % out]));
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    DequantizeFp8Kernel(const uint8_t* __restrict__ fp8, const float* __restrict__ scale,
                        int64_t total, int64_t in, bf16* __restrict__ w) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    float v[1];
    LoadAsFloat<1>(fp8 + i, v);
    w[i] = __float2bfloat16(v[0] * scale[i / in]);
  }
}

// One block per token: the gate's dot product, then the scaled add.
__global__ void __launch_bounds__(kThreads)
    SharedExpertGateAddKernel(const bf16* __restrict__ x, const bf16* __restrict__ gate_weight,
                              const bf16* __restrict__ shared_out, int64_t hidden,
                              bf16* __restrict__ out) {
  __shared__ float scratch[kThreads / kWarpSize];
  const int64_t t = blockIdx.x;
  float gate = 1.0f;  // ungated shared experts (DeepSeek-V3, GLM-4.5)
  if (gate_weight != nullptr) {
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
      dot += __bfloat162float(x[t * hidden + i]) * __bfloat162float(gate_weight[i]);
    }
    dot = BlockSum(dot, scratch);
    gate = 1.0f / (1.0f + expf(-dot));
  }
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    const int64_t j = t * hidden + i;
    out[j] = __float2bfloat16(__bfloat162float(out[j]) + gate * __bfloat162float(shared_out[j]));
  }
}

__global__ void __launch_bounds__(kThreads)
    AddFloatKernel(bf16* __restrict__ y, const float* __restrict__ x, int64_t total) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + x[i]);
  }
}

unsigned GridFor(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

cudaError_t LaunchAddBias(void* y, OutType y_type, const bf16* bias, int64_t n, int64_t out,
                          cudaStream_t stream) {
  if (n < 0 || out <= 0) return cudaErrorInvalidValue;
  const int64_t total = n * out;
  if (total == 0) return cudaSuccess;
  if (y_type == OutType::kF32) {
    AddBiasKernel<<<GridFor(total), kThreads, 0, stream>>>(static_cast<float*>(y), bias, total,
                                                           out);
  } else {
    AddBiasKernel<<<GridFor(total), kThreads, 0, stream>>>(static_cast<bf16*>(y), bias, total, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddFloat(bf16* y, const float* x, int64_t count, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  AddFloatKernel<<<GridFor(count), kThreads, 0, stream>>>(y, x, count);
  return cudaGetLastError();
}

cudaError_t LaunchDequantizeFp8(const uint8_t* fp8, const float* scale, int64_t out, int64_t in,
                                bf16* w, cudaStream_t stream) {
  if (out <= 0 || in <= 0) return cudaErrorInvalidValue;
  DequantizeFp8Kernel<<<GridFor(out * in), kThreads, 0, stream>>>(fp8, scale, out * in, in, w);
  return cudaGetLastError();
}

cudaError_t LaunchSharedExpertGateAdd(const bf16* x, const bf16* gate_weight,
                                      const bf16* shared_out, int64_t n, int64_t hidden, bf16* out,
                                      cudaStream_t stream) {
  if (n < 0 || hidden <= 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  SharedExpertGateAddKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      x, gate_weight, shared_out, hidden, out);
  return cudaGetLastError();
}

}  // namespace strata::gpu
