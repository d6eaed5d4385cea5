#include "services/router/http/openai_service.h"

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/same_secret.h"
#include "common/util/status_macros.h"
#include "common/util/version.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kBearer[] = "Bearer ";

// The scheduler's output for one request, queued for the connection thread that waits on it.
class QueueSink : public ResponseSink {
 public:
  struct Event {
    bool finished = false;
    std::vector<int32_t> ids;
    std::string text;
    std::vector<float> logprobs;
    FinishReason reason = FinishReason::kNone;
    RequestUsage usage;
    absl::Status status;
  };

  void OnLogprobs(const std::vector<TokenLogprobs>& logprobs) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const TokenLogprobs& l : logprobs) pending_logprobs_.push_back(l.logprob);
  }
  void OnTokens(const std::vector<int32_t>& ids, const std::string& text) override {
    Event e;
    e.ids = ids;
    e.text = text;
    std::lock_guard<std::mutex> lock(mu_);
    e.logprobs.swap(pending_logprobs_);
    events_.push_back(std::move(e));
    cv_.notify_one();
  }
  void OnFinish(FinishReason reason, const RequestUsage& usage,
                const absl::Status& status) override {
    Event e;
    e.finished = true;
    e.reason = reason;
    e.usage = usage;
    e.status = status;
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_one();
  }
  // The next event, or nothing after `timeout` (the caller then checks on its client).
  std::optional<Event> Next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::vector<float> pending_logprobs_;
};

const char* FinishName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
    case FinishReason::kEos:
      return "stop";
    default:
      return "abort";
  }
}

