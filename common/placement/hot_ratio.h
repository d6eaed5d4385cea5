// The hot ratio the router hands its workers: fixed by an operator, or set by the longest
// context in the running batch (long contexts leave GPU memory to the KV cache).
#ifndef STRATA_COMMON_PLACEMENT_HOT_RATIO_H_
#define STRATA_COMMON_PLACEMENT_HOT_RATIO_H_

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// A hot ratio as operators write it (flags, cluster.yaml, `strata hot-ratio`): "auto" (nullopt:
// the policy decides) or a number in [0, 1]; anything else is InvalidArgument.
absl::StatusOr<std::optional<float>> ParseHotRatio(const std::string& text);

// The ratio for long contexts when nothing else is said.
inline constexpr float kLongContextHotRatio = 0.2f;

// Steps by context length: the first whose `below` exceeds the context gives the ratio; the
// last has below == 0 and applies to every longer context.
struct HotRatioPolicy {
  struct Step {
    int64_t below = 0;
    float ratio = kLongContextHotRatio;
  };
  std::vector<Step> steps = {{512, 0.35f}, {2048, 0.28f}, {0, kLongContextHotRatio}};

  float For(int64_t context_tokens) const;
  float Highest() const;
  // "512:0.35,2048:0.28,0.20": ascending limits, ratios in [0, 1], a last plain ratio.
  static absl::StatusOr<HotRatioPolicy> Parse(const std::string& text);
  std::string ToString() const;
};

// Thread-safe: the admin service sets it, the engine thread reads it every step.
class HotRatioControl {
 public:
  explicit HotRatioControl(HotRatioPolicy policy)
      : policy_(std::move(policy)), current_(policy_.For(0)) {}

  // Fixes the ratio (InvalidArgument outside [0, 1]) until SetAutomatic.
  absl::Status SetFixed(float ratio);
  void SetAutomatic();
  // The ratio for a batch whose longest sequence has `context_tokens` tokens: the policy's,
  // except that a context shrinking back below a step's limit raises the ratio only once it is
  // an eighth below it (hysteresis).
  float Update(int64_t context_tokens);
  float current() const { return current_.load(); }
  bool automatic() const { return automatic_.load(); }

 private:
  HotRatioPolicy policy_;
  std::atomic<bool> automatic_{true};
  std::atomic<float> fixed_{kLongContextHotRatio};
  std::atomic<float> current_;  // the policy's ratio for the shortest contexts until a step
};

}  // namespace strata

#endif  // STRATA_COMMON_PLACEMENT_HOT_RATIO_H_
