// POST /tokenize and POST /detokenize, as vLLM's OpenAI server answers them, on the rules of
// gRPC's Tokenize and Detokenize (tokenization.h).
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "services/router/http/openai_service.h"
#include "services/router/tokenization.h"

namespace strata {
namespace {

constexpr absl::string_view kPromptKeys[] = {"model", "prompt", "add_special_tokens",
                                             "return_token_strs"};
constexpr absl::string_view kChatKeys[] = {
    "model", "messages",           "add_generation_prompt", "chat_template_kwargs",
    "tools", "add_special_tokens", "return_token_strs"};
constexpr absl::string_view kDetokenizeKeys[] = {"model", "tokens"};

// POST /tokenize's body: a completion's prompt or a chat's messages.
struct TokenizeRequest {
  OpenAiRequest input;  // chat: messages and the template's fields; otherwise prompt_text
  std::optional<std::string> model;
  std::optional<bool> add_special_tokens;  // absent: as the endpoint would encode it
  bool return_token_strs = false;
};

// `model` is optional here, as in vLLM: a string when sent.
absl::StatusOr<std::optional<std::string>> OptionalModel(const Json& body) {
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return BadParam("model", "'model' must be a string");
  return body["model"].get<std::string>();
}

absl::StatusOr<std::optional<bool>> OptionalBool(const Json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_boolean()) return BadParam(key, absl::StrCat("'", key, "' must be a boolean"));
  return body[key].get<bool>();
}

absl::StatusOr<TokenizeRequest> ParseTokenize(absl::string_view text) {
  ASSIGN_OR_RETURN(const Json body, ParseJsonObject(text));
  TokenizeRequest r;
  const bool chat = body.contains("messages");
  if (chat && body.contains("prompt")) {
    return BadParam("prompt", "send either 'prompt' or 'messages', not both");
  }
  RETURN_IF_ERROR(
      RefuseUnknownKeys(body, {chat ? absl::Span<const absl::string_view>(kChatKeys)
                                    : absl::Span<const absl::string_view>(kPromptKeys)}));
  ASSIGN_OR_RETURN(r.model, OptionalModel(body));
  if (chat) {
    RETURN_IF_ERROR(ParseChatFields(body, r.input));
  } else if (!body.contains("prompt") || !body["prompt"].is_string()) {
    return BadParam("prompt", "'prompt' (a string) or 'messages' is required");
  } else {
    r.input.prompt_text = body["prompt"].get<std::string>();
  }
  ASSIGN_OR_RETURN(r.add_special_tokens, OptionalBool(body, "add_special_tokens"));
  ASSIGN_OR_RETURN(std::optional<bool> strs, OptionalBool(body, "return_token_strs"));
  r.return_token_strs = strs.value_or(false);
  return r;
}

// The tokenizer's rules name no field; the API's errors do.
absl::Status Naming(absl::Status status, absl::string_view param) {
  if (status.code() != absl::StatusCode::kInvalidArgument ||
      status.GetPayload(kInvalidParamPayload).has_value()) {
    return status;
  }
  return BadParam(param, status.message());
}

void Answer(HttpResponder& responder, const absl::StatusOr<Json>& answer) {
  if (!answer.ok()) {
    const ApiError e = ToApiError(answer.status());
    responder.Send(e.status, "application/json", ErrorBody(e)).IgnoreError();
    return;
  }
  responder
      .Send(200, "application/json", answer->dump(-1, ' ', false, Json::error_handler_t::replace))
      .IgnoreError();
}

}  // namespace

void OpenAiService::Tokenize(const HttpRequest& http, HttpResponder& responder) const {
  Answer(responder, [&]() -> absl::StatusOr<Json> {
    ASSIGN_OR_RETURN(const TokenizeRequest r, ParseTokenize(http.body));
    if (r.model) RETURN_IF_ERROR(CheckModel(*r.model));
    std::string text;
    bool special = true;  // vLLM's default for a prompt
    if (r.input.chat) {
      ASSIGN_OR_RETURN(text, ChatText(r.input));
      // By default as /v1/chat/completions encodes it: the count is the prompt_tokens it bills.
      special = ChatAddsSpecialTokens();
    } else {
      text = *r.input.prompt_text;
    }
    special = r.add_special_tokens.value_or(special);
    absl::StatusOr<std::vector<int32_t>> ids = TokenizeText(tokenizer_, scheduler_, text, special);
    if (!ids.ok()) return Naming(ids.status(), r.input.chat ? "messages" : "prompt");
    Json answer{{"count", ids->size()},
                {"max_model_len", scheduler_.max_context_tokens()},
                {"tokens", *ids}};
    if (r.return_token_strs) {
      Json strs = Json::array();
      for (int32_t id : *ids) strs.push_back(tokenizer_->IdToToken(id).value_or(""));
      answer["token_strs"] = std::move(strs);
    }
    return answer;
  }());
}

void OpenAiService::Detokenize(const HttpRequest& http, HttpResponder& responder) const {
  Answer(responder, [&]() -> absl::StatusOr<Json> {
    ASSIGN_OR_RETURN(const Json body, ParseJsonObject(http.body));
    RETURN_IF_ERROR(RefuseUnknownKeys(body, {kDetokenizeKeys}));
    ASSIGN_OR_RETURN(const std::optional<std::string> model, OptionalModel(body));
    if (model) RETURN_IF_ERROR(CheckModel(*model));
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return BadParam("tokens", "'tokens' (a list of token ids) is required");
    }
    std::vector<int64_t> ids;
    for (const Json& id : body["tokens"]) {
      if (!id.is_number_integer()) return BadParam("tokens", "'tokens' must be integers");
      if (id.is_number_unsigned() && id.get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
        return BadParam("tokens", absl::StrCat("token id ", id.get<uint64_t>(), " at position ",
                                               ids.size(), " is outside the vocabulary"));
      }
      ids.push_back(id.get<int64_t>());
    }
    // As tokenizers' decode by default (and vLLM's /detokenize): special tokens are kept.
    absl::StatusOr<std::string> text =
        DetokenizeIds(tokenizer_, scheduler_, ids, /*skip_special_tokens=*/false);
    if (!text.ok()) return Naming(text.status(), "tokens");
    return Json{{"prompt", *text}};
  }());
}

}  // namespace strata
