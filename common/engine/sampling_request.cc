#include "common/engine/sampling_request.h"

#include <cmath>
#include <random>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status BadParam(const char* param, const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kInvalidParamPayload, absl::Cord(param));
  return status;
}

}  // namespace

absl::StatusOr<SamplingParams> NormalizeSampling(const SamplingRequest& r, int64_t vocab_size,
                                                 double default_temperature) {
  SamplingParams p;
  const double temperature = r.temperature.value_or(default_temperature);
  if (!(temperature >= 0.0 && temperature <= 2.0)) {
    return BadParam("temperature",
                    absl::StrCat("'temperature' must be in [0, 2], not ", temperature));
  }
  p.temperature = static_cast<float>(temperature);
  if (r.top_p) {
    if (!(*r.top_p > 0.0 && *r.top_p <= 1.0)) {
      return BadParam("top_p", absl::StrCat("'top_p' must be in (0, 1], not ", *r.top_p));
    }
    p.top_p = static_cast<float>(*r.top_p);
  }
  if (r.top_k) {
    if (*r.top_k < -1) {
      return BadParam("top_k", absl::StrCat("'top_k' must be -1 or 0 (no limit) or a positive "
                                            "number of tokens, not ",
                                            *r.top_k));
    }
    p.top_k = *r.top_k <= 0 || *r.top_k >= vocab_size ? 0 : static_cast<int>(*r.top_k);
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
