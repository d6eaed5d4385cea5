#include "common/backend/cpu/cpu_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/tensor/dtype.h"

namespace strata::cpu::simd {

#if defined(__x86_64__)

bool Available() {
  static const bool available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return available;
}

__attribute__((target("avx2,f16c"))) void Bf16ToFloat(const uint16_t* src, int64_t n, float* row) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16);
    _mm256_storeu_ps(row + i, _mm256_castsi256_ps(wide));
  }
  for (; i < n; ++i) row[i] = strata::Bf16ToFloat(src[i]);
}

// E4M3 as a half with the same exponent and mantissa bits: sign to bit 15, the other seven
// bits to 13..7. Its value is the code's times 2^-8 (the biases 7 and 15 differ by 8;
// subnormals map onto subnormals), so times 256 it is the code's value exactly.
__attribute__((target("avx2,f16c"))) void Fp8E4M3ToFloat(const uint8_t* src, int64_t n, float scale,
                                                         float* row) {
  const __m128i sign_mask = _mm_set1_epi16(0x80);
  const __m128i rest_mask = _mm_set1_epi16(0x7f);
  const __m256 unbias = _mm256_set1_ps(256.0f);
  const __m256 scales = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i codes =
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    const __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(codes, sign_mask), 8),
                                      _mm_slli_epi16(_mm_and_si128(codes, rest_mask), 7));
    // Two roundings as the portable loop: the code's value (exact), then times the scale.
    const __m256 value = _mm256_mul_ps(_mm256_cvtph_ps(half), unbias);
    _mm256_storeu_ps(row + i, _mm256_mul_ps(value, scales));
  }
  for (; i < n; ++i) row[i] = strata::Fp8E4M3ToFloat(src[i]) * scale;
}

__attribute__((target("avx2"))) float Dot(const float* a, const float* b, int64_t n) {
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  alignas(32) float s[8];
  _mm256_store_ps(s, sum);
  float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

__attribute__((target("avx2"))) void Dot4(const float* rows, const float* b, int64_t n,
                                          float out[4]) {
  __m256 sum[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(b + i);
    for (int r = 0; r < 4; ++r) {
      sum[r] = _mm256_add_ps(sum[r], _mm256_mul_ps(_mm256_loadu_ps(rows + r * n + i), x));
    }
  }
  for (int r = 0; r < 4; ++r) {
    alignas(32) float s[8];
    _mm256_store_ps(s, sum[r]);
    float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    const float* a = rows + r * n;
    for (int64_t j = i; j < n; ++j) total += a[j] * b[j];
    out[r] = total;
  }
}

#else

bool Available() { return false; }
void Dot4(const float*, const float*, int64_t, float*) {}
void Bf16ToFloat(const uint16_t*, int64_t, float*) {}
void Fp8E4M3ToFloat(const uint8_t*, int64_t, float, float*) {}
float Dot(const float*, const float*, int64_t) { return 0.0f; }

#endif

}  // namespace strata::cpu::simd
