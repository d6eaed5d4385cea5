#include "common/backend/rope.h"

#include <algorithm>
#include <cmath>

namespace strata {
namespace {

double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension index at which a frequency completes `rotations` turns over the original
// context length.
double CorrectionDim(double rotations, int dim, double base, double max_positions) {
  return dim * std::log(max_positions / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

RopeTable BuildRopeTable(const RopeConfig& rope, int rotary_dim) {
  const int head_dim = rotary_dim;  // the width the frequencies are spread over
  const int half = head_dim / 2;
  RopeTable table;
  table.inv_freq.resize(half);
  // transformers computes the exponent in float32; matching it keeps angles bit-close.
  std::vector<float> pos_freqs(half);
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    pos_freqs[j] = std::pow(static_cast<float>(rope.theta), exponent);
  }
  if (rope.type == RopeConfig::Type::kDefault) {
    for (int j = 0; j < half; ++j) table.inv_freq[j] = 1.0f / pos_freqs[j];
    return table;
  }

  const double factor = rope.factor;
  if (rope.attention_factor) {
    table.attention_scaling = static_cast<float>(*rope.attention_factor);
  } else if (rope.mscale && rope.mscale_all_dim && *rope.mscale != 0 && *rope.mscale_all_dim != 0) {
    table.attention_scaling = static_cast<float>(YarnMscale(factor, *rope.mscale) /
                                                 YarnMscale(factor, *rope.mscale_all_dim));
  } else {
    table.attention_scaling = static_cast<float>(YarnMscale(factor, 1.0));
  }
  double low =
      CorrectionDim(rope.beta_fast, head_dim, rope.theta, rope.original_max_position_embeddings);
  double high =
      CorrectionDim(rope.beta_slow, head_dim, rope.theta, rope.original_max_position_embeddings);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  for (int j = 0; j < half; ++j) {
    const float ramp = std::clamp(static_cast<float>((j - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    const float extrapolated = 1.0f / pos_freqs[j];
    const float interpolated = 1.0f / (static_cast<float>(factor) * pos_freqs[j]);
    table.inv_freq[j] =
        interpolated * (1.0f - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  return table;
}

void ApplyRope(const RopeTable& table, int64_t position, float* x, int rotary_dim) {
  const int half = rotary_dim / 2;
  const float pos = static_cast<float>(position);
  for (int j = 0; j < half; ++j) {
    const float angle = pos * table.inv_freq[j];
    const float c =
        static_cast<float>(std::cos(static_cast<double>(angle))) * table.attention_scaling;
    const float s =
        static_cast<float>(std::sin(static_cast<double>(angle))) * table.attention_scaling;
    const float a = x[j];
    const float b = x[j + half];
    x[j] = a * c - b * s;
    x[j + half] = b * c + a * s;
  }
}

}  // namespace strata
