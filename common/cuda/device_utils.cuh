// Device-side helpers shared by the .cu files: warp/block reductions and 16-byte vector loads
// of bf16 and FP8 E4M3 converted to float. Included only by nvcc-compiled sources.
#ifndef STRATA_COMMON_CUDA_DEVICE_UTILS_CUH_
#define STRATA_COMMON_CUDA_DEVICE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::gpu {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// (value, index) ranks before another: larger value, ties to the lower index. NaN never does.
__device__ __forceinline__ bool RanksBefore(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// Leaves every lane of the warp with the (value, index) that ranks first among the lanes'.
__device__ __forceinline__ void WarpArgmax(float& best, int& idx) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, best, offset);
    const int oi = __shfl_xor_sync(kFullMask, idx, offset);
    if (RanksBefore(ov, oi, best, idx)) {
      best = ov;
      idx = oi;
    }
  }
}

// `op` over the block, returned to every thread: warp_reduce within each warp, then `op` over
// the warps' results in warp order. `scratch` holds one float per warp; the block size is a
// multiple of 32. Contains __syncthreads: call from all threads.
template <typename WarpReduce, typename Op>
__device__ __forceinline__ float BlockReduce(float v, float* scratch, WarpReduce warp_reduce,
                                             Op op) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_reduce(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = scratch[0];
  for (int w = 1; w < num_warps; ++w) total = op(total, scratch[w]);
  return total;
}

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  return BlockReduce(v, scratch, WarpSum, [](float a, float b) { return a + b; });
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  return BlockReduce(v, scratch, WarpMax, [](float a, float b) { return fmaxf(a, b); });
}

__device__ __forceinline__ bool IsAligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The 8 bf16 of a 16-byte vector as float.
__device__ __forceinline__ void UnpackBf16x8(const uint4& raw, float (&v)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
}

// Loads kN consecutive elements starting at p as float. kN == 1 is a scalar load; otherwise
// p is 16-byte aligned and kN * sizeof(T) is a multiple of 16.
template <int kN>
__device__ __forceinline__ void LoadAsFloat(const __nv_bfloat16* p, float (&out)[kN]) {
  if constexpr (kN == 1) {
    out[0] = __bfloat162float(p[0]);
  } else {
    static_assert(kN % 8 == 0, "bf16 vectors are 8 wide");
#pragma unroll
    for (int v = 0; v < kN / 8; ++v) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p) + v);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        out[v * 8 + 2 * j] = f.x;
        out[v * 8 + 2 * j + 1] = f.y;
      }
    }
  }
}

template <int kN>
__device__ __forceinline__ void LoadAsFloat(const uint8_t* p, float (&out)[kN]) {
  if constexpr (kN == 1) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(p[0], __NV_E4M3);
    out[0] = __half2float(__half(h));
  } else {
    static_assert(kN % 16 == 0, "fp8 vectors are 16 wide");
#pragma unroll
    for (int v = 0; v < kN / 16; ++v) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p) + v);
      const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3);
        const float2 f = __half22float2(__half2(h2));
        out[v * 16 + 2 * j] = f.x;
        out[v * 16 + 2 * j + 1] = f.y;
      }
    }
  }
}

// Stores 8 floats as 8 bf16 (round to nearest even) with one 16-byte store.
__device__ __forceinline__ void StoreBf16x8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ void StoreOut(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void StoreOut(float* p, float v) { *p = v; }

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_DEVICE_UTILS_CUH_
