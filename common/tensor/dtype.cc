#include "common/tensor/dtype.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", name, "\" (supported: F32, BF16, F16, F8_E4M3)"));
}

float F16ToFloat(uint16_t v) {
  const uint32_t sign = (v >> 15) & 1u;
  const uint32_t exponent = (v >> 10) & 0x1fu;
  const uint32_t mantissa = v & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t FloatToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {           // subnormal half
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  int exponent;
  const float m = std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1)
  uint32_t mantissa = static_cast<uint32_t>(std::nearbyint(std::ldexp(m, 11)));  // 11 bits
  if (mantissa == 2048) {
    mantissa = 1024;
    ++exponent;
  }
  return sign | static_cast<uint16_t>(((exponent + 14) << 10) | (mantissa & 0x3ffu));
}

uint8_t FloatToFp8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80u : 0u;
  if (std::isnan(f)) return sign | 0x7fu;
  const float a = std::fabs(f);
  if (a >= kFp8E4M3MaxValue) return sign | 0x7eu;  // 448; the next step (480) is out of range
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormals step by 2^-9; 8 steps round up into the smallest normal, whose code is 8.
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int exponent;
  std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1)
  --exponent;                // a = 1.xxx * 2^exponent, exponent in [-6, 8]
  int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exponent)));  // in [8, 16]
  if (q == 16) {
    q = 8;
    ++exponent;
  }
  const int code = ((exponent + 7) << 3) | (q - 8);
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

void QuantizeBf16RowsToFp8E4M3(const uint16_t* w, int64_t out, int64_t in, uint8_t* codes,
                               float* scales) {
  for (int64_t o = 0; o < out; ++o) {
    const uint16_t* row = w + o * in;
    float absmax = 0.0f;
    for (int64_t i = 0; i < in; ++i) absmax = std::max(absmax, std::fabs(Bf16ToFloat(row[i])));
    const float scale = absmax > 0.0f ? absmax / kFp8E4M3MaxValue : 1.0f;
    scales[o] = scale;
    for (int64_t i = 0; i < in; ++i)
      codes[o * in + i] = FloatToFp8E4M3(Bf16ToFloat(row[i]) / scale);
  }
}

}  // namespace strata
