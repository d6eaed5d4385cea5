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
  if (!(options.gate_temperature > 0.0f)) {
    return absl::InvalidArgumentError("gate_temperature must be positive");
  }
  std::unique_ptr<LocalEngine> engine(new LocalEngine());
  engine->options_ = options;
  ModelStackOptions stack;
  stack.device = options.device;
  stack.num_threads = options.num_threads;
  stack.kv = options.kv;
  stack.kv.prefix_caching = false;
  stack.kv_within_context = options.kv_within_context;
  stack.max_step_tokens = options.prefill_chunk_tokens;
  stack.max_sequences = 1;
  stack.expert_weights = options.expert_weights;
  stack.attention_weights = options.attention_weights;
  stack.on_progress = options.on_progress;
  ASSIGN_OR_RETURN(engine->stack_, ModelStack::Create(options.model_dir, stack));
  engine->kv_ = &engine->stack_->kv();
  StepRunnerOptions runner;
  runner.forward.gate_temperature = options.gate_temperature;
  runner.forward.on_routing = options.on_routing;
  // Decode steps replay one graph while the sequence fits its context.
  runner.cuda_graphs = options.cuda_graphs;
  runner.graphs.max_context =
      static_cast<int>(std::min<int64_t>(engine->max_sequence_tokens(), kDecodeGraphContext));
  runner.graphs.max_sequences = 1;
  engine->runner_ = CreateStepRunner(engine->stack_->config(), engine->stack_->router(),
                                     *engine->stack_->experts(), *engine->kv_, std::move(runner));
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

absl::StatusOr<StepResult> LocalEngine::Step(PagedKvCache::SequenceId seq,
                                             absl::Span<const int32_t> ids, int64_t start,
                                             std::vector<int64_t> logit_rows,
                                             std::vector<int64_t> host_rows, bool launch_next,
                                             std::vector<RowSampling> sampling) {
  const int64_t n = static_cast<int64_t>(ids.size());
  // An FP8 sequence growing past fp16_above_tokens turns 16-bit first (nothing in flight).
  if (kv_->NeedsWiden(seq, start + n)) RETURN_IF_ERROR(kv_->Widen(seq));
  RETURN_IF_ERROR(kv_->Reserve(seq, start + n));
  StepPlan plan;
  plan.ids.assign(ids.begin(), ids.end());
  plan.batch.sequence.assign(n, seq);
  plan.batch.position.resize(n);
  for (int64_t i = 0; i < n; ++i) plan.batch.position[i] = start + i;
  plan.logit_rows = std::move(logit_rows);
  plan.host_rows = std::move(host_rows);
  plan.sampling = std::move(sampling);
  plan.launch_next =
      launch_next && !kv_->NeedsWiden(seq, start + n + 1) && kv_->Reserve(seq, start + n + 1).ok();
  return runner_->Run(plan, [] {});
}

absl::StatusOr<StepResult> LocalEngine::RunStep(PagedKvCache::SequenceId seq,
                                                absl::Span<const int32_t> ids, int64_t start,
                                                bool last_row_only) {
  if (ids.empty() || start < 0 || start + std::ssize(ids) > max_sequence_tokens()) {
    return absl::InvalidArgumentError("a step needs tokens within the context");
  }
  std::vector<int64_t> rows;
  for (size_t i = last_row_only ? ids.size() - 1 : 0; i < ids.size(); ++i) {
    rows.push_back(static_cast<int64_t>(i));
  }
  return Step(seq, ids, start, rows, rows, false);
}

absl::StatusOr<StepResult> LocalEngine::RunChunked(PagedKvCache::SequenceId seq,
                                                   absl::Span<const int32_t> ids, int64_t start) {
  if (ids.empty()) return absl::InvalidArgumentError("a step needs tokens");
  const int64_t chunk = options_.prefill_chunk_tokens;
  StepResult last;
  for (int64_t at = 0; at < std::ssize(ids); at += chunk) {
    ASSIGN_OR_RETURN(last, RunStep(seq, ids.subspan(at, chunk), start + at,
                                   /*last_row_only=*/true));
  }
  return last;
}

