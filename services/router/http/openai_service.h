// The OpenAI-compatible API over the router's scheduler: GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions (whole or streamed as server-sent events), vLLM's POST /tokenize and
// POST /detokenize, GET /version, GET /metrics (Prometheus) and GET /health. Handlers run on the
// HTTP server's connection threads and block on their request's tokens; a client that goes
// away has its request cancelled. With an API key, /v1/* and the tokenizer's routes need it
// (`Authorization: Bearer KEY`); /health, /metrics and /version stay open, as vLLM's.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "common/chat/chat_template.h"
#include "common/chat/tool_call_parser.h"
#include "common/grammar/grammar_compiler.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_request.h"
#include "services/router/http/serving_metrics.h"
#include "services/router/scheduler.h"

namespace strata {

struct OpenAiServiceOptions {
  std::string model_name;  // what /v1/models lists and requests must name
  // The key clients must send as `Authorization: Bearer KEY` (router_limits.h's IsApiKey);
  // empty: none.
  std::string api_key;
  // The router's state for /metrics, taken per scrape.
  std::function<RouterSnapshot()> snapshot;
  // Whether the router serves (every worker registered), for /health.
  std::function<bool()> ready;
  // Compiles response formats (must outlive the service); null: every one is refused.
  GrammarCompiler* grammar = nullptr;
  // How the model writes tool calls; unset: ChooseToolCallFormat's "auto" for its template.
  std::optional<ToolCallFormat> tool_call_format;
};

class OpenAiService {
 public:
  // `tokenizer` may be null: then only token-id prompts work and chat is refused.
  OpenAiService(OpenAiServiceOptions options, const ModelConfig& config, Scheduler& scheduler,
                const Tokenizer* tokenizer, ChatTemplate chat_template);

  void Handle(const HttpRequest& request, HttpResponder& responder);

  const ServingMetrics& metrics() const { return metrics_; }

 private:
  // Whether `request` may use its route: true without an API key or for an open route;
  // otherwise false after a 401.
  bool Authorized(const HttpRequest& request, HttpResponder& responder) const;
  void Generate(const HttpRequest& http, bool chat, HttpResponder& responder);
  // POST /tokenize and /detokenize (tokenize_routes.cc).
  void Tokenize(const HttpRequest& http, HttpResponder& responder) const;
  void Detokenize(const HttpRequest& http, HttpResponder& responder) const;
  // NOT_FOUND (404 model_not_found) unless `model` is the one served.
  absl::Status CheckModel(absl::string_view model) const;
  // A chat request's messages through the model's chat template (or the plain format), with
  // its tools when they are offered, and ForcedPrefix after it.
  absl::StatusOr<std::string> ChatText(const OpenAiRequest& request) const;
  // What the assistant's turn starts with when the request's tool_choice asks for a call:
  // "required" or a named function make the reply begin as a call (ForcedCallPrefix).
  std::string ForcedPrefix(const OpenAiRequest& request) const;
  // A forced call (tool_choice "required" or a named function) held to whole calls whose
  // arguments follow the function's schema, when the server has a grammar engine.
  std::optional<ResponseFormat> ForcedCallFormat(const OpenAiRequest& request) const;
  // Whether a chat's text is encoded with the tokenizer's special tokens: only in the plain
  // format, as a template writes its own (as apply_chat_template assumes).
  bool ChatAddsSpecialTokens() const { return !chat_template_.has_template(); }
  // The prompt's token ids: the completion prompt encoded, or the chat rendered and encoded.
  absl::StatusOr<std::vector<int32_t>> PromptIds(const OpenAiRequest& request) const;
  absl::StatusOr<RequestSpec> ToSpec(const OpenAiRequest& request) const;
  void SendError(HttpResponder& responder, const ApiError& error, RequestOutcome outcome);
  std::string TokenText(int32_t id) const;
  // What `echo` writes before the completion: the prompt as sent, or its ids' text.
  std::string EchoText(const OpenAiRequest& request, const std::vector<int32_t>& prompt) const;

  OpenAiServiceOptions options_;
  const ModelConfig& config_;
  Scheduler& scheduler_;
  const Tokenizer* tokenizer_;
  ChatTemplate chat_template_;
  ToolCallFormat tool_format_;
  ServingMetrics metrics_;
  std::atomic<uint64_t> next_id_{1};
  int64_t created_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_
