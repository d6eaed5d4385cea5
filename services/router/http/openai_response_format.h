// The OpenAI API's structured-output fields: `response_format` ({"type": "text"},
// {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema", ...}}) and
// vLLM's `guided_json`, `guided_regex` and `guided_choice`, read into one ResponseFormat.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_RESPONSE_FORMAT_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_RESPONSE_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/grammar/response_format.h"
#include "nlohmann/json.hpp"

namespace strata {

// A request's format and the field that gave it (what an error about it names; empty for
// text).
struct RequestedFormat {
  ResponseFormat format;
  std::string param;
};

// The format `body` asks for. INVALID_ARGUMENT naming the field for malformed values, unknown
// keys inside `response_format`, more than one of the fields, and guided_grammar /
// structured_outputs (not supported).
absl::StatusOr<RequestedFormat> ParseResponseFormat(const nlohmann::ordered_json& body);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_RESPONSE_FORMAT_H_