absl::StatusOr<Tensor> LocalEngine::Logits(absl::Span<const int32_t> ids) {
  RETURN_IF_ERROR(ValidatePrompt(ids, 0));
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = config().vocab_size;
  const PagedKvCache::SequenceId seq = kv_->AddSequence(kv_->WantsWide(n));
  absl::Cleanup release = [&] { kv_->Release(seq); };
  Tensor all = Tensor::Host(n, vocab);
  for (int64_t start = 0; start < n; start += options_.prefill_chunk_tokens) {
    const int64_t len = std::min<int64_t>(options_.prefill_chunk_tokens, n - start);
    std::vector<int64_t> rows(len);
    for (int64_t i = 0; i < len; ++i) rows[i] = i;
    ASSIGN_OR_RETURN(StepResult step, Step(seq, ids.subspan(start, len), start, rows, rows, false));
    for (int64_t i = 0; i < len; ++i) {
      std::copy(step.logits(i), step.logits(i) + vocab, all.row(start + i));
    }
  }
  return all;
}

absl::StatusOr<std::vector<int32_t>> LocalEngine::Generate(absl::Span<const int32_t> prompt,
                                                           const GenerateOptions& options) {
  if (options.max_new_tokens <= 0) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if (options.sampling.min_tokens > options.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens ", options.sampling.min_tokens,
                                                   " is more than max_new_tokens ",
                                                   options.max_new_tokens));
  }
  RETURN_IF_ERROR(ValidatePrompt(prompt, options.max_new_tokens));
  const int64_t vocab = config().vocab_size;
  const PagedKvCache::SequenceId seq = kv_->AddSequence(kv_->WantsWide(std::ssize(prompt)));
  absl::Cleanup release = [&] { kv_->Release(seq); };
  // Ends before `release`: nothing may still write the sequence's keys and values then.
  absl::Cleanup drain = [&] { runner_->Abandon(); };
  const std::vector<int>& eos = config().eos_token_ids;
  Sampler sampler(options.sampling, prompt,
                  options.ignore_eos ? absl::Span<const int>() : absl::Span<const int>(eos));
  // Prefill in chunks; only the last prompt position's logits are needed.
  const int64_t n = static_cast<int64_t>(prompt.size());
  StepResult step;
  for (int64_t start = 0; start < n; start += options_.prefill_chunk_tokens) {
    const int64_t len = std::min<int64_t>(options_.prefill_chunk_tokens, n - start);
    ASSIGN_OR_RETURN(step, Step(seq, prompt.subspan(start, len), start, {len - 1}, {0}, false));
  }
  std::vector<int32_t> out;
  int32_t next = sampler.Sample(step.logits(0), vocab);
  bool in_flight = false;  // the step for `next` was launched ahead and waits to be collected
  while (true) {
    out.push_back(next);
    sampler.Accept(next);
    if (options.on_token) options.on_token(next);
    const bool is_eos = std::find(eos.begin(), eos.end(), next) != eos.end();
    const bool is_stop = std::binary_search(options.sampling.stop_token_ids.begin(),
                                            options.sampling.stop_token_ids.end(), next);
    const bool ready = static_cast<int>(out.size()) > options.sampling.min_tokens;
    if (static_cast<int>(out.size()) >= options.max_new_tokens ||
        (ready && ((is_eos && !options.ignore_eos) || is_stop))) {
      break;
    }
    const int64_t position = n + static_cast<int64_t>(out.size()) - 1;
    // The token is picked on the device unless the host must (RowSampling); the step after
    // this one then goes in behind it when its token will be wanted. Launched behind a step in
    // flight, a row's draw comes one step later than the tokens taken so far.
    std::optional<RowSampling> device = sampler.device_row(in_flight ? 1 : 0);
    const bool ahead = options_.overlap_decode_steps && device.has_value() &&
                       static_cast<int>(out.size()) + 1 < options.max_new_tokens;
    absl::StatusOr<StepResult> result;
    bool on_device = false;
    if (in_flight) {
      result = runner_->Collect(
          ahead && !kv_->NeedsWiden(seq, position + 2) && kv_->Reserve(seq, position + 2).ok(),
          device ? absl::Span<const RowSampling>(&*device, 1) : absl::Span<const RowSampling>(),
          [] {});
      on_device = true;  // a step launched ahead picks its token there
      // Lost with whatever was in flight: the step runs again from the token the host has.
      if (!result.ok()) in_flight = false;
    }
    if (!in_flight) {
      device = sampler.device_row();
      on_device = device.has_value();
      result = Step(seq, {&next, 1}, position, {0},
                    device ? std::vector<int64_t>{} : std::vector<int64_t>{0},
                    ahead && device.has_value(),
                    device ? std::vector<RowSampling>{*device} : std::vector<RowSampling>{});
    }
    if (!result.ok()) return result.status();
    next = result->tokens != nullptr && on_device ? result->tokens[0]
                                                  : sampler.Sample(result->logits(0), vocab);
    in_flight = result->next_in_flight;
  }
  return out;
}

LocalEngine::~LocalEngine() = default;

}  // namespace strata
