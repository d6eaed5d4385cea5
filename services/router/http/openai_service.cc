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
#include "services/router/http/openai_choice.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kBearer[] = "Bearer ";

// What the scheduler sends a request's samples, queued for the connection thread that waits on
// the request.
struct SampleEvent {
  int index = 0;  // the sample's
  bool finished = false;
  bool prompt = false;  // the prompt's log-probabilities (OnScores), in `logprobs`
  std::vector<int32_t> ids;
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  FinishReason reason = FinishReason::kNone;
  RequestUsage usage;
  absl::Status status;
};

class EventQueue {
 public:
  void Push(SampleEvent e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_one();
  }
  // The next event, or nothing after `timeout` (the caller then checks on its client).
  std::optional<SampleEvent> Next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return std::nullopt;
    SampleEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SampleEvent> events_;
};

// One sample's output into the request's queue. Called on the scheduler's thread only.
class SampleSink : public ResponseSink {
 public:
  SampleSink(std::shared_ptr<EventQueue> queue, int index)
      : queue_(std::move(queue)), index_(index) {}

  void OnLogprobs(const std::vector<TokenLogprobs>& logprobs) override {
    pending_logprobs_.insert(pending_logprobs_.end(), logprobs.begin(), logprobs.end());
  }
  void OnScores(const std::vector<TokenLogprobs>& scores) override {
    SampleEvent e = Event();
    e.prompt = true;
    e.logprobs = scores;
    queue_->Push(std::move(e));
  }
  void OnTokens(const std::vector<int32_t>& ids, const std::string& text) override {
    SampleEvent e = Event();
    e.ids = ids;
    e.text = text;
    e.logprobs.swap(pending_logprobs_);
    queue_->Push(std::move(e));
  }
  void OnFinish(FinishReason reason, const RequestUsage& usage,
                const absl::Status& status) override {
    SampleEvent e = Event();
    e.finished = true;
    e.reason = reason;
    e.usage = usage;
    e.status = status;
    queue_->Push(std::move(e));
  }

 private:
  SampleEvent Event() const {
    SampleEvent e;
    e.index = index_;
    return e;
  }

  std::shared_ptr<EventQueue> queue_;
  const int index_;
  std::vector<TokenLogprobs> pending_logprobs_;
};

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
    return BadParam(param,
                    "this model has no tokenizer (tokenizer.json or tiktoken.model): send the "
                    "prompt as token ids");
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
                      "--tool-call-parser names one (hermes, deepseek_v3, deepseek_v31, glm45, "
                      "kimi_k2)");
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

