#include "common/transport/fp8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/tensor/dtype.h"

namespace strata {

void QuantizeRowsFp8(absl::Span<const float> x, int64_t rows, int64_t cols,
                     absl::Span<uint8_t> codes, absl::Span<float> scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * cols;
    // Eight running maxima: one would be a chain of dependent comparisons.
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= cols; i += 8) {
      for (int l = 0; l < 8; ++l) {
        const float a = std::fabs(row[i + l]);
        lanes[l] = a > lanes[l] ? a : lanes[l];
      }
    }
    float absmax = 0.0f;
    for (; i < cols; ++i) absmax = std::max(absmax, std::fabs(row[i]));
    for (const float lane : lanes) absmax = std::max(absmax, lane);
    const float scale = absmax > 0.0f && std::isfinite(absmax) ? absmax / kFp8E4M3MaxValue : 1.0f;
    const float inverse = 1.0f / scale;
    scales[r] = scale;
    uint8_t* out = codes.data() + r * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] = FastFloatToFp8E4M3(row[j] * inverse);
  }
}

void DequantizeRowsFp8(absl::Span<const uint8_t> codes, absl::Span<const float> scales,
                       int64_t rows, int64_t cols, absl::Span<float> out) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = codes.data() + r * cols;
    const float scale = scales[r];
    float* row = out.data() + r * cols;
    for (int64_t i = 0; i < cols; ++i) row[i] = Fp8E4M3ToFloat(in[i]) * scale;
  }
}

}  // namespace strata
