// The AVX2 loops against the portable ones they replace: bit for bit, over every FP8 code, odd
// lengths (tails) and values that make the order of additions matter.
#include "common/backend/cpu/cpu_simd.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/backend/cpu/cpu_kernels.h"
#include "common/tensor/dtype.h"
#include "gtest/gtest.h"

namespace strata::cpu {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

class CpuSimdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!simd::Available()) GTEST_SKIP() << "this CPU has no AVX2/F16C";
  }
};

TEST_F(CpuSimdTest, EveryFp8CodeConvertsExactly) {
  std::vector<uint8_t> codes;
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(v));  // NaN codes aside
  }
  codes.push_back(0x3c);  // a tail of length != 0 mod 8
  for (float scale : {1.0f, 0.0123f, 3.7e-3f}) {
    std::vector<float> row(codes.size());
    simd::Fp8E4M3ToFloat(codes.data(), static_cast<int64_t>(codes.size()), scale, row.data());
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ(Bits(row[i]), Bits(Fp8E4M3ToFloat(codes[i]) * scale))
          << "code " << static_cast<int>(codes[i]) << " scale " << scale;
    }
  }
}

TEST_F(CpuSimdTest, Bf16ConvertsExactly) {
  std::mt19937 rng(7);
  std::vector<uint16_t> bits(1037);
  for (auto& b : bits) b = static_cast<uint16_t>(rng());
  for (auto& b : bits) {
    if ((b & 0x7f80) == 0x7f80) b &= 0xbfff;  // no NaN or infinity: compared by value below
  }
  std::vector<float> row(bits.size());
  simd::Bf16ToFloat(bits.data(), static_cast<int64_t>(bits.size()), row.data());
  for (size_t i = 0; i < bits.size(); ++i) ASSERT_EQ(Bits(row[i]), Bits(Bf16ToFloat(bits[i])));
  // The backend's row conversion, which picks this loop here.
  std::vector<float> backend(bits.size());
  Bf16RowToFloat(bits.data(), static_cast<int64_t>(bits.size()), backend.data());
  for (size_t i = 0; i < bits.size(); ++i) ASSERT_EQ(Bits(backend[i]), Bits(row[i]));
}

TEST_F(CpuSimdTest, DotAddsInThePortableOrder) {
  std::mt19937 rng(11);
  // Magnitudes over many octaves: a different order of additions would change the bits.
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-20, 20);
  for (int64_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4099}) {
    std::vector<float> a(n), b(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = std::ldexp(mantissa(rng), octave(rng));
      b[i] = std::ldexp(mantissa(rng), octave(rng));
    }
    EXPECT_EQ(Bits(simd::Dot(a.data(), b.data(), n)), Bits(PortableDot(a.data(), b.data(), n)))
        << "n = " << n;
  }
}

TEST_F(CpuSimdTest, Dot4SumsEachRowAsDot) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-20, 20);
  for (int64_t n : {1, 8, 13, 2048, 2051}) {
    std::vector<float> rows(4 * n), b(n);
    for (auto& v : rows) v = std::ldexp(mantissa(rng), octave(rng));
    for (auto& v : b) v = std::ldexp(mantissa(rng), octave(rng));
    float got[4];
    simd::Dot4(rows.data(), b.data(), n, got);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(Bits(got[r]), Bits(PortableDot(rows.data() + r * n, b.data(), n)))
          << "n = " << n << ", row " << r;
    }
  }
}

}  // namespace
}  // namespace strata::cpu
