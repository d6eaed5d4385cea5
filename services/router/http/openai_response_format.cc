#include "services/router/http/openai_response_format.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "services/router/http/openai_request.h"

namespace strata {
namespace {

bool Present(const Json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// INVALID_ARGUMENT naming the first key of `object` not in `known` (param: `where`).
absl::Status OnlyKeys(const Json& object, const std::string& where,
                      std::initializer_list<absl::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return BadParam(where, absl::StrCat("unknown key '", key, "' in '", where, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ResponseFormat> FromResponseFormat(const Json& f) {
  constexpr char kParam[] = "response_format";
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
    return BadParam(kParam, "'response_format' must be an object with a string 'type'");
  }
  const std::string type = f["type"].get<std::string>();
  ResponseFormat format;
  if (type == "text" || type == "json_object") {
    RETURN_IF_ERROR(OnlyKeys(f, kParam, {"type"}));
    if (type == "json_object") format.type = ResponseFormat::Type::kJsonObject;
    return format;
  }
  if (type != "json_schema") {
    return BadParam(kParam, absl::StrCat("'response_format' type '", type,
                                         "' is not supported: text, json_object or json_schema"));
  }
  RETURN_IF_ERROR(OnlyKeys(f, kParam, {"type", "json_schema"}));
  if (!Present(f, "json_schema") || !f["json_schema"].is_object()) {
    return BadParam(kParam, "'response_format' of type json_schema needs a 'json_schema' object");
  }
  const Json& s = f["json_schema"];
  RETURN_IF_ERROR(
      OnlyKeys(s, "response_format.json_schema", {"name", "description", "schema", "strict"}));
  if (!Present(s, "name") || !s["name"].is_string()) {
    return BadParam("response_format.json_schema", "'json_schema' needs a string 'name'");
  }
  if (Present(s, "description") && !s["description"].is_string()) {
    return BadParam("response_format.json_schema", "'description' must be a string");
  }
  // Strict or not, the schema is enforced: decoding follows its grammar either way.
  if (Present(s, "strict") && !s["strict"].is_boolean()) {
    return BadParam("response_format.json_schema", "'strict' must be a boolean");
  }
  if (!Present(s, "schema") || !s["schema"].is_object()) {
    return BadParam("response_format.json_schema", "'json_schema' needs a 'schema' object");
  }
  format.type = ResponseFormat::Type::kJsonSchema;
  format.json_schema = s["schema"].dump();
  return format;
}

absl::StatusOr<ResponseFormat> FromGuidedJson(const Json& schema) {
  ResponseFormat format;
  format.type = ResponseFormat::Type::kJsonSchema;
  if (schema.is_object()) {
    format.json_schema = schema.dump();
  } else if (schema.is_string()) {
    format.json_schema = schema.get<std::string>();
  } else {
    return BadParam("guided_json", "'guided_json' must be a JSON schema (an object or its text)");
  }
  return format;
}

absl::StatusOr<ResponseFormat> FromGuidedChoice(const Json& choices) {
  if (!choices.is_array() || choices.empty()) {
    return BadParam("guided_choice", "'guided_choice' must be a non-empty list of strings");
  }
  ResponseFormat format;
  format.type = ResponseFormat::Type::kChoice;
  for (const Json& choice : choices) {
    if (!choice.is_string() || choice.get<std::string>().empty()) {
      return BadParam("guided_choice", "'guided_choice' must be a list of non-empty strings");
    }
    format.choices.push_back(choice.get<std::string>());
  }
  return format;
}

}  // namespace

absl::StatusOr<RequestedFormat> ParseResponseFormat(const Json& body) {
  for (const char* key : {"guided_grammar", "structured_outputs"}) {
    if (Present(body, key)) {
      return BadParam(key, absl::StrCat("'", key,
                                        "' is not supported: use response_format, "
                                        "guided_json, guided_regex or guided_choice"));
    }
  }
  if (Present(body, "guided_decoding_backend")) {
    const Json& backend = body["guided_decoding_backend"];
    if (!backend.is_string() || (backend != Json("xgrammar") && backend != Json("auto"))) {
      return BadParam("guided_decoding_backend",
                      "'guided_decoding_backend' can only be \"xgrammar\" (or \"auto\")");
    }
  }
  RequestedFormat requested;
  auto take = [&](const char* param, absl::StatusOr<ResponseFormat> format) -> absl::Status {
    RETURN_IF_ERROR(format.status());
    if (!format->constrained()) return absl::OkStatus();
    if (requested.format.constrained()) {
      return BadParam(param, absl::StrCat("'", param, "' and '", requested.param,
                                          "' both constrain the output: give one"));
    }
    requested.format = *std::move(format);
    requested.param = param;
    return absl::OkStatus();
  };
  if (Present(body, "response_format")) {
    RETURN_IF_ERROR(take("response_format", FromResponseFormat(body["response_format"])));
  }
  if (Present(body, "guided_json")) {
    RETURN_IF_ERROR(take("guided_json", FromGuidedJson(body["guided_json"])));
  }
  if (Present(body, "guided_regex")) {
    if (!body["guided_regex"].is_string()) {
      return BadParam("guided_regex", "'guided_regex' must be a string");
    }
    ResponseFormat format;
    format.type = ResponseFormat::Type::kRegex;
    format.regex = body["guided_regex"].get<std::string>();
    RETURN_IF_ERROR(take("guided_regex", format));
  }
  if (Present(body, "guided_choice")) {
    RETURN_IF_ERROR(take("guided_choice", FromGuidedChoice(body["guided_choice"])));
  }
  return requested;
}

}  // namespace strata
