#include "services/router/generation_service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/engine/sampling_request.h"
#include "common/util/status_macros.h"
#include "services/router/client_request.h"
#include "services/router/tokenization.h"

namespace strata {
namespace {

// An unset temperature in Generate is greedy (proto3's zero, as before it was optional).
constexpr double kGrpcTemperature = 0.0;

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void SetLogprobs(int32_t id, const TokenLogprobs& logprobs, v1::TokenLogprobs& out) {
  out.set_token_id(static_cast<uint32_t>(id));
  out.set_logprob(logprobs.logprob);
  for (const auto& [alt, logprob] : logprobs.top) {
    v1::Logprob* top = out.add_top_logprobs();
    top->set_token_id(static_cast<uint32_t>(alt));
    top->set_logprob(logprob);
  }
}

// The checks both RPCs share: at most kMaxTopLogprobs alternatives.
absl::Status CheckTopLogprobs(uint32_t top) {
  if (top <= static_cast<uint32_t>(kMaxTopLogprobs)) return absl::OkStatus();
  return InvalidParam("top_logprobs", absl::StrCat("top_logprobs must be at most ", kMaxTopLogprobs,
                                                   ", not ", top));
}

class GenerateReactor;

// The scheduler's handle on a stream; outlives the reactor if the client goes away first.
// `prompt`: the prompt's ids, for a request with prompt_logprobs.
// `index`: the sample's (GenerateRequest.n).
class StreamSink : public ResponseSink {
 public:
  StreamSink(GenerateReactor* reactor, int index, std::vector<int32_t> prompt)
      : reactor_(reactor), index_(index), prompt_(std::move(prompt)) {}
  void OnLogprobs(const std::vector<TokenLogprobs>& logprobs) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.insert(pending_.end(), logprobs.begin(), logprobs.end());
  }
  void OnScores(const std::vector<TokenLogprobs>& scores) override;
  void OnTokens(const std::vector<int32_t>& ids, const std::string& text) override;
  void OnFinish(FinishReason reason, const RequestUsage& usage,
                const absl::Status& status) override;
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
  }

 private:
  std::mutex mu_;
  GenerateReactor* reactor_;
  const int index_;
  const std::vector<int32_t> prompt_;
  std::vector<TokenLogprobs> pending_;  // OnLogprobs' until the tokens they are of
};

// Writes queued responses one at a time, merging token messages of a sample that pile up
// behind a write; finishes once every sample has.
class GenerateReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(Scheduler& scheduler) : scheduler_(scheduler) {}

  void Start(absl::StatusOr<RequestSpec> spec) {
    if (!spec.ok()) {
      Finish(ToGrpcStatus(spec.status()));
      return;
    }
    std::vector<std::shared_ptr<ResponseSink>> sinks;
    for (int i = 0; i < spec->n; ++i) {
      sinks_.push_back(std::make_shared<StreamSink>(
          this, i, spec->prompt_logprobs ? spec->prompt : std::vector<int32_t>()));
      sinks.push_back(sinks_.back());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      unfinished_ = spec->n;
    }
    auto ticket = scheduler_.Submit(*std::move(spec), std::move(sinks));
    if (!ticket.ok()) {
      for (auto& sink : sinks_) sink->Detach();
      Finish(ToGrpcStatus(ticket.status()));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ticket_ = *ticket;
    submitted_ = true;
  }

  // `last`: the sample's last message.
  void Enqueue(v1::GenerateResponse response, bool last, grpc::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finishing_) return;
    if (!queue_.empty() && !(writing_ && queue_.size() == 1) &&
        queue_.back().finish_reason() == v1::FINISH_REASON_UNSPECIFIED &&
        queue_.back().index() == response.index()) {
      // Merge into the last queued (not yet written) message.
      v1::GenerateResponse& back = queue_.back();
      for (uint32_t id : response.token_ids()) back.add_token_ids(id);
      back.mutable_text()->append(response.text());
      back.mutable_logprobs()->MergeFrom(response.logprobs());
      back.mutable_prompt_logprobs()->MergeFrom(response.prompt_logprobs());
      back.set_finish_reason(response.finish_reason());
      if (response.has_usage()) *back.mutable_usage() = response.usage();
    } else {
      queue_.push_back(std::move(response));
    }
    // The call's status is the first failed sample's.
    if (last && final_status_.ok()) final_status_ = status;
    if (last && --unfinished_ == 0) done_ = true;
    WriteNext(lock);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) {
      // The client is gone. The call still needs its Finish before OnDone can come.
      if (finishing_) return;
      finishing_ = true;
      queue_.clear();
      lock.unlock();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    WriteNext(lock);
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (submitted_) scheduler_.Cancel(ticket_);
  }

  void OnDone() override {
    for (auto& sink : sinks_) sink->Detach();
    delete this;
  }

 private:
  // Starts the next write, or the finish, outside the lock: a reaction may run inline.
  // The front element stays put while `writing_` (deque push_back keeps references valid);
  // its bytes are in `wire_` until the write is done.
  void WriteNext(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finishing_) return;
    if (!queue_.empty()) {
      if (absl::Status s = SerializeResponse(queue_.front(), wire_); !s.ok()) {
        finishing_ = true;
        lock.unlock();
        Finish(ToGrpcStatus(s));
        return;
      }
      writing_ = true;
      lock.unlock();
      StartWrite(&wire_);
    } else if (done_) {
      finishing_ = true;
      lock.unlock();
      Finish(final_status_);
    }
  }

  Scheduler& scheduler_;
  std::vector<std::shared_ptr<StreamSink>> sinks_;
  std::mutex mu_;
  int unfinished_ = 0;  // samples
  std::deque<v1::GenerateResponse> queue_;
  grpc::ByteBuffer wire_;  // the message being written
  bool writing_ = false;
  bool done_ = false;
  bool finishing_ = false;
  bool submitted_ = false;
  Scheduler::Ticket ticket_ = 0;
  grpc::Status final_status_;
};

