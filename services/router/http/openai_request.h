// The OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions): parsed and
// checked into one form, with OpenAI-style errors (HTTP status, type, param, code).
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_REQUEST_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_REQUEST_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/engine/sampling_request.h"
#include "nlohmann/json.hpp"
#include "services/router/http/openai_response_format.h"
#include "services/router/http/openai_tools.h"

namespace strata {

using Json = nlohmann::ordered_json;

struct OpenAiRequest {
  bool chat = false;
  std::string model;
  // Completions: the prompt as text, or as token ids (exactly one is set).
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // Chat: [{"role", "content" (text)}], and the template's extra names.
  Json messages = Json::array();
  Json template_variables = Json::object();
  bool add_generation_prompt = true;
  ToolRequest tools;  // chat
  // Absent: 16 for completions, the context left for chat; 0 only with echo.
  std::optional<int64_t> max_tokens;
  // The sampling fields as sent (vLLM's extras too); NormalizeSampling's rules, the OpenAI default
  // temperature of 1 (kOpenAiTemperature).
  SamplingRequest sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Completions `logprobs: N` or chat `logprobs: true`: each token's log-probability, with
  // the `top_logprobs` (completions: N) most likely tokens at its position.
  bool logprobs = false;
  int top_logprobs = 0;
  // Completions: the prompt's text comes before the completion's (with logprobs, its tokens'
  // log-probabilities too, the first one's null).
  bool echo = false;
  bool ignore_eos = false;
  // response_format, or vLLM's guided_json / guided_regex / guided_choice.
  RequestedFormat format;
  // Choices: samples of the prompt sharing its prefill (RequestSpec::n), 1..kMaxSamples.
  int n = 1;
};

inline constexpr double kOpenAiTemperature = 1.0;

// An error as the API reports it.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// `{"error": {"message", "type", "param", "code"}}`.
std::string ErrorBody(const ApiError& error);

// An INVALID_ARGUMENT status that names the request field (and optionally an error code).
absl::Status BadParam(absl::string_view param, absl::string_view message,
                      absl::string_view code = "");
// NOT_FOUND for a request naming `requested` where the server has `served`: 404 with param
// `model` and code `model_not_found`, as OpenAI and vLLM answer.
absl::Status ModelNotFound(absl::string_view requested, absl::string_view served);
// The API's form of `status`: INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
// UNAVAILABLE 503, others 500.
ApiError ToApiError(const absl::Status& status);

// Parses a request body. INVALID_ARGUMENT (400) for bad JSON, missing or malformed fields,
// keys the endpoint does not know (every one named) and options Strata does not support (n
// above kMaxSamples, best_of, echo on chat, suffix, guided_grammar).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat);

// What every endpoint's body parse shares.
// The body as a JSON object: INVALID_ARGUMENT for bad JSON, another JSON type, or nesting
// deeper than any request needs (what is done with a request's values recurses).
absl::StatusOr<Json> ParseJsonObject(absl::string_view body);
// INVALID_ARGUMENT naming every key of `body` in none of the `known` lists (param: the first).
absl::Status RefuseUnknownKeys(const Json& body,
                               std::initializer_list<absl::Span<const absl::string_view>> known);
// A chat's `messages` (required), `chat_template_kwargs`, `add_generation_prompt` and tools
// (openai_tools.h) into `r`.
absl::Status ParseChatFields(const Json& body, OpenAiRequest& r);

// The text of the last of (parsed) `messages` when the reply continues it, an assistant's
// message; else empty.
std::string ContinuedAssistantText(const Json& messages);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_REQUEST_H_
