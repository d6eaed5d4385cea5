// The one set of sampling rules every front end applies (gRPC Generate, the OpenAI API, the
// `strata` command): a request's sampling as the front end read it, each field absent unless
// the client sent it, made into the SamplingParams the scheduler runs.
#ifndef STRATA_COMMON_ENGINE_SAMPLING_REQUEST_H_
#define STRATA_COMMON_ENGINE_SAMPLING_REQUEST_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engine/sampler.h"

namespace strata {

struct SamplingRequest {
  std::optional<double> temperature;                   // absent: the front end's default
  std::optional<double> top_p;                         // absent: 1 (no nucleus cut)
  std::optional<int64_t> top_k;                        // absent, 0 or -1: the whole vocabulary
  std::optional<uint64_t> seed;                        // absent: a seed drawn for the request
  std::optional<double> min_p;                         // absent: 0 (off)
  std::optional<double> repetition_penalty;            // absent: 1 (off)
  std::optional<double> presence_penalty;              // absent: 0
  std::optional<double> frequency_penalty;             // absent: 0
  std::vector<std::pair<int64_t, double>> logit_bias;  // (token id, bias)
  std::optional<int64_t> min_tokens;                   // absent: 0
  std::vector<int64_t> stop_token_ids;
  std::optional<bool> include_stop_str_in_output;  // absent: false
  std::optional<bool> skip_special_tokens;         // absent: true
};

// The payload key of an INVALID_ARGUMENT from NormalizeSampling: the parameter's name, as the
// OpenAI API reports it in `param`.
inline constexpr char kInvalidParamPayload[] = "strata.param";

// INVALID_ARGUMENT with `param` in kInvalidParamPayload: how a front end refuses a parameter.
absl::Status InvalidParam(absl::string_view param, absl::string_view message);

// NormalizeSampling's rules on what does not depend on the model (it applies them first): for
// a front end that checks a request before it tokenizes anything.
absl::Status CheckSampling(const SamplingRequest& request, double default_temperature);

// temperature in [0, 2], 0 greedy (default_temperature when absent: 0 for gRPC and the command,
// 1 for the OpenAI API, as each documents); top_p in (0, 1]; top_k -1 or 0 for no limit, and a
// limit at or above the vocabulary is none either (other negatives refused); any seed given
// repeats its draws, 0 included; without one, draws differ from request to request.
// min_p in [0, 1]; repetition_penalty > 0; presence_penalty and frequency_penalty in [-2, 2];
// logit_bias keys token ids of the vocabulary, values in [-100, 100] (a key given twice: the
// last value); min_tokens >= 0 (at most max_tokens: the scheduler checks that, knowing it);
// stop_token_ids in the vocabulary. INVALID_ARGUMENT names the parameter (message and
// kInvalidParamPayload).
absl::StatusOr<SamplingParams> NormalizeSampling(const SamplingRequest& request, int64_t vocab_size,
                                                 double default_temperature);

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_SAMPLING_REQUEST_H_