void StreamSink::OnScores(const std::vector<TokenLogprobs>& scores) {
  v1::GenerateResponse response;
  response.set_index(static_cast<uint32_t>(index_));
  for (size_t i = 0; i < scores.size() && i + 1 < prompt_.size(); ++i) {
    SetLogprobs(prompt_[i + 1], scores[i], *response.add_prompt_logprobs());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_ != nullptr) reactor_->Enqueue(std::move(response), false, grpc::Status::OK);
}

void StreamSink::OnTokens(const std::vector<int32_t>& ids, const std::string& text) {
  v1::GenerateResponse response;
  response.set_index(static_cast<uint32_t>(index_));
  for (int32_t id : ids) response.add_token_ids(static_cast<uint32_t>(id));
  response.set_text(text);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < ids.size() && i < pending_.size(); ++i) {
    SetLogprobs(ids[i], pending_[i], *response.add_logprobs());
  }
  pending_.clear();
  if (reactor_ != nullptr) reactor_->Enqueue(std::move(response), false, grpc::Status::OK);
}

void StreamSink::OnFinish(FinishReason reason, const RequestUsage& usage,
                          const absl::Status& status) {
  v1::GenerateResponse response;
  response.set_index(static_cast<uint32_t>(index_));
  response.set_finish_reason(ToProto(reason));
  v1::Usage* u = response.mutable_usage();
  u->set_prompt_tokens(usage.prompt_tokens);
  u->set_completion_tokens(usage.completion_tokens);
  u->set_time_to_first_token_ms(static_cast<float>(usage.time_to_first_token_ms));
  u->set_decode_tokens_per_second(static_cast<float>(usage.decode_tokens_per_second));
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_ != nullptr) reactor_->Enqueue(std::move(response), true, ToGrpcStatus(status));
}

// Completes a unary Score call when the scheduler finishes its score-only request; owns the
// response until then.
class ScoreSink : public ResponseSink {
 public:
  // `alternatives`: the request asked for top_logprobs (ScoreResponse.token_logprobs).
  ScoreSink(grpc::ServerUnaryReactor* reactor, v1::ScoreResponse response, grpc::ByteBuffer* out,
            bool alternatives)
      : reactor_(reactor), response_(std::move(response)), out_(out), alternatives_(alternatives) {}
  void OnTokens(const std::vector<int32_t>& ids, const std::string& text) override {}
  void OnScores(const std::vector<TokenLogprobs>& scores) override {
    for (size_t i = 0; i < scores.size(); ++i) {
      response_.add_logprobs(scores[i].logprob);
      if (alternatives_ && static_cast<int>(i) + 1 < response_.token_ids_size()) {
        SetLogprobs(static_cast<int32_t>(response_.token_ids(static_cast<int>(i) + 1)), scores[i],
                    *response_.add_token_logprobs());
      }
    }
  }
  void OnFinish(FinishReason reason, const RequestUsage& usage,
                const absl::Status& status) override {
    if (!status.ok()) {
      reactor_->Finish(ToGrpcStatus(status));
    } else if (reason == FinishReason::kCancelled) {
      reactor_->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled"));
    } else {
      reactor_->Finish(ToGrpcStatus(SerializeResponse(response_, *out_)));
    }
  }

