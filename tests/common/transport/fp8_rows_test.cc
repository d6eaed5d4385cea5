// FP8 E4M3 activations with a scale per row: the fast conversion equals the reference one bit
// for bit, and a round trip stays within the documented bound.
#include "common/transport/fp8_rows.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/tensor/dtype.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(Fp8RowsTest, FastConversionMatchesTheReference) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               448.0f,
                               -448.0f,
                               449.0f,
                               463.99f,
                               464.0f,
                               1e30f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::ldexp(1.0f, -6),
                               std::ldexp(1.0f, -6) * 0.999f,
                               std::ldexp(1.0f, -9),
                               std::ldexp(1.0f, -10),
                               std::ldexp(1.5f, -10),
                               std::ldexp(1.0f, -11),
                               1e-30f,
                               std::numeric_limits<float>::denorm_min()};
  // Halfway cases between neighbouring codes (ties go to even), and every code's own value.
  for (int code = 0; code < 0x7e; ++code) {
    const float a = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    const float b = Fp8E4M3ToFloat(static_cast<uint8_t>(code + 1));
    values.push_back(a);
    values.push_back((a + b) / 2);
    values.push_back(std::nextafter((a + b) / 2, 0.0f));
    values.push_back(std::nextafter((a + b) / 2, 1e9f));
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t b = bits(rng);
    b = (b & 0x807fffffu) | ((100u + (b >> 23) % 40u) << 23);  // exponents around FP8's range
    float f;
    std::memcpy(&f, &b, sizeof(f));
    values.push_back(f);
  }
  for (const float f : values) {
    for (const float v : {f, -f}) {
      ASSERT_EQ(FastFloatToFp8E4M3(v), FloatToFp8E4M3(v)) << v;
    }
  }
  EXPECT_EQ(FastFloatToFp8E4M3(std::nanf("")) & 0x7f, 0x7f);
}

TEST(Fp8RowsTest, RoundTripStaysWithinTheBound) {
  const int64_t rows = 64, cols = 256;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    // Rows of very different magnitudes, some with an outlier, one all zeros.
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 24) - 12);
    for (int64_t i = 0; i < cols; ++i) x[r * cols + i] = r == 5 ? 0.0f : normal(rng) * magnitude;
    if (r % 7 == 3) x[r * cols + r % cols] = 200.0f * magnitude;
  }
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(rows), back(x.size());
  QuantizeRowsFp8(x, rows, cols, absl::MakeSpan(codes), absl::MakeSpan(scales));
  DequantizeRowsFp8(codes, scales, rows, cols, absl::MakeSpan(back));
  double worst_relative = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float absmax = 0;
    for (int64_t i = 0; i < cols; ++i) absmax = std::max(absmax, std::fabs(x[r * cols + i]));
    EXPECT_FLOAT_EQ(scales[r], absmax > 0 ? absmax / 448.0f : 1.0f) << "row " << r;
    double err = 0, norm = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const float v = x[r * cols + i], q = back[r * cols + i];
      ASSERT_LE(std::fabs(v - q), Fp8RowErrorBound(v, scales[r])) << "row " << r << " col " << i;
      err += double(v - q) * (v - q);
      norm += double(v) * v;
    }
    if (norm > 0) worst_relative = std::max(worst_relative, std::sqrt(err / norm));
  }
  // A row's relative L2 error: about 2^-4 / sqrt(3) for values spread over the binades.
  EXPECT_LT(worst_relative, 0.04);
  EXPECT_GT(worst_relative, 0.001);  // it did quantize
  // The row's largest value comes back exactly (it is 448 * scale).
  for (int64_t r = 0; r < rows; ++r) {
    if (r == 5) continue;
    float absmax = 0, back_max = 0;
    for (int64_t i = 0; i < cols; ++i) {
      absmax = std::max(absmax, std::fabs(x[r * cols + i]));
      back_max = std::max(back_max, std::fabs(back[r * cols + i]));
    }
    EXPECT_NEAR(back_max, absmax, absmax * 1e-6f) << "row " << r;
  }
}

}  // namespace
}  // namespace strata
