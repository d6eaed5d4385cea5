// Element types and small enums shared by the CUDA kernels' launch headers. Plain C++: host
// code includes these headers without nvcc.
#ifndef STRATA_COMMON_CUDA_CUDA_TYPES_H_
#define STRATA_COMMON_CUDA_CUDA_TYPES_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::gpu {

using bf16 = __nv_bfloat16;

// How a weight matrix [out, in] is stored: row-major bf16, or row-major FP8 E4M3 bytes with one
// float scale per output row (w[o][i] = scale[o] * fp8[o][i]).
enum class WeightFormat : int { kBf16 = 0, kFp8E4M3 = 1 };

// Element type of a kernel's output.
enum class OutType : int { kBf16 = 0, kF32 = 1 };

// A weight matrix [out, in] in device memory, row-major, with its FP8 per-row scales and its
// optional bias.
struct DeviceWeight {
  const void* data = nullptr;  // bf16 or FP8 E4M3 bytes, by `format`
  WeightFormat format = WeightFormat::kBf16;
  int64_t out = 0;
  int64_t in = 0;
  const float* scale = nullptr;  // [out]; FP8 only
  const bf16* bias = nullptr;    // [out], or null
};

// The largest FP8 E4M3 magnitude; per-channel scales are absmax / kFp8E4M3Max.
inline constexpr float kFp8E4M3Max = 448.0f;

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_CUDA_TYPES_H_
