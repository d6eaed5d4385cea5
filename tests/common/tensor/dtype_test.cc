#include "common/tensor/dtype.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

// Every finite FP8 E4M3 value, by code.
std::vector<std::pair<float, uint8_t>> FiniteFp8Values() {
  std::vector<std::pair<float, uint8_t>> values;
  for (int code = 0; code < 256; ++code) {
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    if (!std::isnan(v)) values.push_back({v, static_cast<uint8_t>(code)});
  }
  return values;
}

TEST(DTypeTest, Fp8E4M3Decodes) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x00), 0.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);    // exponent 7 (bias), mantissa 0
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);  // the largest finite
  EXPECT_EQ(Fp8E4M3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(Fp8E4M3ToFloat(0x3c), 1.5f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(FiniteFp8Values().size(), 254u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(*ParseDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(ParseDType("F8_E5M2").ok());
}

TEST(DTypeTest, Fp8E4M3EncodesEveryValueToItsCode) {
  for (const auto& [value, code] : FiniteFp8Values()) {
    if (value == 0.0f) continue;  // +0 and -0 both decode to a zero
    EXPECT_EQ(FloatToFp8E4M3(value), code) << value;
  }
  EXPECT_EQ(FloatToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-0.0f), 0x80);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

// Against the nearest finite value by search: round to nearest, ties to the even code
// (mantissa bit 0 clear), saturating to +-448 beyond the range.
TEST(DTypeTest, Fp8E4M3RoundsToNearestEvenAndSaturates) {
  const auto values = FiniteFp8Values();
  std::mt19937 rng(5);
  std::vector<float> inputs = {1e-9f,
                               3e-3f,
                               0.0009765625f * 1.5f,
                               1.0625f,
                               1.1875f,
                               447.0f,
                               463.9f,
                               464.0f,
                               1e6f,
                               std::numeric_limits<float>::infinity()};
  std::uniform_real_distribution<float> log2_magnitude(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) inputs.push_back(std::exp2(log2_magnitude(rng)));
  // Exact midpoints between neighbours.
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    if (values[i].first >= 0.0f && values[i + 1].first > values[i].first) {
      inputs.push_back(0.5f * (values[i].first + values[i + 1].first));
    }
  }
  for (float magnitude : inputs) {
    for (float x : {magnitude, -magnitude}) {
      uint8_t want = 0;
      float best = std::numeric_limits<float>::infinity();
      for (const auto& [value, code] : values) {
        const float d = std::fabs(value - x);
        if ((d < best || (d == best && (code & 1) == 0)) &&
            std::signbit(value) == std::signbit(x)) {
          best = d;
          want = code;
        }
      }
      if (std::fabs(x) >= 448.0f) want = x > 0 ? 0x7e : 0xfe;
      ASSERT_EQ(FloatToFp8E4M3(x), want) << x;
    }
  }
}

// Per-row quantization: each row's largest magnitude lands on 448 exactly, an all-zero row
// gets scale 1, and every element comes back within half an E4M3 step.
TEST(DTypeTest, Bf16RowsQuantizeToFp8WithRowScales) {
  const std::vector<float> rows = {0.5f,  -2.0f, 1.0f,   0.25f,   // absmax 2
                                   0.0f,  0.0f,  0.0f,   0.0f,    // all zero
                                   3e-3f, 1e-3f, -7e-3f, 2e-3f};  // absmax 7e-3
  std::vector<uint16_t> bf16;
  for (float f : rows) bf16.push_back(FloatToBf16(f));
  std::vector<uint8_t> codes(rows.size());
  std::vector<float> scales(3);
  QuantizeBf16RowsToFp8E4M3(bf16.data(), 3, 4, codes.data(), scales.data());
  EXPECT_FLOAT_EQ(scales[0], 2.0f / 448);
  EXPECT_EQ(scales[1], 1.0f);
  EXPECT_FLOAT_EQ(scales[2], Bf16ToFloat(FloatToBf16(7e-3f)) / 448);
  EXPECT_EQ(codes[1], 0xfe);  // -448
  EXPECT_EQ(codes[10], 0xfe);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(codes[i], 0x00);
  for (size_t i = 0; i < rows.size(); ++i) {
    const float w = Bf16ToFloat(bf16[i]), back = Fp8E4M3ToFloat(codes[i]) * scales[i / 4];
    EXPECT_NEAR(back, w, std::fabs(w) / 16 + scales[i / 4] / 1024) << i;
  }
}

}  // namespace
}  // namespace strata
