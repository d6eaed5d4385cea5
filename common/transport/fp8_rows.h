// Activations as FP8 E4M3 with one float32 scale per row (per token), for links where bytes
// cost more than the conversion: a row's scale is max |x| / 448 (1 for an all-zero row), its
// codes FloatToFp8E4M3(x / scale), and a value comes back as code * scale. Four bytes become
// one (plus four per row); each value is off by at most max(|x| / 16, scale / 1024): E4M3
// keeps 3 mantissa bits (round to nearest, half an ulp is 1/16 of the value) and steps by
// 2^-9 below 2^-6 (half a step is 2^-10 of the scale).
#ifndef STRATA_COMMON_TRANSPORT_FP8_ROWS_H_
#define STRATA_COMMON_TRANSPORT_FP8_ROWS_H_

#include <cstdint>
#include <cstring>

#include "absl/types/span.h"

namespace strata {

// FloatToFp8E4M3 (common/tensor/dtype.h), bit for bit, without library calls or branches:
// round to nearest even, saturating to +-448, NaN to NaN.
inline uint8_t FastFloatToFp8E4M3(float f) {
  // Branch-free and in signed 32-bit lanes, so that the loops below vectorize.
  int32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const int32_t sign = (bits >> 24) & 0x80;
  bits &= 0x7fffffff;
  float a;
  std::memcpy(&a, &bits, sizeof(a));
  // Normal: keep 3 of the 23 mantissa bits, rounding to nearest even (a carry moves into the
  // exponent), then rebias the exponent from 127 to 7. Below 448 nothing rounds past 448.
  const int32_t normal = ((bits + 0x7ffff + ((bits >> 20) & 1)) >> 20) - ((127 - 7) << 3);
  // Below 2^-6: subnormal codes step by 2^-9 (adding 1.5 * 2^23 rounds to an integer, to
  // nearest even); 8 steps round up into the smallest normal, whose code is 8. (Clamped
  // first: the conversion to int must stay in range on the lanes not taken.)
  const float small = a < 0.015625f ? a : 0.015625f;
  const float magic = 12582912.0f;
  const int32_t subnormal = static_cast<int32_t>((small * 512.0f + magic) - magic);
  int32_t code = bits < 0x3c800000 ? subnormal : normal;
  code = bits >= 0x43e00000 ? 0x7e : code;  // 448 and above (infinity too) saturate
  code = bits > 0x7f800000 ? 0x7f : code;   // NaN
  return static_cast<uint8_t>(sign | code);
}

// x [rows, cols] row-major -> codes [rows, cols] and scales [rows].
void QuantizeRowsFp8(absl::Span<const float> x, int64_t rows, int64_t cols,
                     absl::Span<uint8_t> codes, absl::Span<float> scales);

// codes [rows, cols] and scales [rows] -> out [rows, cols].
void DequantizeRowsFp8(absl::Span<const uint8_t> codes, absl::Span<const float> scales,
                       int64_t rows, int64_t cols, absl::Span<float> out);

// The bound above for a value x of a row with `scale`.
inline float Fp8RowErrorBound(float x, float scale) {
  const float a = x < 0 ? -x : x;
  const float relative = a / 16.0f, absolute = scale / 1024.0f;
  return (relative > absolute ? relative : absolute) * (1.0f + 1e-6f);
}

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_FP8_ROWS_H_
