#include "common/backend/cuda/fp8_quant.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace strata::gpu {
namespace {

float Bf16BitsToFloat(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

void QuantizeFp8PerChannel(const uint16_t* w, int64_t out, int64_t in, uint8_t* q, float* scales) {
  for (int64_t o = 0; o < out; ++o) {
    const uint16_t* row = w + o * in;
    float absmax = 0.0f;
    for (int64_t i = 0; i < in; ++i) absmax = std::max(absmax, std::fabs(Bf16BitsToFloat(row[i])));
    const float scale = absmax > 0.0f ? absmax / kFp8E4M3Max : 1.0f;
    scales[o] = scale;
    for (int64_t i = 0; i < in; ++i) {
      // cuda_fp8.h's conversion runs on the host too: the same rounding as the device.
      q[o * in + i] =
          __nv_cvt_float_to_fp8(Bf16BitsToFloat(row[i]) / scale, __NV_SATFINITE, __NV_E4M3);
    }
  }
}

}  // namespace strata::gpu
