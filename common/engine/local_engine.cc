#include "common/engine/local_engine.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const LocalEngineOptions& options) {
  if (options.prefill_chunk_tokens <= 0) {
    return absl::InvalidArgumentError("prefill_chunk_tokens must be positive");
  }
  if (!(options.router_temperature > 0.0f)) {
    return absl::InvalidArgumentError("router_temperature must be positive");
  }
  std::unique_ptr<LocalEngine> engine(new LocalEngine());
  engine->options_ = options;
  ModelStackOptions stack;
  stack.device = options.device;
  stack.num_threads = options.num_threads;
  stack.kv_block_size = options.kv_block_size;
  stack.kv_cache_bytes = options.kv_cache_bytes;
  stack.kv_within_context = true;
  stack.max_step_tokens = options.prefill_chunk_tokens;
  stack.max_sequences = 1;
  stack.expert_weights = options.expert_weights;
  stack.attention_weights = options.attention_weights;
  stack.on_progress = options.on_progress;
  ASSIGN_OR_RETURN(engine->stack_, ModelStack::Create(options.model_dir, stack));
  engine->cuda_router_ = engine->stack_->cuda_router();
  engine->kv_ = &engine->stack_->kv();
  ForwardOptions forward;
  forward.router_temperature = options.router_temperature;
  forward.on_routing = options.on_routing;
  engine->forward_ = std::make_unique<ForwardPass>(
      engine->stack_->config(), engine->stack_->router(), *engine->stack_->experts(), forward);
  if (engine->cuda_router_ != nullptr && options.cuda_graphs) {
    // Decode steps replay one graph when the whole sequence fits its context.
    DecodeGraphOptions graphs;
    graphs.max_context =
        static_cast<int>(std::min<int64_t>(engine->max_sequence_tokens(), kDecodeGraphContext));
    graphs.max_sequences = 1;
    engine->decode_graphs_ = std::make_unique<DecodeGraphs>(
        *engine->forward_, *engine->cuda_router_, *engine->stack_->experts(), *engine->kv_, graphs);
  }
  return engine;
}

int64_t LocalEngine::max_sequence_tokens() const {
  return std::min(kv_->pool_tokens(), config().max_position_embeddings);
}

absl::Status LocalEngine::ValidatePrompt(absl::Span<const int32_t> ids,
                                         int64_t extra_tokens) const {
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     config().vocab_size, ")"));
    }
  }
  const int64_t total = static_cast<int64_t>(ids.size()) + extra_tokens;
  if (total > max_sequence_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " prompt tokens + ", extra_tokens,
                                                   " new tokens exceed the ", max_sequence_tokens(),
                                                   "-token context"));
  }
  return absl::OkStatus();
}

absl::Status LocalEngine::Step(PagedKvCache::SequenceId seq, absl::Span<const int32_t> ids,
                               int64_t start, absl::Span<const int64_t> logit_rows,
                               Tensor& logits) {
  const int64_t n = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(kv_->Reserve(seq, start + n));
  BatchLayout batch;
  batch.sequence.assign(n, seq);
  batch.position.resize(n);
  for (int64_t i = 0; i < n; ++i) batch.position[i] = start + i;
  if (decode_graphs_ != nullptr) decode_graphs_->NoteEagerStep();
  return forward_->Run(ids, batch, *kv_, logit_rows, logits);
}

absl::StatusOr<Tensor> LocalEngine::Logits(absl::Span<const int32_t> ids) {
  RETURN_IF_ERROR(ValidatePrompt(ids, 0));
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = config().vocab_size;
  const PagedKvCache::SequenceId seq = kv_->AddSequence();
  absl::Cleanup release = [&] { kv_->Release(seq); };
  Tensor all = Tensor::Host(n, vocab);
  Tensor chunk_logits;
  std::vector<int64_t> rows;
  for (int64_t start = 0; start < n; start += options_.prefill_chunk_tokens) {
    const int64_t len = std::min<int64_t>(options_.prefill_chunk_tokens, n - start);
    rows.resize(len);
    for (int64_t i = 0; i < len; ++i) rows[i] = i;
    RETURN_IF_ERROR(Step(seq, ids.subspan(start, len), start, rows, chunk_logits));
    std::copy(chunk_logits.data(), chunk_logits.data() + len * vocab, all.row(start));
  }
  return all;
}