 private:
  grpc::ServerUnaryReactor* reactor_;
  v1::ScoreResponse response_;
  grpc::ByteBuffer* out_;
  const bool alternatives_;
};

// A unary call answered at once: unless `admitted` refuses it (the request budget), the
// request parsed (ParseClientRequest), `body` run on it, the response serialized.
template <typename Request, typename Response>
grpc::ServerUnaryReactor* AnswerNow(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
    const absl::Status& admitted, absl::FunctionRef<absl::Status(const Request&, Response&)> body) {
  auto* reactor = context->DefaultReactor();
  Request request;
  Response response;
  absl::Status status = admitted;
  if (status.ok()) status = ParseClientRequest(*in, request);
  if (status.ok()) status = body(request, response);
  if (status.ok()) status = SerializeResponse(response, *out);
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

GenerationService::GenerationService(const ModelConfig& config, Scheduler& scheduler,
                                     const Tokenizer* tokenizer, int num_workers,
                                     RequestBudgetOptions budget, GrammarCompiler* grammar)
    : config_(config),
      scheduler_(scheduler),
      tokenizer_(tokenizer),
      num_workers_(num_workers),
      budget_(budget),
      grammar_(grammar) {}

absl::StatusOr<RequestSpec> GenerationService::ToSpec(const v1::GenerateRequest& request) const {
  RequestSpec spec;
  // It goes to the log: short, and nothing that could forge or break a log line.
  if (request.request_id().size() > 256 ||
      std::any_of(request.request_id().begin(), request.request_id().end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return absl::InvalidArgumentError(
        "request_id must have at most 256 bytes and no control characters");
  }
  spec.id = request.request_id();
  const bool has_text = !request.prompt().empty();
  const bool has_ids = request.prompt_token_ids_size() > 0;
  if (has_text && has_ids) {
    return absl::InvalidArgumentError("give either prompt or prompt_token_ids, not both");
  }
  if (!has_text && !has_ids) return absl::InvalidArgumentError("the prompt is empty");
  if (has_text) {
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError(
          "this model has no tokenizer (tokenizer.json or tiktoken.model): send "
          "prompt_token_ids instead of prompt");
    }
    // A prompt that cannot fit is refused by its length, before paying for its tokens.
    RETURN_IF_ERROR(scheduler_.CheckTextFits("the prompt", request.prompt().size(), true));
    auto ids = tokenizer_->Encode(request.prompt(), /*add_special_tokens=*/true);
    if (!ids.ok()) return absl::InvalidArgumentError(ids.status().message());
    spec.prompt = *std::move(ids);
    if (spec.prompt.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  } else {
    for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
      const uint32_t id = request.prompt_token_ids(i);
      if (id >= static_cast<uint32_t>(config_.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrCat("prompt token id ", id, " at position ", i,
                                                       " is outside the vocabulary [0, ",
                                                       config_.vocab_size, ")"));
      }
      spec.prompt.push_back(static_cast<int32_t>(id));
    }
  }
  if (request.max_new_tokens() == 0) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  if (request.max_new_tokens() > static_cast<uint32_t>(scheduler_.max_context_tokens())) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens ", request.max_new_tokens(),
                                                   " is over the limit of ",
                                                   scheduler_.max_context_tokens()));
  }
  spec.max_new_tokens = static_cast<int>(request.max_new_tokens());
  const v1::SamplingParams& s = request.sampling();
  SamplingRequest sampling;
  if (s.has_temperature()) sampling.temperature = s.temperature();
  if (s.has_top_p()) sampling.top_p = s.top_p();
  if (s.has_top_k()) sampling.top_k = s.top_k();
  if (s.has_seed()) sampling.seed = s.seed();
  if (s.has_min_p()) sampling.min_p = s.min_p();
  if (s.has_repetition_penalty()) sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) sampling.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) sampling.frequency_penalty = s.frequency_penalty();
  for (const auto& [id, bias] : s.logit_bias()) sampling.logit_bias.emplace_back(id, bias);
  // The map's order is unspecified; each key is there once.
  std::sort(sampling.logit_bias.begin(), sampling.logit_bias.end());
  sampling.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  if (request.min_tokens() > 0) sampling.min_tokens = request.min_tokens();
  sampling.include_stop_str_in_output = request.include_stop_str_in_output();
  if (request.has_skip_special_tokens()) {
    sampling.skip_special_tokens = request.skip_special_tokens();
  }
  ASSIGN_OR_RETURN(spec.sampling,
                   NormalizeSampling(sampling, config_.vocab_size, kGrpcTemperature));
  spec.stop.assign(request.stop().begin(), request.stop().end());
  spec.ignore_eos = request.ignore_eos();
  RETURN_IF_ERROR(CheckTopLogprobs(request.top_logprobs()));
  if (request.top_logprobs() > 0 && !request.logprobs() && !request.prompt_logprobs()) {
    return InvalidParam("top_logprobs", "top_logprobs needs logprobs or prompt_logprobs");
  }
  spec.logprobs = request.logprobs();
  spec.prompt_logprobs = request.prompt_logprobs();
  spec.top_logprobs = static_cast<int>(request.top_logprobs());
  if (request.has_response_format()) {
    ASSIGN_OR_RETURN(spec.constraint, CompileFormat(request.response_format()));
  }
  if (request.n() > static_cast<uint32_t>(kMaxSamples)) {
    return InvalidParam("n",
                        absl::StrCat("n must be at most ", kMaxSamples, ", not ", request.n()));
  }
  spec.n = std::max<int>(1, static_cast<int>(request.n()));
  return spec;
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> GenerationService::CompileFormat(
    const v1::ResponseFormat& proto) const {
  ResponseFormat format;
  switch (proto.type()) {
    case v1::ResponseFormat::TYPE_TEXT:
      return nullptr;
    case v1::ResponseFormat::TYPE_JSON_OBJECT:
      format.type = ResponseFormat::Type::kJsonObject;
      break;
    case v1::ResponseFormat::TYPE_JSON_SCHEMA:
      format.type = ResponseFormat::Type::kJsonSchema;
      format.json_schema = proto.json_schema();
      break;
    case v1::ResponseFormat::TYPE_REGEX:
      format.type = ResponseFormat::Type::kRegex;
      format.regex = proto.regex();
      break;
    case v1::ResponseFormat::TYPE_CHOICE:
      format.type = ResponseFormat::Type::kChoice;
      format.choices.assign(proto.choices().begin(), proto.choices().end());
      break;
    default:
      return InvalidParam("response_format",
                          absl::StrCat("response_format.type ", proto.type(), " is not known"));
  }
  if (grammar_ == nullptr) {
    return InvalidParam("response_format", "structured output is not available on this server");
  }
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> compiled = grammar_->Compile(format);
  if (!compiled.ok()) {
    return InvalidParam("response_format",
                        absl::StrCat("response_format: ", compiled.status().message()));
  }
  return compiled;
}

