// Element types of stored weights and their conversion to float32.
#ifndef STRATA_COMMON_TENSOR_DTYPE_H_
#define STRATA_COMMON_TENSOR_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class DType { kF32, kBF16, kF16 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "BF16", "F16".
absl::string_view DTypeName(DType dtype);
// Parses a safetensors dtype string; other types (I8, U8, F8_E4M3, ...) are rejected.
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

// Reads element `i` of a buffer of `dtype` as float32.
inline float LoadAsFloat(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace strata

#endif  // STRATA_COMMON_TENSOR_DTYPE_H_
