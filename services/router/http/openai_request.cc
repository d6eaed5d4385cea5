#include "services/router/http/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "services/router/request.h"

namespace strata {
namespace {

constexpr char kCodePayload[] = "strata.openai.code";

bool Present(const Json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// Chat message content: a string, or parts of which only text parts are taken.
absl::StatusOr<std::string> ContentText(const Json& content, size_t index) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return BadParam(param, "content must be a string or a list of parts");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != Json("text") ||
        !part.contains("text") || !part["text"].is_string()) {
      return BadParam(param,
                      "only text content parts ({\"type\": \"text\", \"text\": ...}) "
                      "are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::Status ParsePrompt(const Json& prompt, OpenAiRequest& r) {
  auto ids = [&](const Json& list) -> absl::Status {
    for (const Json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return BadParam("prompt", "token ids must be non-negative integers");
      }
      r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    if (r.prompt_ids.empty()) return BadParam("prompt", "the prompt is empty");
    return absl::OkStatus();
  };
  if (prompt.is_string()) {
    r.prompt_text = prompt.get<std::string>();
    return absl::OkStatus();
  }
  if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_number_integer()) return ids(prompt);
    if (prompt.size() > 1) {
      return BadParam("prompt", "one prompt per request: a list of prompts is not supported");
    }
    if (prompt[0].is_string()) {
      r.prompt_text = prompt[0].get<std::string>();
      return absl::OkStatus();
    }
    if (prompt[0].is_array()) return ids(prompt[0]);
  }
  return BadParam("prompt", "'prompt' must be a string, a list of token ids, or a list of one");
}

absl::Status ParseMessages(const Json& messages, OpenAiRequest& r) {
  if (!messages.is_array() || messages.empty()) {
    return BadParam("messages", "'messages' must be a non-empty list");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return BadParam(absl::StrCat("messages[", i, "].role"), "each message needs a string 'role'");
    }
    // An assistant's tool calls may come without content.
    if (!m.contains("content") && !HasToolCalls(m)) {
      return BadParam(absl::StrCat("messages[", i, "].content"), "each message needs 'content'");
    }
    ASSIGN_OR_RETURN(std::string text, ContentText(m.value("content", Json()), i));
    Json message = m;  // other keys (name, reasoning_content) stay for the template
    message["content"] = std::move(text);
    RETURN_IF_ERROR(ParseMessageToolFields(m, i, message));
    r.messages.push_back(std::move(message));
  }
  return absl::OkStatus();
}

// vLLM's extra sampling fields that are not plain numbers: logit_bias ({"token id": bias}),
// min_tokens, stop_token_ids, include_stop_str_in_output, skip_special_tokens. Types here,
// values by CheckSampling and NormalizeSampling.
absl::Status ParseStopAndBias(const Json& body, SamplingRequest& s) {
  if (Present(body, "logit_bias")) {
    const Json& bias = body["logit_bias"];
    if (!bias.is_object()) {
      return BadParam("logit_bias", "'logit_bias' must be an object of token ids to numbers");
    }
    for (const auto& [key, value] : bias.items()) {
      int64_t id = -1;
      if (key.empty() || key.size() > 10 ||
          !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          (id = std::stoll(key)) > std::numeric_limits<int32_t>::max()) {
        return BadParam("logit_bias",
                        absl::StrCat("'logit_bias' keys must be token ids, not \"", key, "\""));
      }
      if (!value.is_number()) {
        return BadParam("logit_bias", absl::StrCat("'logit_bias' values must be numbers; token ",
                                                   key, "'s is not"));
      }
      s.logit_bias.emplace_back(id, value.get<double>());
    }
  }
  if (Present(body, "min_tokens")) {
    const Json& v = body["min_tokens"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return BadParam("min_tokens", "'min_tokens' must be an integer of at least 0");
    }
    s.min_tokens = v.get<int64_t>();
  }
  if (Present(body, "stop_token_ids")) {
    const Json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return BadParam("stop_token_ids", "'stop_token_ids' must be a list");
    for (const Json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return BadParam("stop_token_ids", "'stop_token_ids' must be token ids");
      }
      s.stop_token_ids.push_back(id.get<int64_t>());
    }
  }
  for (const auto& [key, field] :
       {std::pair{"include_stop_str_in_output", &s.include_stop_str_in_output},
        std::pair{"skip_special_tokens", &s.skip_special_tokens}}) {
    if (!Present(body, key)) continue;
    if (!body[key].is_boolean()) {
      return BadParam(key, absl::StrCat("'", key, "' must be a boolean"));
    }
    *field = body[key].get<bool>();
  }
  return absl::OkStatus();
}