std::optional<ResponseFormat> OpenAiService::ForcedCallFormat(const OpenAiRequest& r) const {
  // Without a grammar engine a forced call is only started (ForcedPrefix), not held to its
  // schema.
  if (options_.grammar == nullptr || !r.tools.offered() ||
      (r.tools.choice != ToolChoice::kRequired && r.tools.choice != ToolChoice::kFunction)) {
    return std::nullopt;
  }
  std::optional<std::string> tag = ForcedCallGrammar(
      tool_format_, r.tools.tools,
      r.tools.choice == ToolChoice::kFunction ? std::optional<std::string>(r.tools.function)
                                              : std::nullopt,
      r.tools.parallel);
  if (!tag.has_value()) return std::nullopt;
  return ResponseFormat::StructuralTag(*std::move(tag));
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
  // The parser reads the calls' markers in the reply's text, and some models' markers are
  // special tokens (Kimi-K2's): they are kept, as vLLM's parsers keep them.
  if (r.tools.offered()) spec.sampling.skip_special_tokens = false;
  spec.stop = r.stop;
  spec.ignore_eos = r.ignore_eos;
  ResponseFormat format = r.format.format;
  std::string format_param = r.format.param;
  if (std::optional<ResponseFormat> calls = ForcedCallFormat(r)) {
    if (format.constrained()) {
      return BadParam(format_param,
                      absl::StrCat("'", format_param,
                                   "' cannot be combined with a tool_choice that forces a call "
                                   "(the call's arguments follow the function's parameters)"));
    }
    format = *std::move(calls);
    format_param = "tools";
  }
  if (format.constrained()) {
    if (options_.grammar == nullptr) {
      return BadParam(format_param, "structured output is not available on this server");
    }
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> grammar =
        options_.grammar->Compile(format);
    if (!grammar.ok()) return BadParam(format_param, grammar.status().message());
    spec.constraint = *std::move(grammar);
  }
  spec.logprobs = r.logprobs;
  spec.top_logprobs = r.top_logprobs;
  spec.n = r.n;
  if (r.echo && !r.chat) {
    if (tokenizer_ == nullptr) {
      return BadParam("echo", "'echo' needs a model with a tokenizer (to write the prompt's text)");
    }
    // The echoed prompt's log-probabilities come from its prefill; with no tokens to generate,
    // the prefill is all there is.
    spec.prompt_logprobs = r.logprobs;
    spec.score_only = max_tokens == 0;
    if (spec.score_only && r.n > 1) {
      return BadParam("n",
                      "'n' above 1 needs tokens to generate ('max_tokens': 0 with 'echo' "
                      "scores the prompt alone)");
    }
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
  // A chat echoes its last message when the reply continues it (vLLM's rule): an assistant's
  // text, then the reply's.
  if (r.chat) return ContinuedAssistantText(r.messages);
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
  // What echo writes before the completion: the prompt's text, and its tokens for logprobs
  // (a chat: its last message's text, without logprobs).
  std::vector<int32_t> prompt_ids;
  std::string echo_text;
  if (r.echo) {
    if (!r.chat) prompt_ids = spec->prompt;
    echo_text = EchoText(r, prompt_ids);
  }
  const int n = spec->n;
  auto queue = std::make_shared<EventQueue>();
  std::vector<std::shared_ptr<ResponseSink>> sinks;
  for (int i = 0; i < n; ++i) sinks.push_back(std::make_shared<SampleSink>(queue, i));
  absl::StatusOr<Scheduler::Ticket> ticket = scheduler_.Submit(*std::move(spec), sinks);
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
  auto chunk = [&](Json choices) {
    return Json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", options_.model_name},
                {"choices", std::move(choices)}};
  };
  // Choice i is sample i's. With tools offered each reply goes through the tool-call parser (a
  // named function: one call).
  std::vector<std::unique_ptr<OpenAiChoice>> choices;
  for (int i = 0; i < n; ++i) {
    std::unique_ptr<ChatToolCalls> tool_calls;
    if (r.tools.offered()) {
      tool_calls = std::make_unique<ChatToolCalls>(
          tool_format_, r.tools.parallel && r.tools.choice != ToolChoice::kFunction,
          ForcedPrefix(r), r.tools.tools);
    }
    choices.push_back(std::make_unique<OpenAiChoice>(
        i, r, [this](int32_t token) { return TokenText(token); }, std::move(tool_calls)));
  }
  bool stream_ok = true;
  // Each streamed choice in its own chunk, as OpenAI sends them.
  auto send = [&](std::vector<Json> stream_choices) {
    for (Json& choice : stream_choices) {
      if (!stream_ok) return;
      stream_ok = responder
                      .WriteChunk(absl::StrCat(
                          "data: ", Dump(chunk(Json::array({std::move(choice)}))), "\n\n"))
                      .ok();
    }
  };
  if (r.stream) {
    stream_ok = responder.StartStream(200, "text/event-stream").ok();
    for (auto& choice : choices) send(choice->Start());
  }
  // Without logprobs the echo needs nothing from the model; with them it waits for the
  // prompt's (the prompt event below, sent to the first sample for all).
  if (r.echo && (!r.logprobs || r.chat) && !echo_text.empty()) {
    for (auto& choice : choices) send(choice->Echo(echo_text, prompt_ids, nullptr));
  }
  int unfinished = n;
  RequestUsage usage;                  // the prompt once, every sample's tokens
  std::optional<SampleEvent> failure;  // the first sample that failed (or was cut off)
  bool cancelled = false;
  Clock::time_point last_check = arrival;
  while (unfinished > 0) {
    std::optional<SampleEvent> event = queue->Next(std::chrono::milliseconds(50));
    // A client that went away (or a failed write) cancels the request: checked every 50 ms
    // even while tokens keep coming. The loop then waits for every sample's finish, so that
    // nothing of the request is left behind.
    if (!cancelled && (!stream_ok || Clock::now() - last_check > std::chrono::milliseconds(50))) {
      last_check = Clock::now();
      if (!stream_ok || responder.ClientGone()) {
        scheduler_.Cancel(*ticket);
        stream_ok = false;
        cancelled = true;
      }
    }
    if (!event) continue;
    OpenAiChoice& choice = *choices[event->index];
    if (event->prompt) {
      // Without logprobs the echo went out already (a score-only request scores anyway).
      if (!r.logprobs) continue;
      for (auto& c : choices) send(c->Echo(echo_text, prompt_ids, &event->logprobs));
      continue;
    }
    if (!event->finished) {
      send(choice.Add(event->ids, event->text, event->logprobs));
      continue;
    }
    --unfinished;
    usage.prompt_tokens = event->usage.prompt_tokens;
    usage.completion_tokens += event->usage.completion_tokens;
    if (event->reason == FinishReason::kError || event->reason == FinishReason::kCancelled) {
      // One sample's failure is the request's: the others are stopped.
      if (!failure.has_value()) {
        failure = std::move(*event);
        if (unfinished > 0) scheduler_.Cancel(*ticket);
      }
      continue;
    }
    send(choice.Finish(event->reason));
  }
  if (cancelled) {
    responder.set_keep_alive(false);
    metrics_.Count(RequestOutcome::kCancelled);
    if (!responder.responded()) responder.Send(499, "application/json", "{}").IgnoreError();
    return;
  }
  if (failure.has_value()) {
    const ApiError e =
        failure->reason == FinishReason::kError
            ? ApiError{500, "server_error", std::string(failure->status.message()), "", ""}
            : ApiError{503, "server_error", "the server is shutting down", "", ""};
    metrics_.Count(failure->reason == FinishReason::kError ? RequestOutcome::kError
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
  if (r.stream) {
    std::string out;
    if (r.include_usage) {
      Json last = chunk(Json::array());
      last["usage"] = UsageJson(usage);
      absl::StrAppend(&out, "data: ", Dump(last), "\n\n");
    }
    out += "data: [DONE]\n\n";
    if (responder.WriteChunk(out).ok()) responder.EndStream().IgnoreError();
    return;
  }
  Json whole = Json::array();
  for (auto& choice : choices) whole.push_back(choice->Whole());
  Json body = chunk(std::move(whole));
  body["usage"] = UsageJson(usage);
  responder.Send(200, "application/json", Dump(body)).IgnoreError();
}

}  // namespace strata
