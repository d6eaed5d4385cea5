#include "common/engine/sampling_request.h"

#include <algorithm>
#include <random>
#include <cstdint>

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
  if (r.seed) {
    p.seed = *r.seed;
  } else {
    static thread_local std::random_device device;
    p.seed = (uint64_t{device()} << 32) ^ device();
  }
  return p;
}

}  // namespace strata
