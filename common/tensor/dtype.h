// Element types of stored weights and their conversion to float32.
#ifndef STRATA_COMMON_TENSOR_DTYPE_H_
#define STRATA_COMMON_TENSOR_DTYPE_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

// kF8E4M3: FP8 E4M3 (finite, no infinities), stored with float32 scales per output row or per
// block (WeightMatrix::ScaleAt); LoadAsFloat reads the unscaled value.
enum class DType { kF32, kBF16, kF16, kF8E4M3 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "BF16", "F16", "F8_E4M3".
absl::string_view DTypeName(DType dtype);
// Parses a safetensors dtype string; other types (I8, U8, F8_E5M2, ...) are rejected.
absl::StatusOr<DType> ParseDType(absl::string_view name);

inline float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as torch does when casting to bfloat16.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToFloat(uint16_t v);
uint16_t FloatToF16(float f);

// FP8 E4M3 (the OCP "fn" variant: 0x7f / 0xff are NaN, largest finite 448).
inline constexpr float kFp8E4M3MaxValue = 448.0f;

namespace dtype_internal {

constexpr float Pow2(int k) {
  float r = 1.0f;
  for (; k > 0; --k) r *= 2.0f;
  for (; k < 0; ++k) r /= 2.0f;
  return r;
}

constexpr std::array<float, 256> MakeFp8E4M3Table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    const int exponent = (v >> 3) & 0xf, mantissa = v & 0x7;
    float magnitude = exponent == 0 ? mantissa * Pow2(-9) : (8 + mantissa) * Pow2(exponent - 10);
    if (exponent == 0xf && mantissa == 0x7) magnitude = std::numeric_limits<float>::quiet_NaN();
    t[v] = (v & 0x80) != 0 ? -magnitude : magnitude;
  }
  return t;
}

inline constexpr std::array<float, 256> kFp8E4M3Values = MakeFp8E4M3Table();

}  // namespace dtype_internal

inline float Fp8E4M3ToFloat(uint8_t v) { return dtype_internal::kFp8E4M3Values[v]; }
// Round to nearest even, saturating to +-448: CUDA's __nv_cvt_float_to_fp8(f, __NV_SATFINITE,
// __NV_E4M3) for every float but NaN (all 2^32 inputs compared on the host).
uint8_t FloatToFp8E4M3(float f);

// FP8 E4M3 with one scale per row of a [out, in] row-major bf16 matrix (raw bits): scales[o] =
// max |row o| / 448 (1 for an all-zero row), codes = FloatToFp8E4M3(w / scale). The CUDA
// backend's device quantizer (LaunchQuantizeFp8PerChannel) gives the same bytes.
void QuantizeBf16RowsToFp8E4M3(const uint16_t* w, int64_t out, int64_t in, uint8_t* codes,
                               float* scales);

// Reads element `i` of a buffer of `dtype` as float32.
inline float LoadAsFloat(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3:
      return Fp8E4M3ToFloat(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace strata

#endif  // STRATA_COMMON_TENSOR_DTYPE_H_
