#include "common/backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/backend/cpu/cpu_simd.h"

namespace strata::cpu {
namespace {

// Row o of a block-scaled FP8 W as float32: within a stored row the scale changes every
// block_cols elements, so a packed row converts segment by segment; any other view (a
// transpose of kv_b_proj) asks WeightMatrix::ScaleAt element by element.
void LoadBlockScaledRow(const WeightMatrix& w, int64_t o, float* row) {
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + o * w.out_stride;
  const Fp8BlockScales& b = w.blocks;
  const int64_t offset = src - b.origin;
  const int64_t col = offset % b.cols;
  if (w.in_stride != 1 || col + w.in > b.cols) {
    for (int64_t i = 0; i < w.in; ++i) {
      row[i] = Fp8E4M3ToFloat(src[i * w.in_stride]) * w.ScaleAt(o, i);
    }
    return;
  }
  const int64_t stored_row = offset / b.cols;
  for (int64_t i = 0; i < w.in;) {
    const int64_t c = col + i;
    const int64_t end = std::min(w.in, i + b.block_cols - c % b.block_cols);
    const float scale = b.At(stored_row, c);
    if (simd::Available()) {
      simd::Fp8E4M3ToFloat(src + i, end - i, scale, row + i);
    } else {
      for (int64_t k = i; k < end; ++k) row[k] = Fp8E4M3ToFloat(src[k]) * scale;
    }
    i = end;
  }
}

// Row o of W as float32, times its scales when it has them (as WeightMatrix::At).
void LoadRow(const WeightMatrix& w, int64_t o, float* row) {
  if (w.blocks.present()) {
    LoadBlockScaledRow(w, o, row);
    return;
  }
  const int64_t base = o * w.out_stride;
  if (w.in_stride == 1 && w.dtype == DType::kF8E4M3 && simd::Available()) {
    simd::Fp8E4M3ToFloat(static_cast<const uint8_t*>(w.data) + base, w.in,
                         w.scale != nullptr ? w.scale[o] : 1.0f, row);
    return;
  }
  if (w.in_stride == 1 && w.dtype == DType::kF32) {
    const float* src = static_cast<const float*>(w.data) + base;
    std::copy(src, src + w.in, row);
  } else if (w.in_stride == 1 && w.dtype == DType::kBF16) {
    Bf16RowToFloat(static_cast<const uint16_t*>(w.data) + base, w.in, row);
  } else if (w.dtype == DType::kF8E4M3) {
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + base;
    for (int64_t i = 0; i < w.in; ++i) row[i] = Fp8E4M3ToFloat(src[i * w.in_stride]);
  } else {
    for (int64_t i = 0; i < w.in; ++i)
      row[i] = LoadAsFloat(w.data, w.dtype, base + i * w.in_stride);
  }
  if (w.scale != nullptr) {
    for (int64_t i = 0; i < w.in; ++i) row[i] *= w.scale[o];
  }
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  return simd::Available() ? simd::Dot(a, b, n) : PortableDot(a, b, n);
}

void Bf16RowToFloat(const uint16_t* src, int64_t n, float* row) {
  if (simd::Available()) {
    simd::Bf16ToFloat(src, n, row);
    return;
  }
  for (int64_t i = 0; i < n; ++i) row[i] = Bf16ToFloat(src[i]);
}

float PortableDot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums let the compiler vectorize without reassociation flags.
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  }
  float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

void Linear(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w,
            const WeightVector& bias, float* y) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, w.in * n));
  pool.ParallelFor(w.out, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row;
    int64_t o = begin;
    if (simd::Available()) {
      // Four rows at a time, each summed exactly as Dot sums it.
      row.resize(4 * w.in);
      for (; o + 4 <= end; o += 4) {
        for (int r = 0; r < 4; ++r) LoadRow(w, o + r, row.data() + r * w.in);
        for (int64_t t = 0; t < n; ++t) {
          float dots[4];
          simd::Dot4(row.data(), x + t * w.in, w.in, dots);
          for (int r = 0; r < 4; ++r) {
            y[t * w.out + o + r] = dots[r] + (bias.present() ? bias.At(o + r) : 0.0f);
          }
        }
      }
    }
    row.resize(w.in);
    for (; o < end; ++o) {
      LoadRow(w, o, row.data());
      const float b = bias.present() ? bias.At(o) : 0.0f;
      for (int64_t t = 0; t < n; ++t) y[t * w.out + o] = Dot(row.data(), x + t * w.in, w.in) + b;
    }
  });
}

void RmsNorm(const float* x, const WeightVector& weight, int64_t dim, double eps, float* out) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
  for (int64_t i = 0; i < dim; ++i) out[i] = weight.At(i) * (x[i] * inv);
}

void RmsNormRows(ThreadPool& pool, const float* x, int64_t n, const WeightVector& weight,
                 int64_t dim, double eps, float* out) {
  pool.ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) RmsNorm(x + t * dim, weight, dim, eps, out + t * dim);
  });
}

void Ffn(ThreadPool& pool, const ModelConfig& config, const FfnWeights& ffn, const float* x,
         int64_t n, float* scratch, float* out) {
  const int64_t inter = ffn.gate.out;
  float* gate = scratch;
  float* up = scratch + n * inter;
  Linear(pool, x, n, ffn.gate, ffn.gate_bias, gate);
  Linear(pool, x, n, ffn.up, ffn.up_bias, up);
  if (config.activation == ExpertActivation::kClampedSwiGlu) {
    const float limit = config.swiglu_limit;
    const float alpha = config.swiglu_alpha;
    for (int64_t i = 0; i < n * inter; ++i) {
      const float g = std::min(gate[i], limit);
      const float u = std::clamp(up[i], -limit, limit);
      gate[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
    }
  } else {
    for (int64_t i = 0; i < n * inter; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
  Linear(pool, gate, n, ffn.down, ffn.down_bias, out);
}

}  // namespace strata::cpu