// `logprobs` (completions: how many alternatives; chat: whether), chat's `top_logprobs`, and
// completions' `echo` (with max_tokens 0: the prompt alone).
absl::Status ParseLogprobs(const Json& body, OpenAiRequest& r) {
  const std::string range = absl::StrCat("an integer in [0, ", kMaxTopLogprobs, "]");
  if (Present(body, "logprobs")) {
    const Json& l = body["logprobs"];
    if (r.chat) {
      if (!l.is_boolean()) return BadParam("logprobs", "'logprobs' must be a boolean");
      r.logprobs = l.get<bool>();
    } else {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > kMaxTopLogprobs) {
        return BadParam("logprobs",
                        absl::StrCat("'logprobs' must be ", range,
                                     ": how many of the most likely tokens come with each one"));
      }
      r.logprobs = true;
      r.top_logprobs = static_cast<int>(l.get<int64_t>());
    }
  }
  if (r.chat && Present(body, "top_logprobs")) {
    const Json& t = body["top_logprobs"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > kMaxTopLogprobs) {
      return BadParam("top_logprobs", absl::StrCat("'top_logprobs' must be ", range));
    }
    if (!r.logprobs) return BadParam("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = static_cast<int>(t.get<int64_t>());
  }
  if (Present(body, "echo")) {
    if (!body["echo"].is_boolean()) return BadParam("echo", "'echo' must be a boolean");
    r.echo = body["echo"].get<bool>();
  }
  if (r.max_tokens == 0 && !(r.echo && !r.chat)) {
    return BadParam("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': true)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string ErrorBody(const ApiError& e) {
  Json body;
  body["error"]["message"] = e.message;
  body["error"]["type"] = e.type;
  body["error"]["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  body["error"]["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::Status BadParam(absl::string_view param, absl::string_view message, absl::string_view code) {
  absl::Status status = InvalidParam(param, message);
  if (!code.empty()) status.SetPayload(kCodePayload, absl::Cord(code));
  return status;
}

absl::Status ModelNotFound(absl::string_view requested, absl::string_view served) {
  absl::Status status = absl::NotFoundError(
      absl::StrCat("the model '", requested, "' does not exist; this server has '", served, "'"));
  status.SetPayload(kInvalidParamPayload, absl::Cord("model"));
  status.SetPayload(kCodePayload, absl::Cord("model_not_found"));
  return status;
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  if (auto param = status.GetPayload(kInvalidParamPayload)) e.param = std::string(*param);
  if (auto code = status.GetPayload(kCodePayload)) e.code = std::string(*code);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
  }
  return e;
}

namespace {

// Deeper JSON than any real request nests (chat messages with tool calls: under ten).
constexpr int kMaxJsonDepth = 64;

// The keys each endpoint reads: OpenAI's, and vLLM's extensions Strata honours (or refuses by
// name, as `n` above 1). Any other key is a 400 that names it: an option a client counts on is
// never dropped unnoticed.
constexpr absl::string_view kSharedKeys[] = {"model",
                                             "max_tokens",
                                             "temperature",
                                             "top_p",
                                             "top_k",
                                             "min_p",
                                             "repetition_penalty",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "seed",
                                             "logit_bias",
                                             "min_tokens",
                                             "stop_token_ids",
                                             "include_stop_str_in_output",
                                             "skip_special_tokens",
                                             "stop",
                                             "stream",
                                             "stream_options",
                                             "n",
                                             "logprobs",
                                             "ignore_eos",
                                             "best_of",
                                             "echo",
                                             "suffix",
                                             "response_format",
                                             "guided_json",
                                             "guided_regex",
                                             "guided_choice",
                                             "guided_grammar",
                                             "guided_decoding_backend",
                                             "structured_outputs",
                                             "user"};
constexpr absl::string_view kCompletionKeys[] = {"prompt"};
constexpr absl::string_view kChatKeys[] = {"messages",
                                           "chat_template_kwargs",
                                           "add_generation_prompt",
                                           "max_completion_tokens",
                                           "top_logprobs",
                                           "tools",
                                           "tool_choice",
                                           "parallel_tool_calls"};

// The deepest nesting of arrays and objects in JSON text (strings skipped), found without
// parsing: what is done with a request's values (templates, conversions) recurses.
int JsonDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

absl::StatusOr<Json> ParseJsonObject(absl::string_view text) {
  if (const int depth = JsonDepth(text); depth > kMaxJsonDepth) {
    return BadParam("", absl::StrCat("the body nests ", depth, " levels deep; at most ",
                                     kMaxJsonDepth, " are accepted"));
  }
  Json body = Json::parse(text.begin(), text.end(), nullptr, false);
  if (body.is_discarded()) return BadParam("", "the body is not valid JSON");
  if (!body.is_object()) return BadParam("", "the body must be a JSON object");
  return body;
}

absl::Status RefuseUnknownKeys(const Json& body,
                               std::initializer_list<absl::Span<const absl::string_view>> known) {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : body.items()) {
    bool found = false;
    for (absl::Span<const absl::string_view> list : known) {
      found = found || std::find(list.begin(), list.end(), key) != list.end();
    }
    if (!found) unknown.push_back(key);
  }
  if (unknown.empty()) return absl::OkStatus();
  std::string names;
  for (const std::string& key : unknown) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", "'", key, "'");
  }
  return BadParam(unknown[0],
                  absl::StrCat(unknown.size() == 1 ? "unknown parameter " : "unknown parameters ",
                               names, ": not supported (docs/http.md lists the parameters)"));
}

absl::Status ParseChatFields(const Json& body, OpenAiRequest& r) {
  r.chat = true;
  if (!body.contains("messages")) return BadParam("messages", "'messages' is required");
  RETURN_IF_ERROR(ParseMessages(body["messages"], r));
  if (Present(body, "chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object()) {
      return BadParam("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    r.template_variables = body["chat_template_kwargs"];
  }
  if (Present(body, "add_generation_prompt")) {
    if (!body["add_generation_prompt"].is_boolean()) {
      return BadParam("add_generation_prompt", "'add_generation_prompt' must be a boolean");
    }
    r.add_generation_prompt = body["add_generation_prompt"].get<bool>();
  }
  return ParseToolFields(body, r.tools);
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view text, bool chat) {
  ASSIGN_OR_RETURN(const Json body, ParseJsonObject(text));
  RETURN_IF_ERROR(chat ? RefuseUnknownKeys(body, {kSharedKeys, kChatKeys})
                       : RefuseUnknownKeys(body, {kSharedKeys, kCompletionKeys}));
  OpenAiRequest r;
  r.chat = chat;
  if (!body.contains("model") || !body["model"].is_string()) {
    return BadParam("model", "'model' is required (a string; GET /v1/models lists them)");
  }
  r.model = body["model"].get<std::string>();
  if (chat) {
    RETURN_IF_ERROR(ParseChatFields(body, r));
  } else {
    if (!body.contains("prompt")) return BadParam("prompt", "'prompt' is required");
    RETURN_IF_ERROR(ParsePrompt(body["prompt"], r));
  }
  const std::vector<const char*> max_keys =
      chat ? std::vector<const char*>{"max_completion_tokens", "max_tokens"}
           : std::vector<const char*>{"max_tokens"};
  for (const char* key : max_keys) {
    if (!Present(body, key)) continue;
    const Json& v = body[key];
    // Completions take 0 with echo (checked below): the prompt alone, scored.
    if (!v.is_number_integer() || v.get<int64_t>() < (chat ? 1 : 0)) {
      return BadParam(key, absl::StrCat("'", key, "' must be an integer of at least 1"));
    }
    r.max_tokens = v.get<int64_t>();
  }
  // Types here; the values by the rules every front end shares, checked before any prompt is
  // tokenized (NormalizeSampling applies them again when the request is made into a spec).
  for (const auto& [key, field] :
       {std::pair{"temperature", &r.sampling.temperature}, std::pair{"top_p", &r.sampling.top_p},
        std::pair{"min_p", &r.sampling.min_p},
        std::pair{"repetition_penalty", &r.sampling.repetition_penalty},
        std::pair{"presence_penalty", &r.sampling.presence_penalty},
        std::pair{"frequency_penalty", &r.sampling.frequency_penalty}}) {
    if (!Present(body, key)) continue;
    if (!body[key].is_number()) return BadParam(key, absl::StrCat("'", key, "' must be a number"));
    *field = body[key].get<double>();
  }
  if (Present(body, "top_k")) {
    if (!body["top_k"].is_number_integer() ||
        body["top_k"].is_number_unsigned() && body["top_k"].get<uint64_t>() > INT64_MAX) {
      return BadParam("top_k", "'top_k' must be an integer: 0 or -1 for no limit");
    }
    r.sampling.top_k = body["top_k"].get<int64_t>();
  }
  if (Present(body, "seed")) {
    if (!body["seed"].is_number_integer()) return BadParam("seed", "'seed' must be an integer");
    r.sampling.seed = body["seed"].is_number_unsigned()
                          ? body["seed"].get<uint64_t>()
                          : static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  RETURN_IF_ERROR(ParseStopAndBias(body, r.sampling));
  RETURN_IF_ERROR(CheckSampling(r.sampling, kOpenAiTemperature));
  if (Present(body, "stop")) {
    const Json& stop = body["stop"];
    if (stop.is_string()) {
      r.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const Json& s : stop) {
        if (!s.is_string()) return BadParam("stop", "'stop' must be a string or strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return BadParam("stop", "'stop' must be a string or a list of strings");
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) return BadParam("stop", "stop strings cannot be empty");
    }
  }
  if (Present(body, "stream")) {
    if (!body["stream"].is_boolean()) return BadParam("stream", "'stream' must be a boolean");
    r.stream = body["stream"].get<bool>();
  }
  if (Present(body, "stream_options")) {
    const Json& o = body["stream_options"];
    if (!o.is_object()) return BadParam("stream_options", "'stream_options' must be an object");
    if (o.contains("include_usage") && !o["include_usage"].is_boolean()) {
      return BadParam("stream_options", "'include_usage' must be a boolean");
    }
    r.include_usage = o.contains("include_usage") && o["include_usage"].get<bool>();
  }
  if (Present(body, "n")) {
    const Json& n = body["n"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > kMaxSamples) {
      return BadParam("n", absl::StrCat("'n' must be an integer in [1, ", kMaxSamples,
                                        "]: the choices sampled from one prefill of the prompt"));
    }
    r.n = static_cast<int>(n.get<int64_t>());
  }
  RETURN_IF_ERROR(ParseLogprobs(body, r));
  if (Present(body, "ignore_eos")) {
    if (!body["ignore_eos"].is_boolean()) return BadParam("ignore_eos", "must be a boolean");
    r.ignore_eos = body["ignore_eos"].get<bool>();
  }
  // Options Strata does not implement are refused rather than ignored.
  if (Present(body, "best_of") && body["best_of"] != Json(1)) {
    return BadParam("best_of",
                    "'best_of' is not supported (no ranking of samples); 'n' returns every one");
  }
  if (Present(body, "suffix")) return BadParam("suffix", "'suffix' is not supported");
  ASSIGN_OR_RETURN(r.format, ParseResponseFormat(body));
  // An end user's id, for the provider's abuse monitoring: nothing here reads it.
  if (Present(body, "user") && !body["user"].is_string()) {
    return BadParam("user", "'user' must be a string");
  }
  return r;
}

std::string ContinuedAssistantText(const Json& messages) {
  if (!messages.is_array() || messages.empty()) return "";
  const Json& last = messages.back();
  if (!last.is_object() || last.value("role", Json()) != Json("assistant")) return "";
  const Json content = last.value("content", Json());
  return content.is_string() ? content.get<std::string>() : "";
}

}  // namespace strata
