#include "common/placement/hot_ratio.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace strata {
namespace {

bool InUnitRange(float ratio) { return ratio >= 0.0f && ratio <= 1.0f; }  // NaN is not

}  // namespace

absl::StatusOr<std::optional<float>> ParseHotRatio(const std::string& text) {
  if (text == "auto") return std::nullopt;
  float ratio = 0;
  if (!absl::SimpleAtof(text, &ratio) || !InUnitRange(ratio)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hot ratio \"", text, "\": auto or a number in [0, 1]"));
  }
  return ratio;
}

float HotRatioPolicy::Highest() const {
  float highest = 0.0f;
  for (const Step& step : steps) highest = std::max(highest, step.ratio);
  return highest;
}

float HotRatioPolicy::For(int64_t context_tokens) const {
  for (const Step& step : steps) {
    if (step.below == 0 || context_tokens < step.below) return step.ratio;
  }
  return steps.empty() ? kLongContextHotRatio : steps.back().ratio;
}

absl::StatusOr<HotRatioPolicy> HotRatioPolicy::Parse(const std::string& text) {
  HotRatioPolicy policy;
  policy.steps.clear();
  const std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipWhitespace());
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hot ratio policy \"", text, "\": ", why,
        " (expected e.g. 512:0.35,2048:0.28,0.20: ratios in [0, 1] below ascending context "
        "lengths, then the ratio for longer contexts)"));
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<std::string> fields = absl::StrSplit(parts[i], ':');
    Step step;
    const bool last = i + 1 == parts.size();
    if (fields.size() != (last ? 1u : 2u)) return bad(absl::StrCat("step \"", parts[i], "\""));
    if (!last && (!absl::SimpleAtoi(fields[0], &step.below) || step.below <= 0 ||
                  (!policy.steps.empty() && step.below <= policy.steps.back().below))) {
      return bad(absl::StrCat("context limit \"", fields[0], "\""));
    }
    if (!absl::SimpleAtof(fields.back(), &step.ratio) || !InUnitRange(step.ratio)) {
      return bad(absl::StrCat("ratio \"", fields.back(), "\""));
    }
    policy.steps.push_back(step);
  }
  if (policy.steps.empty()) return bad("empty");
  return policy;
}

std::string HotRatioPolicy::ToString() const {
  std::vector<std::string> parts;
  for (const Step& s : steps) {
    parts.push_back(s.below > 0 ? absl::StrCat(s.below, ":", s.ratio) : absl::StrCat(s.ratio));
  }
  return absl::StrJoin(parts, ",");
}

absl::Status HotRatioControl::SetFixed(float ratio) {
  if (!InUnitRange(ratio)) {
    return absl::InvalidArgumentError(absl::StrCat("hot ratio ", ratio, " is outside [0, 1]"));
  }
  fixed_.store(ratio);
  automatic_.store(false);
  current_.store(ratio);
  return absl::OkStatus();
}

void HotRatioControl::SetAutomatic() { automatic_.store(true); }

float HotRatioControl::Update(int64_t context_tokens) {
  if (!automatic_.load()) {
    const float fixed = fixed_.load();
    current_.store(fixed);
    return fixed;
  }
  float ratio = policy_.For(context_tokens);
  const float current = current_.load();
  // A shorter context takes a higher ratio only once it is clearly (an eighth) below the step's
  // limit: a batch whose longest context hovers around a limit would otherwise make the workers
  // re-pick their hot sets step after step.
  if (ratio > current && policy_.For(context_tokens + context_tokens / 8) <= current) {
    ratio = current;
  }
  current_.store(ratio);
  return ratio;
}

}  // namespace strata