absl::StatusOr<std::vector<int32_t>> LocalEngine::Generate(absl::Span<const int32_t> prompt,
                                                           const GenerateOptions& options) {
  if (options.max_new_tokens <= 0) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  RETURN_IF_ERROR(ValidatePrompt(prompt, options.max_new_tokens));
  const int64_t vocab = config().vocab_size;
  const PagedKvCache::SequenceId seq = kv_->AddSequence();
  absl::Cleanup release = [&] { kv_->Release(seq); };
  Sampler sampler(options.sampling);
  Tensor logits;
  // Prefill in chunks; only the last prompt position's logits are needed.
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (int64_t start = 0; start < n; start += options_.prefill_chunk_tokens) {
    const int64_t len = std::min<int64_t>(options_.prefill_chunk_tokens, n - start);
    const int64_t last_row = len - 1;
    RETURN_IF_ERROR(Step(seq, prompt.subspan(start, len), start, {&last_row, 1}, logits));
  }
  std::vector<int32_t> out;
  const std::vector<int>& eos = config().eos_token_ids;
  // Decode steps replay one CUDA graph when the whole sequence fits the graph's context.
  bool graphs = UseDecodeGraph(n + options.max_new_tokens);
  bool launched = false;  // the step for `next` is in flight, launched ahead
  // Ends before `release`: nothing may still write the sequence's keys and values then.
  absl::Cleanup drain = [&] {
    if (decode_graphs_ != nullptr && decode_graphs_->in_flight() > 0) {
      decode_graphs_->Wait().IgnoreError();
    }
  };
  int32_t next = sampler.Sample(logits.row(0), vocab);
  while (true) {
    out.push_back(next);
    if (options.on_token) options.on_token(next);
    const bool is_eos = std::find(eos.begin(), eos.end(), next) != eos.end();
    if (static_cast<int>(out.size()) >= options.max_new_tokens || (is_eos && !options.ignore_eos)) {
      break;
    }
    const int64_t position = n + static_cast<int64_t>(out.size()) - 1;
    if (graphs) {
      // The step after this one goes in behind it when its token will be wanted.
      const bool ahead = options_.overlap_decode_steps && sampler.greedy() &&
                         static_cast<int>(out.size()) + 1 < options.max_new_tokens;
      absl::StatusOr<int32_t> replayed =
          DecodeWithGraph(seq, next, position, sampler, ahead, &launched);
      if (replayed.ok()) {
        next = *replayed;
        continue;
      }
      // The step runs eagerly (rewriting what the replay wrote); after repeated failures the
      // rest of the generation does too.
      graphs = decode_graphs_->failures() < DecodeGraphs::kMaxFailures;
    }
    const int64_t row = 0;
    RETURN_IF_ERROR(Step(seq, {&next, 1}, position, {&row, 1}, logits));
    next = sampler.Sample(logits.row(0), vocab);
  }
  return out;
}

bool LocalEngine::UseDecodeGraph(int64_t total_tokens) {
  return decode_graphs_ != nullptr && total_tokens <= decode_graphs_->max_context();
}

absl::StatusOr<int32_t> LocalEngine::DecodeWithGraph(PagedKvCache::SequenceId seq, int32_t token,
                                                     int64_t position, Sampler& sampler, bool ahead,
                                                     bool* launched) {
  auto batch_at = [&](int64_t p) {
    BatchLayout batch;
    batch.sequence = {seq};
    batch.position = {p};
    return batch;
  };
  const bool in_flight = *launched;
  *launched = false;
  if (!in_flight) {
    RETURN_IF_ERROR(kv_->Reserve(seq, position + 1));
    RETURN_IF_ERROR(decode_graphs_->Launch({&token, 1}, batch_at(position)));
  }
  if (ahead && kv_->Reserve(seq, position + 2).ok()) {
    const int32_t from_device = kTokenOfPreviousStep;
    RETURN_IF_ERROR(decode_graphs_->Launch({&from_device, 1}, batch_at(position + 1)));
    *launched = true;
  }
  absl::StatusOr<const int32_t*> read = decode_graphs_->Wait();
  if (!read.ok()) {
    *launched = false;  // failed with it
    return read.status();
  }
  const int32_t* greedy = *read;
  if (sampler.greedy()) return greedy[0];
  const int64_t row = 0;
  ASSIGN_OR_RETURN(const float* logits, decode_graphs_->Logits({&row, 1}));
  return sampler.Sample(logits, config().vocab_size);
}

LocalEngine::~LocalEngine() = default;

}  // namespace strata
