#include "common/engine/logits_transforms.h"

#include <limits>

namespace strata {

void ApplyLogitBias(float* logits, int64_t vocab,
                    absl::Span<const std::pair<int32_t, float>> bias) {
  for (const auto& [id, value] : bias) {
    if (id >= 0 && id < vocab) logits[id] += value;
  }
}

void SuppressTokens(float* logits, int64_t vocab, absl::Span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
  }
}

void ApplyRepetitionPenalty(float* logits, int64_t vocab, const absl::flat_hash_set<int32_t>& seen,
                            float penalty) {
  if (penalty == 1.0f) return;
  for (int32_t id : seen) {
    if (id < 0 || id >= vocab) continue;
    float& x = logits[id];
    x = x > 0.0f ? x / penalty : x * penalty;
  }
}

void ApplyFrequencyPresencePenalties(float* logits, int64_t vocab,
                                     const absl::flat_hash_map<int32_t, int>& output,
                                     float frequency, float presence) {
  if (frequency == 0.0f && presence == 0.0f) return;
  for (const auto& [id, count] : output) {
    if (id < 0 || id >= vocab) continue;
    logits[id] -= frequency * static_cast<float>(count) + presence;
  }
}

}  // namespace strata