Json UsageJson(const RequestUsage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

// Logprobs of generated tokens, accumulated in the shape of the endpoint.
class LogprobsBuilder {
 public:
  LogprobsBuilder(bool chat, int top) : chat_(chat), top_(top) {
    if (chat) {
      json_ = Json{{"content", Json::array()}};
    } else {
      json_ = Json{{"tokens", Json::array()},
                   {"token_logprobs", Json::array()},
                   {"top_logprobs", Json::array()},
                   {"text_offset", Json::array()}};
    }
  }
  // Only the chosen token is known: top_logprobs hold it alone.
  void Add(const std::string& token, float logprob, size_t text_offset) {
    if (chat_) {
      Json bytes = Json::array();
      for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
      Json top = Json::array();
      if (top_ > 0) top.push_back(Json{{"token", token}, {"logprob", logprob}, {"bytes", bytes}});
      json_["content"].push_back(
          Json{{"token", token}, {"logprob", logprob}, {"bytes", bytes}, {"top_logprobs", top}});
    } else {
      json_["tokens"].push_back(token);
      json_["token_logprobs"].push_back(logprob);
      json_["top_logprobs"].push_back(top_ > 0 ? Json{{token, logprob}} : Json(nullptr));
      json_["text_offset"].push_back(text_offset);
    }
  }
  Json Take() {
    Json out = std::move(json_);
    *this = LogprobsBuilder(chat_, top_);
    return out;
  }

 private:
  bool chat_;
  int top_;
  Json json_;
};

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

OpenAiService::OpenAiService(OpenAiServiceOptions options, const ModelConfig& config,
                             Scheduler& scheduler, const Tokenizer* tokenizer,
                             ChatTemplate chat_template)
    : options_(std::move(options)),
      config_(config),
      scheduler_(scheduler),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

void OpenAiService::SendError(HttpResponder& responder, const ApiError& error,
                              RequestOutcome outcome) {
  metrics_.Count(outcome);
  responder.Send(error.status, "application/json", ErrorBody(error)).IgnoreError();
}

bool OpenAiService::Authorized(const HttpRequest& request, HttpResponder& responder) const {
  // vLLM's rule (every path under /v1), and the tokenizer's routes: they read the prompts'
  // text as generation does. /health, /metrics and /version stay open for probes and scrapers.
  if (options_.api_key.empty() || !(absl::StartsWith(request.path, "/v1") ||
                                    request.path == "/tokenize" || request.path == "/detokenize")) {
    return true;
  }
  const auto header = request.headers.find("authorization");
  absl::string_view presented;
  if (header != request.headers.end() && absl::StartsWithIgnoreCase(header->second, kBearer)) {
    presented = absl::StripLeadingAsciiWhitespace(
        absl::string_view(header->second).substr(sizeof(kBearer) - 1));
  }
  if (!presented.empty() && SameSecret(presented, options_.api_key)) return true;
  // The message never repeats what was sent: it may be a near miss of the key.
  const ApiError e{401, "invalid_request_error",
                   presented.empty()
                       ? "this server needs an API key: send 'Authorization: Bearer <key>'"
                       : "the API key is not valid",
                   "", "invalid_api_key"};
  responder.AddHeader("WWW-Authenticate", "Bearer");
  responder.Send(401, "application/json", ErrorBody(e)).IgnoreError();
  return false;
}

void OpenAiService::Handle(const HttpRequest& request, HttpResponder& responder) {
  struct Route {
    const char* path;
    const char* method;
  };
  static const Route kRoutes[] = {
      {"/v1/models", "GET"}, {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"}, {"/detokenize", "POST"},     {"/version", "GET"},
      {"/metrics", "GET"},   {"/health", "GET"}};
  if (!Authorized(request, responder)) return;
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (request.path == r.path) route = &r;
  }
  if (route == nullptr) {
    ApiError e{404, "invalid_request_error", absl::StrCat("no such path: ", request.path), "",
               "not_found"};
    responder.Send(404, "application/json", ErrorBody(e)).IgnoreError();
    return;
  }
  if (request.method != route->method) {
    ApiError e{405, "invalid_request_error",
               absl::StrCat(request.path, " takes ", route->method, ", not ", request.method), "",
               "method_not_allowed"};
    responder.Send(405, "application/json", ErrorBody(e)).IgnoreError();
    return;
  }
  if (request.path == "/v1/models") {
    Json model{{"id", options_.model_name},
               {"object", "model"},
               {"created", created_},
               {"owned_by", "strata"},
               {"max_model_len", scheduler_.max_context_tokens()}};
    Json body{{"object", "list"}, {"data", Json::array({model})}};
    responder.Send(200, "application/json", Dump(body)).IgnoreError();
  } else if (request.path == "/metrics") {
    const RouterSnapshot snapshot = options_.snapshot ? options_.snapshot() : RouterSnapshot();
    responder
        .Send(200, "text/plain; version=0.0.4; charset=utf-8",
              RenderMetrics(metrics_, scheduler_.metrics(), snapshot))
        .IgnoreError();
  } else if (request.path == "/health") {
    const bool ready = !options_.ready || options_.ready();
    responder
        .Send(ready ? 200 : 503, "application/json",
              ready ? "{\"status\": \"ok\"}" : "{\"status\": \"waiting for workers\"}")
        .IgnoreError();
  } else if (request.path == "/version") {
    responder.Send(200, "application/json", Dump(Json{{"version", StrataVersion()}})).IgnoreError();
  } else if (request.path == "/tokenize") {
    Tokenize(request, responder);
  } else if (request.path == "/detokenize") {
    Detokenize(request, responder);
  } else {
    Generate(request, request.path == "/v1/chat/completions", responder);
  }
}

absl::StatusOr<std::vector<int32_t>> OpenAiService::PromptIds(const OpenAiRequest& r) const {
  const char* param = r.chat ? "messages" : "prompt";
  if (!r.chat && r.prompt_text == std::nullopt) {
    for (int32_t id : r.prompt_ids) {
      if (id >= config_.vocab_size) {
        return BadParam("prompt", absl::StrCat("token id ", id, " is outside the vocabulary"));
      }
    }
    return r.prompt_ids;
  }
  if (tokenizer_ == nullptr) {
    return BadParam(param, "this model has no tokenizer.json: send the prompt as token ids");
  }
  std::string text;
  bool special = true;
  if (r.chat) {
    ASSIGN_OR_RETURN(text, ChatText(r));
    special = ChatAddsSpecialTokens();
  } else {
    text = *r.prompt_text;
  }
  // A prompt that cannot fit is refused by its length, before paying for its tokens.
  if (absl::Status fits = scheduler_.CheckTextFits("the prompt", text.size(), true); !fits.ok()) {
    return BadParam(param, fits.message(), "context_length_exceeded");
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, special);
  if (!ids.ok()) return BadParam(param, ids.status().message());
  if (ids->empty()) return BadParam(param, "the prompt encodes to no tokens");
  return ids;
}

absl::StatusOr<std::string> OpenAiService::ChatText(const OpenAiRequest& r) const {
  absl::StatusOr<std::string> rendered =
      chat_template_.Render(r.messages, r.add_generation_prompt, r.template_variables);
  if (!rendered.ok()) return BadParam("messages", rendered.status().message());
  return rendered;
}

absl::Status OpenAiService::CheckModel(absl::string_view model) const {
  if (model == options_.model_name) return absl::OkStatus();
  return ModelNotFound(model, options_.model_name);
}

absl::StatusOr<RequestSpec> OpenAiService::ToSpec(const OpenAiRequest& r) const {
  RETURN_IF_ERROR(CheckModel(r.model));
  RequestSpec spec;
  ASSIGN_OR_RETURN(spec.prompt, PromptIds(r));
  const int64_t context = scheduler_.max_context_tokens();
  const int64_t prompt = static_cast<int64_t>(spec.prompt.size());
  const char* param = r.chat ? "messages" : "prompt";
  if (prompt >= context) {
    return BadParam(
        param,
        absl::StrCat("the prompt has ", prompt, " tokens; this model's context holds ", context),
        "context_length_exceeded");
  }
  const int64_t max_tokens = r.max_tokens.value_or(r.chat ? context - prompt : 16);
  if (prompt + max_tokens > context) {
    return BadParam(r.chat && r.max_tokens ? "max_tokens" : "max_tokens",
                    absl::StrCat("the prompt's ", prompt, " tokens and max_tokens ", max_tokens,
                                 " are over the context of ", context, " tokens"),
                    "context_length_exceeded");
  }
  if (!r.stop.empty() && tokenizer_ == nullptr) {
    return BadParam("stop", "stop strings need a model with a tokenizer");
  }
  spec.max_new_tokens = static_cast<int>(max_tokens);
  ASSIGN_OR_RETURN(spec.sampling,
                   NormalizeSampling(r.sampling, config_.vocab_size, kOpenAiTemperature));
  spec.stop = r.stop;
  spec.ignore_eos = r.ignore_eos;
  spec.logprobs = r.logprobs;
  return spec;
}

std::string OpenAiService::TokenText(int32_t id) const {
  if (tokenizer_ == nullptr) return absl::StrCat("token_id:", id);
  absl::StatusOr<std::string> text = tokenizer_->Decode({id}, /*skip_special_tokens=*/false);
  return text.ok() ? *text : absl::StrCat("token_id:", id);
}

void OpenAiService::Generate(const HttpRequest& http, bool chat, HttpResponder& responder) {
  const Clock::time_point arrival = Clock::now();
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(http.body, chat);
  if (!parsed.ok())
    return SendError(responder, ToApiError(parsed.status()), RequestOutcome::kInvalid);
  const OpenAiRequest& r = *parsed;
  absl::StatusOr<RequestSpec> spec = ToSpec(r);
  if (!spec.ok()) return SendError(responder, ToApiError(spec.status()), RequestOutcome::kInvalid);
  auto sink = std::make_shared<QueueSink>();
  absl::StatusOr<Scheduler::Ticket> ticket = scheduler_.Submit(*std::move(spec), sink);
  if (!ticket.ok()) {
    const ApiError e = ToApiError(ticket.status());
    return SendError(
        responder, e,
        e.status == 429 || e.status == 503 ? RequestOutcome::kRejected : RequestOutcome::kInvalid);
  }

  const std::string id =
      absl::StrCat(chat ? "chatcmpl-" : "cmpl-", absl::Hex(next_id_++, absl::kZeroPad16));
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const char* object =
      chat ? (r.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  auto chunk = [&](Json choice) {
    return Json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", options_.model_name},
                {"choices", Json::array({std::move(choice)})}};
  };
  LogprobsBuilder logprobs(chat, r.top_logprobs);
  std::string text;
  bool stream_ok = true;
  if (r.stream) {
    stream_ok = responder.StartStream(200, "text/event-stream").ok();
    if (stream_ok && chat) {
      Json first = chunk(Json{{"index", 0},
                              {"delta", Json{{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}});
      stream_ok = responder.WriteChunk(absl::StrCat("data: ", Dump(first), "\n\n")).ok();
    }
  }
  bool cancelled = false;
  Clock::time_point last_check = arrival;
  while (true) {
    std::optional<QueueSink::Event> event = sink->Next(std::chrono::milliseconds(50));
    // A client that went away (or a failed write) cancels the request: checked every 50 ms
    // even while tokens keep coming. The loop then waits for the finish, so that nothing of
    // the request is left behind.
    if (!cancelled && (!stream_ok || Clock::now() - last_check > std::chrono::milliseconds(50))) {
      last_check = Clock::now();
      if (!stream_ok || responder.ClientGone()) {
        scheduler_.Cancel(*ticket);
        stream_ok = false;
        cancelled = true;
      }
    }
    if (!event) continue;
    if (!event->finished) {
      if (r.logprobs) {
        size_t offset = text.size();
        for (size_t i = 0; i < event->ids.size() && i < event->logprobs.size(); ++i) {
          const std::string token = TokenText(event->ids[i]);
          logprobs.Add(token, event->logprobs[i], offset);
          offset += token.size();
        }
      }
      text += event->text;
      if (r.stream && stream_ok && (!event->text.empty() || r.logprobs)) {
        Json choice = chat ? Json{{"index", 0}, {"delta", Json{{"content", event->text}}}}
                           : Json{{"index", 0}, {"text", event->text}};
        choice["logprobs"] = r.logprobs ? logprobs.Take() : Json(nullptr);
        choice["finish_reason"] = nullptr;
        stream_ok = responder.WriteChunk(absl::StrCat("data: ", Dump(chunk(choice)), "\n\n")).ok();
      }
      continue;
    }
    // Finished.
    if (!stream_ok) {
      responder.set_keep_alive(false);
      metrics_.Count(RequestOutcome::kCancelled);
      if (!responder.responded()) responder.Send(499, "application/json", "{}").IgnoreError();
      return;
    }
    if (event->reason == FinishReason::kError || event->reason == FinishReason::kCancelled) {
      const ApiError e =
          event->reason == FinishReason::kError
              ? ApiError{500, "server_error", std::string(event->status.message()), "", ""}
              : ApiError{503, "server_error", "the server is shutting down", "", ""};
      metrics_.Count(event->reason == FinishReason::kError ? RequestOutcome::kError
                                                           : RequestOutcome::kCancelled);
      if (r.stream) {
        responder.WriteChunk(absl::StrCat("data: ", ErrorBody(e), "\n\ndata: [DONE]\n\n"))
            .IgnoreError();
        responder.EndStream().IgnoreError();
      } else {
        responder.Send(e.status, "application/json", ErrorBody(e)).IgnoreError();
      }
      return;
    }
    metrics_.Count(RequestOutcome::kSuccess);
    const Json usage = UsageJson(event->usage);
    const char* finish = FinishName(event->reason);
    if (r.stream) {
      Json choice =
          chat ? Json{{"index", 0}, {"delta", Json::object()}} : Json{{"index", 0}, {"text", ""}};
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = finish;
      std::string out = absl::StrCat("data: ", Dump(chunk(choice)), "\n\n");
      if (r.include_usage) {
        Json last = chunk(Json());
        last["choices"] = Json::array();
        last["usage"] = usage;
        absl::StrAppend(&out, "data: ", Dump(last), "\n\n");
      }
      out += "data: [DONE]\n\n";
      if (responder.WriteChunk(out).ok()) responder.EndStream().IgnoreError();
      return;
    }
    Json choice =
        chat ? Json{{"index", 0}, {"message", Json{{"role", "assistant"}, {"content", text}}}}
             : Json{{"index", 0}, {"text", text}};
    choice["logprobs"] = r.logprobs ? logprobs.Take() : Json(nullptr);
    choice["finish_reason"] = finish;
    Json body = chunk(std::move(choice));
    body["usage"] = usage;
    responder.Send(200, "application/json", Dump(body)).IgnoreError();
    return;
  }
}

}  // namespace strata