absl::StatusOr<RequestBudget::Hold> GenerationService::TakeBudget(
    const grpc::CallbackServerContext& context, const grpc::ByteBuffer& request) {
  return budget_.Take(context.peer(), static_cast<int64_t>(request.Length()));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto* reactor = new GenerateReactor(scheduler_);
  // Held while the request is parsed and tokenized, until the scheduler has it.
  absl::StatusOr<RequestBudget::Hold> hold = TakeBudget(*context, *request);
  if (!hold.ok()) {
    reactor->Start(hold.status());
    return reactor;
  }
  v1::GenerateRequest parsed;
  absl::Status status = ParseClientRequest(*request, parsed);
  reactor->Start(status.ok() ? ToSpec(parsed) : absl::StatusOr<RequestSpec>(status));
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::ModelInfo(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return AnswerNow<v1::ModelInfoRequest, v1::ModelInfoResponse>(
      context, request, response, absl::OkStatus(),
      [&](const v1::ModelInfoRequest&, v1::ModelInfoResponse& info) {
        info.set_model_type(std::string(ArchitectureName(config_.arch)));
        info.set_vocab_size(static_cast<uint32_t>(config_.vocab_size));
        info.set_num_layers(config_.num_layers);
        info.set_num_experts(config_.num_experts);
        info.set_experts_per_token(config_.top_k);
        info.set_max_context_tokens(static_cast<uint32_t>(scheduler_.max_context_tokens()));
        info.set_has_tokenizer(tokenizer_ != nullptr);
        for (int id : config_.eos_token_ids) info.add_eos_token_ids(id);
        info.set_num_workers(num_workers_);
        info.set_linear_flops_per_token(LinearFlopsPerToken(config_));
        info.set_attention_flops_per_pair(AttentionFlopsPerPair(config_));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  const absl::StatusOr<RequestBudget::Hold> hold = TakeBudget(*context, *request);
  return AnswerNow<v1::TokenizeRequest, v1::TokenizeResponse>(
      context, request, response, hold.status(),
      [&](const v1::TokenizeRequest& in, v1::TokenizeResponse& out) -> absl::Status {
        ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                         TokenizeText(tokenizer_, scheduler_, in.text(), in.add_special_tokens()));
        for (int32_t id : ids) out.add_token_ids(static_cast<uint32_t>(id));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  const absl::StatusOr<RequestBudget::Hold> hold = TakeBudget(*context, *request);
  return AnswerNow<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      context, request, response, hold.status(),
      [&](const v1::DetokenizeRequest& in, v1::DetokenizeResponse& out) -> absl::Status {
        const std::vector<int64_t> ids(in.token_ids().begin(), in.token_ids().end());
        ASSIGN_OR_RETURN(std::string text,
                         DetokenizeIds(tokenizer_, scheduler_, ids, in.skip_special_tokens()));
        out.set_text(std::move(text));
        return absl::OkStatus();
      });
}

absl::StatusOr<RequestSpec> GenerationService::ScoreSpec(const v1::ScoreRequest& request) const {
  RequestSpec spec;
  spec.score_only = true;
  RETURN_IF_ERROR(CheckTopLogprobs(request.top_logprobs()));
  spec.top_logprobs = static_cast<int>(request.top_logprobs());
  if (!request.text().empty() && request.token_ids_size() > 0) {
    return absl::InvalidArgumentError("give either text or token_ids, not both");
  }
  if (!request.text().empty()) {
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError(
          "this model has no tokenizer (tokenizer.json or tiktoken.model): send token_ids");
    }
    RETURN_IF_ERROR(scheduler_.CheckTextFits("the text", request.text().size(), false));
    absl::StatusOr<std::vector<int32_t>> ids =
        tokenizer_->Encode(request.text(), /*add_special_tokens=*/false);
    if (!ids.ok()) return absl::InvalidArgumentError(ids.status().message());
    spec.prompt = *std::move(ids);
    return spec;
  }
  for (uint32_t id : request.token_ids()) {
    if (id >= static_cast<uint32_t>(config_.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary"));
    }
    spec.prompt.push_back(static_cast<int32_t>(id));
  }
  return spec;
}

grpc::ServerUnaryReactor* GenerationService::Score(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<RequestBudget::Hold> hold = TakeBudget(*context, *request);
  v1::ScoreRequest parsed;
  absl::Status status = hold.status();
  if (status.ok()) status = ParseClientRequest(*request, parsed);
  absl::StatusOr<RequestSpec> spec = status.ok() ? ScoreSpec(parsed) : status;
  if (!spec.ok()) {
    reactor->Finish(ToGrpcStatus(spec.status()));
    return reactor;
  }
  hold->Release();
  v1::ScoreResponse scores;
  for (int32_t id : spec->prompt) scores.add_token_ids(static_cast<uint32_t>(id));
  const bool alternatives = spec->top_logprobs > 0;
  auto submitted = scheduler_.Submit(
      *std::move(spec),
      std::make_shared<ScoreSink>(reactor, std::move(scores), response, alternatives));
  if (!submitted.ok()) reactor->Finish(ToGrpcStatus(submitted.status()));
  return reactor;
}

}  // namespace strata
