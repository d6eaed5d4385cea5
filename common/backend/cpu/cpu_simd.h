// AVX2 versions of the CPU backend's innermost loops, picked at run time where the CPU has
// AVX2 and F16C (cpu_kernels.cc). Each gives bit-for-bit the float32 result of the portable
// loop it replaces (same lanes, same order of additions, no fused multiply-add), so CPU and
// CPU-tier results do not depend on the host; they only run faster: the weights' conversion
// was a table lookup per element, the dot product SSE2.
#ifndef STRATA_COMMON_BACKEND_CPU_CPU_SIMD_H_
#define STRATA_COMMON_BACKEND_CPU_CPU_SIMD_H_

#include <cstdint>

namespace strata::cpu::simd {

// Whether this CPU runs the functions below (checked once).
bool Available();

// row[i] = bf16 bits src[i] as float32.
void Bf16ToFloat(const uint16_t* src, int64_t n, float* row);
// row[i] = FP8 E4M3 code src[i] as float32, times `scale` (E4M3 NaN codes are not expected in
// weights and come out as finite values).
void Fp8E4M3ToFloat(const uint8_t* src, int64_t n, float scale, float* row);
// sum a[i] * b[i] as cpu::Dot adds it: eight lane sums over blocks of eight, reduced pairwise,
// then the tail in order.
float Dot(const float* a, const float* b, int64_t n);
// out[r] = Dot(rows + r * n, b, n) for r < 4: four rows at once, so that four chains of
// additions overlap (one alone waits on the adder's latency at every step).
void Dot4(const float* rows, const float* b, int64_t n, float out[4]);

}  // namespace strata::cpu::simd

#endif  // STRATA_COMMON_BACKEND_CPU_CPU_SIMD_H_
