#include "common/cuda/device_utils.cuh"
#include "common/cuda/grid_signal.cuh"
#include "common/cuda/kernels/norm_kernels.h"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

// Elements per access: 8 (16 bytes) on the vector path, else 1.
template <int kW>
__device__ __forceinline__ void Load(const bf16* p, float (&v)[kW]) {
  if constexpr (kW == 8) {
    UnpackBf16x8(*reinterpret_cast<const uint4*>(p), v);  // coherent: may read our own store
  } else {
    v[0] = __bfloat162float(*p);
  }
}

// x as the kernels before or another process wrote it: through L2, never a stale L1 line.
template <int kW>
__device__ __forceinline__ void LoadInput(const bf16* p, float (&v)[kW]) {
  if constexpr (kW == 8) {
    UnpackBf16x8(__ldcg(reinterpret_cast<const uint4*>(p)), v);
  } else {
    v[0] = __bfloat162float(__ldcg(p));
  }
}

template <int kW>
__device__ __forceinline__ void Store(bf16* p, const float (&v)[kW]) {
  if constexpr (kW == 8) {
    StoreBf16x8(p, v);
  } else {
    *p = __float2bfloat16(v[0]);
  }
}

// One block per row. With a residual, pass 1 writes residual + x (bf16) and pass 2 normalizes
// the rounded sum, so the fused and unfused paths agree bit for bit.
template <int kW, bool kAddResidual>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(bf16* residual, const bf16* x, const bf16* __restrict__ weight, int64_t dim,
                  float eps, bf16* out, const uint32_t* ready_flag) {
  __shared__ float scratch[kThreads / kWarpSize];
  if (ready_flag == nullptr) PdlLaunchDependents();
  PdlWait();
  if (ready_flag != nullptr) {
    BlockWaitForFlag(ready_flag);
    PdlLaunchDependents();
  }
  const int64_t row = blockIdx.x;
  const bf16* src = x + row * dim;
  bf16* res = kAddResidual ? residual + row * dim : nullptr;
  float sum_sq = 0.0f;
  for (int64_t i = int64_t{threadIdx.x} * kW; i < dim; i += int64_t{kThreads} * kW) {
    float v[kW];
    LoadInput<kW>(src + i, v);
    if constexpr (kAddResidual) {
      float r[kW];
      Load<kW>(res + i, r);
#pragma unroll
      for (int j = 0; j < kW; ++j) v[j] = __bfloat162float(__float2bfloat16(v[j] + r[j]));
      Store<kW>(res + i, v);
    }
#pragma unroll
    for (int j = 0; j < kW; ++j) sum_sq += v[j] * v[j];
  }
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
  const bf16* normed_src = kAddResidual ? res : src;
  bf16* dst = out + row * dim;
  for (int64_t i = int64_t{threadIdx.x} * kW; i < dim; i += int64_t{kThreads} * kW) {
    float v[kW], w[kW];
    Load<kW>(normed_src + i, v);
    Load<kW>(weight + i, w);
#pragma unroll
    for (int j = 0; j < kW; ++j) v[j] = w[j] * (v[j] * inv);
    Store<kW>(dst + i, v);
  }
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <bool kAddResidual>
cudaError_t Launch(bf16* residual, const bf16* x, const bf16* weight, int64_t n, int64_t dim,
                   float eps, bf16* out, cudaStream_t stream,
                   const uint32_t* ready_flag = nullptr) {
  if (n < 0 || dim <= 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool vec = dim % 8 == 0 && Aligned(x) && Aligned(weight) && Aligned(out) &&
                   (!kAddResidual || Aligned(residual));
  return LaunchPdl(vec ? RmsNormKernel<8, kAddResidual> : RmsNormKernel<1, kAddResidual>,
                   dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, residual, x, weight,
                   dim, eps, out, ready_flag);
}

}  // namespace

cudaError_t LaunchRmsNorm(const bf16* x, const bf16* weight, int64_t n, int64_t dim, float eps,
                          bf16* out, cudaStream_t stream) {
  return Launch<false>(nullptr, x, weight, n, dim, eps, out, stream);
}

cudaError_t LaunchAddRmsNorm(bf16* residual, const bf16* x, const bf16* weight, int64_t n,
                             int64_t dim, float eps, bf16* out, cudaStream_t stream,
                             const uint32_t* ready_flag) {
  if (residual == out) return cudaErrorInvalidValue;
  return Launch<true>(residual, x, weight, n, dim, eps, out, stream, ready_flag);
}

}  // namespace strata::gpu
