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
#include "services/router/http/openai_logprobs.h"
#include "services/router/http/openai_tool_calls.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kBearer[] = "Bearer ";

// The scheduler's output for one request, queued for the connection thread that waits on it.
class QueueSink : public ResponseSink {
 public:
  struct Event {
    bool finished = false;
    bool prompt = false;  // the prompt's log-probabilities (OnScores), in `logprobs`
    std::vector<int32_t> ids;
    std::string text;
    std::vector<TokenLogprobs> logprobs;
    FinishReason reason = FinishReason::kNone;
    RequestUsage usage;
    absl::Status status;
  };

  void OnLogprobs(const std::vector<TokenLogprobs>& logprobs) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_logprobs_.insert(pending_logprobs_.end(), logprobs.begin(), logprobs.end());
  }
  void OnScores(const std::vector<TokenLogprobs>& scores) override {
    Event e;
    e.prompt = true;
    e.logprobs = scores;
    Push(std::move(e));
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
    Push(std::move(e));
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
  void Push(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::vector<TokenLogprobs> pending_logprobs_;
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
      tool_format_(options_.tool_call_format.value_or(
          ChooseToolCallFormat("auto", chat_template_).value_or(ToolCallFormat::kNone))),
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
  Json variables = r.template_variables;
  if (r.tools.offered()) {
    if (tool_format_ == ToolCallFormat::kNone) {
      return BadParam("tools",
                      "this model's chat template has no tool-call format the server reads; "
                      "a router started with --tool-call-parser hermes reads <tool_call> blocks");
    }
    variables["tools"] = r.tools.tools;
  }
  absl::StatusOr<std::string> rendered =
      chat_template_.Render(r.messages, r.add_generation_prompt, variables);
  if (!rendered.ok()) return BadParam("messages", rendered.status().message());
  return *rendered + ForcedPrefix(r);
}

std::string OpenAiService::ForcedPrefix(const OpenAiRequest& r) const {
  if (!r.tools.offered() || r.tools.choice == ToolChoice::kAuto) return "";
  return ForcedCallPrefix(tool_format_, r.tools.choice == ToolChoice::kFunction
                                            ? std::optional<std::string>(r.tools.function)
                                            : std::nullopt);
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
  spec.top_logprobs = r.top_logprobs;
  if (r.echo) {
    if (tokenizer_ == nullptr) {
      return BadParam("echo", "'echo' needs a model with a tokenizer (to write the prompt's text)");
    }
    // The echoed prompt's log-probabilities come from its prefill; with no tokens to generate,
    // the prefill is all there is.
    spec.prompt_logprobs = r.logprobs;
    spec.score_only = max_tokens == 0;
  }
  return spec;
}

std::string OpenAiService::TokenText(int32_t id) const {
  if (tokenizer_ == nullptr) return absl::StrCat("token_id:", id);
  absl::StatusOr<std::string> text = tokenizer_->Decode({id}, /*skip_special_tokens=*/false);
  return text.ok() ? *text : absl::StrCat("token_id:", id);
}

std::string OpenAiService::EchoText(const OpenAiRequest& r,
                                    const std::vector<int32_t>& prompt) const {
  if (r.prompt_text) return *r.prompt_text;
  absl::StatusOr<std::string> text = tokenizer_->Decode(prompt, /*skip_special_tokens=*/false);
  return text.ok() ? *text : std::string();
}

void OpenAiService::Generate(const HttpRequest& http, bool chat, HttpResponder& responder) {
  const Clock::time_point arrival = Clock::now();
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(http.body, chat);
  if (!parsed.ok())
    return SendError(responder, ToApiError(parsed.status()), RequestOutcome::kInvalid);
  const OpenAiRequest& r = *parsed;
  absl::StatusOr<RequestSpec> spec = ToSpec(r);
  if (!spec.ok()) return SendError(responder, ToApiError(spec.status()), RequestOutcome::kInvalid);
  // What echo writes before the completion: the prompt's text, and its tokens for logprobs.
  std::vector<int32_t> prompt_ids;
  std::string echo_text;
  if (r.echo) {
    prompt_ids = spec->prompt;
    echo_text = EchoText(r, prompt_ids);
  }
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
  OpenAiLogprobs logprobs(chat, r.top_logprobs, [this](int32_t id) { return TokenText(id); });
  // With tools offered the reply goes through the tool-call parser (a named function: one call).
  std::unique_ptr<ChatToolCalls> tool_calls;
  if (r.tools.offered()) {
    tool_calls = std::make_unique<ChatToolCalls>(
        tool_format_, r.tools.parallel && r.tools.choice != ToolChoice::kFunction, ForcedPrefix(r));
  }
  std::string text;
  bool stream_ok = true;
  // One streamed chunk of the choice, with the log-probabilities added since the last.
  auto send = [&](Json choice) {
    choice["logprobs"] = r.logprobs ? logprobs.Take() : Json(nullptr);
    choice["finish_reason"] = nullptr;
    stream_ok = responder.WriteChunk(absl::StrCat("data: ", Dump(chunk(choice)), "\n\n")).ok();
  };
  // Chat deltas; one is sent for log-probabilities even when the parser holds the text back.
  auto send_deltas = [&](std::vector<Json> deltas) {
    if (deltas.empty() && r.logprobs) deltas.push_back(Json{{"content", ""}});
    for (Json& delta : deltas) {
      if (stream_ok) send(Json{{"index", 0}, {"delta", std::move(delta)}});
    }
  };
  // A piece of the choice's text.
  auto emit = [&](const std::string& piece) {
    text += piece;
    std::vector<Json> deltas;
    if (tool_calls != nullptr) {
      deltas = tool_calls->Feed(piece);
    } else if (!piece.empty()) {
      deltas.push_back(Json{{"content", piece}});
    }
    if (!r.stream || !stream_ok) return;
    if (chat) return send_deltas(std::move(deltas));
    if (!piece.empty() || r.logprobs) send(Json{{"index", 0}, {"text", piece}});
  };
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
  // Without logprobs the echo needs nothing from the model; with them it waits for the
  // prompt's (the prompt event below).
  if (r.echo && !r.logprobs) emit(echo_text);
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
    if (event->prompt) {
      // Without logprobs the echo went out already (a score-only request scores anyway).
      if (!r.logprobs) continue;
      // The first prompt token has no log-probability: nothing comes before it.
      size_t offset = 0;
      for (size_t i = 0; i < prompt_ids.size(); ++i) {
        const TokenLogprobs* l =
            i > 0 && i - 1 < event->logprobs.size() ? &event->logprobs[i - 1] : nullptr;
        logprobs.Add(prompt_ids[i], l, offset);
        offset += TokenText(prompt_ids[i]).size();
      }
      emit(echo_text);
      continue;
    }
    if (!event->finished) {
      if (r.logprobs) {
        size_t offset = text.size();
        for (size_t i = 0; i < event->ids.size() && i < event->logprobs.size(); ++i) {
          logprobs.Add(event->ids[i], &event->logprobs[i], offset);
          offset += TokenText(event->ids[i]).size();
        }
      }
      emit(event->text);
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
    if (tool_calls != nullptr) {
      std::vector<Json> deltas = tool_calls->Finish();
      if (r.stream && !deltas.empty()) send_deltas(std::move(deltas));
      if (tool_calls->called()) finish = "tool_calls";
    }
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
    if (tool_calls != nullptr) {
      choice["message"]["content"] = tool_calls->content();
      if (tool_calls->called()) choice["message"]["tool_calls"] = tool_calls->tool_calls();
    }
    choice["logprobs"] = r.logprobs ? logprobs.Take() : Json(nullptr);
    choice["finish_reason"] = finish;
    Json body = chunk(std::move(choice));
    body["usage"] = usage;
    responder.Send(200, "application/json", Dump(body)).IgnoreError();
    return;
  }
}

}  // namespace strata
