// Float32 CPU kernels over stored (bf16/f16/f32) weights, parallelized on a ThreadPool.
#ifndef STRATA_COMMON_BACKEND_CPU_CPU_KERNELS_H_
#define STRATA_COMMON_BACKEND_CPU_CPU_KERNELS_H_

#include <cstdint>

#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/util/thread_pool.h"

namespace strata::cpu {

// y[t] = W x[t] (+ bias) for t < n; x is [n, w.in], y is [n, w.out], both row-major.
void Linear(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w,
            const WeightVector& bias, float* y);

// out = x / sqrt(mean(x^2) + eps) * weight over one row of `dim` values. In place is fine.
void RmsNorm(const float* x, const WeightVector& weight, int64_t dim, double eps, float* out);

// Rows [0, n) of x [n, dim] normalized into out.
void RmsNormRows(ThreadPool& pool, const float* x, int64_t n, const WeightVector& weight,
                 int64_t dim, double eps, float* out);

// out[t] = down(act(gate x[t], up x[t])) for the activation the config names; `scratch`
// must hold 2 * n * intermediate floats.
void Ffn(ThreadPool& pool, const ModelConfig& config, const FfnWeights& ffn, const float* x,
         int64_t n, float* scratch, float* out);

float Dot(const float* a, const float* b, int64_t n);
// row[i] = bf16 bits src[i] as float32 (exact either way; AVX2 where the CPU has it).
void Bf16RowToFloat(const uint16_t* src, int64_t n, float* row);
// Dot without SIMD: eight lane sums over blocks of eight, reduced pairwise, then the tail in
// order (the order simd::Dot keeps).
float PortableDot(const float* a, const float* b, int64_t n);

}  // namespace strata::cpu

#endif  // STRATA_COMMON_BACKEND_CPU_CPU_KERNELS_H_
