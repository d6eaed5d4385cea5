#include "common/engine/sampling_request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  if (!param.empty()) status.SetPayload(kInvalidParamPayload, absl::Cord(param));
  return status;
}

absl::Status CheckSampling(const SamplingRequest& r, double default_temperature) {
  const double temperature = r.temperature.value_or(default_temperature);
  if (!(temperature >= 0.0 && temperature <= 2.0)) {
    return InvalidParam("temperature",
                        absl::StrCat("'temperature' must be in [0, 2], not ", temperature));
  }
  if (r.top_p && !(*r.top_p > 0.0 && *r.top_p <= 1.0)) {
    return InvalidParam("top_p", absl::StrCat("'top_p' must be in (0, 1], not ", *r.top_p));
  }
  if (r.top_k && *r.top_k < -1) {
    return InvalidParam("top_k", absl::StrCat("'top_k' must be -1 or 0 (no limit) or a positive "
                                              "number of tokens, not ",
                                              *r.top_k));
  }
  if (r.min_p && !(*r.min_p >= 0.0 && *r.min_p <= 1.0)) {
    return InvalidParam("min_p", absl::StrCat("'min_p' must be in [0, 1], not ", *r.min_p));
  }
  if (r.repetition_penalty &&
      !(*r.repetition_penalty > 0.0 && std::isfinite(*r.repetition_penalty))) {
    return InvalidParam("repetition_penalty",
                        absl::StrCat("'repetition_penalty' must be a number above 0 (1: off), not ",
                                     *r.repetition_penalty));
  }
  for (const auto& [name, value] : {std::pair{"presence_penalty", r.presence_penalty},
                                    std::pair{"frequency_penalty", r.frequency_penalty}}) {
    if (value && !(*value >= -2.0 && *value <= 2.0)) {
      return InvalidParam(name, absl::StrCat("'", name, "' must be in [-2, 2], not ", *value));
    }
  }
  for (const auto& [id, bias] : r.logit_bias) {
    if (id < 0) {
      return InvalidParam("logit_bias",
                          absl::StrCat("'logit_bias' keys must be token ids, not ", id));
    }
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return InvalidParam("logit_bias", absl::StrCat("'logit_bias' values must be in [-100, 100]; "
                                                     "token ",
                                                     id, " has ", bias));
    }
  }
  if (r.min_tokens && *r.min_tokens < 0) {
    return InvalidParam("min_tokens",
                        absl::StrCat("'min_tokens' must be at least 0, not ", *r.min_tokens));
  }
  for (int64_t id : r.stop_token_ids) {
    if (id < 0) {
      return InvalidParam("stop_token_ids",
                          absl::StrCat("'stop_token_ids' must be token ids, not ", id));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SamplingParams> NormalizeSampling(const SamplingRequest& r, int64_t vocab_size,
                                                 double default_temperature) {
  if (absl::Status s = CheckSampling(r, default_temperature); !s.ok()) return s;
  SamplingParams p;
  p.temperature = static_cast<float>(r.temperature.value_or(default_temperature));
  if (r.top_p) p.top_p = static_cast<float>(*r.top_p);
  if (r.top_k) {
    const int64_t whole = std::min<int64_t>(vocab_size, INT32_MAX);  // SamplingParams' int
    p.top_k = *r.top_k <= 0 || *r.top_k >= whole ? 0 : static_cast<int>(*r.top_k);
  }
  if (r.min_p) p.min_p = static_cast<float>(*r.min_p);
  if (r.repetition_penalty) p.repetition_penalty = static_cast<float>(*r.repetition_penalty);
  if (r.presence_penalty) p.presence_penalty = static_cast<float>(*r.presence_penalty);
  if (r.frequency_penalty) p.frequency_penalty = static_cast<float>(*r.frequency_penalty);
  std::map<int32_t, float> bias;  // one entry per token, the last given; zeros dropped
  for (const auto& [id, value] : r.logit_bias) {
    if (id >= vocab_size) {
      return InvalidParam("logit_bias", absl::StrCat("'logit_bias' key ", id,
                                                     " is not a token id of this model's "
                                                     "vocabulary [0, ",
                                                     vocab_size, ")"));
    }
    bias[static_cast<int32_t>(id)] = static_cast<float>(value);
  }
  for (const auto& [id, value] : bias) {
    if (value != 0.0f) p.logit_bias.emplace_back(id, value);
  }
  for (int64_t id : r.stop_token_ids) {
    if (id >= vocab_size) {
      return InvalidParam("stop_token_ids", absl::StrCat("'stop_token_ids' holds ", id,
                                                         ", not a token id of this model's "
                                                         "vocabulary [0, ",
                                                         vocab_size, ")"));
    }
    p.stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  std::sort(p.stop_token_ids.begin(), p.stop_token_ids.end());
  p.stop_token_ids.erase(std::unique(p.stop_token_ids.begin(), p.stop_token_ids.end()),
                         p.stop_token_ids.end());
  p.min_tokens = static_cast<int>(std::min<int64_t>(r.min_tokens.value_or(0), INT32_MAX));
  p.include_stop_str_in_output = r.include_stop_str_in_output.value_or(false);
  p.skip_special_tokens = r.skip_special_tokens.value_or(true);
  if (r.seed) {
    p.seed = *r.seed;
  } else {
    static thread_local std::random_device device;
    p.seed = (uint64_t{device()} << 32) ^ device();
  }
  return p;
}

}  // namespace strata
