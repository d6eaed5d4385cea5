// The OpenAI-compatible API over the router's scheduler: GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions (whole or streamed as server-sent events), GET /metrics
// (Prometheus) and GET /health. Handlers run on the HTTP server's connection threads and block
// on their request's tokens; a client that goes away has its request cancelled.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "common/chat/chat_template.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_request.h"
#include "services/router/http/serving_metrics.h"
#include "services/router/scheduler.h"

namespace strata {

struct OpenAiServiceOptions {
  std::string model_name;  // what /v1/models lists and requests must name
  // The router's state for /metrics, taken per scrape.
  std::function<RouterSnapshot()> snapshot;
  // Whether the router serves (every worker registered), for /health.
  std::function<bool()> ready;
};

class OpenAiService {
 public:
  // `tokenizer` may be null: then only token-id prompts work and chat is refused.
  OpenAiService(OpenAiServiceOptions options, const ModelConfig& config, Scheduler& scheduler,
                const Tokenizer* tokenizer, ChatTemplate chat_template);

  void Handle(const HttpRequest& request, HttpResponder& responder);

  const ServingMetrics& metrics() const { return metrics_; }

 private:
  void Generate(const HttpRequest& http, bool chat, HttpResponder& responder);
  // The prompt's token ids: the completion prompt encoded, or the chat rendered and encoded.
  absl::StatusOr<std::vector<int32_t>> PromptIds(const OpenAiRequest& request) const;
  absl::StatusOr<RequestSpec> ToSpec(const OpenAiRequest& request) const;
  void SendError(HttpResponder& responder, const ApiError& error, RequestOutcome outcome);
  std::string TokenText(int32_t id) const;

  OpenAiServiceOptions options_;
  const ModelConfig& config_;
  Scheduler& scheduler_;
  const Tokenizer* tokenizer_;
  ChatTemplate chat_template_;
  ServingMetrics metrics_;
  std::atomic<uint64_t> next_id_{1};
  int64_t created_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_
