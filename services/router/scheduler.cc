#include "services/router/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/engine/sampling_request.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "services/router/output_text.h"
#include "services/router/token_logprobs.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double MillisBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A sequence's sampler. The seed is the spec's (the front end's: NormalizeSampling draws one
// where the client sent none). min_tokens holds back the end-of-sequence tokens only where
// they end the request.
// The seed is the front end's (NormalizeSampling draws one where the client sent none).
// min_tokens holds back the end-of-sequence tokens only where they end the request. Each sample
// of a request gets its own grammar state.
std::unique_ptr<Sampler> NewSampler(const RequestSpec& spec, const std::vector<int>& eos) {
  return std::make_unique<Sampler>(
      spec.sampling, spec.prompt,
      spec.ignore_eos ? absl::Span<const int>() : absl::Span<const int>(eos),
      spec.constraint != nullptr ? spec.constraint->NewConstraint() : nullptr);
}

std::unique_ptr<OutputText> NewOutputText(const RequestSpec& spec, const Tokenizer* tokenizer) {
  return std::make_unique<OutputText>(tokenizer, spec.stop, spec.sampling.skip_special_tokens,
                                      spec.sampling.include_stop_str_in_output);
}

}  // namespace

struct Scheduler::Sequence {
  Ticket ticket = 0;
  Ticket request = 0;  // Submit's: every sample of the request is cancelled by it
  int sample = 0;      // the index among the request's samples
  // Samples 1..n-1's sinks, until they fork off once the prompt is computed.
  std::vector<std::shared_ptr<ResponseSink>> fork_sinks;
  RequestSpec spec;
  std::shared_ptr<ResponseSink> sink;
  std::vector<int32_t> tokens;  // prompt, then every generated token
  int64_t computed = 0;         // leading tokens whose keys and values are in the cache
  bool has_kv = false;
  PagedKvCache::SequenceId kv_seq = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<OutputText> text;
  // score_only or prompt_logprobs: log-probabilities of prompt tokens 1..n-1, until sent.
  std::vector<TokenLogprobs> scores;
  bool scores_sent = false;
  int generated = 0;
  int draft_length = 0;  // speculation: tokens drafted a step now (NextDraftLength)
  Clock::time_point submitted, first_token, last_token;
};

Scheduler::Scheduler(const ModelConfig& config, StepRunner& runner, PagedKvCache& kv,
                     const Tokenizer* tokenizer, SchedulerOptions options)
    : config_(config), runner_(runner), kv_(kv), tokenizer_(tokenizer), options_(options) {
  free_kv_blocks_.store(kv.free_blocks());
  kv_pool_blocks_.store(kv.active_blocks());
  // The pool's largest: it may grow into memory lent by the expert slots (KvLending) as the
  // context lengthens.
  start_blocks_ = kv.active_blocks();
  max_context_tokens_ = std::min(config.max_position_embeddings,
                                 int64_t{kv.options().num_blocks} * kv.options().cache.block_size);
  if (options.max_context_tokens > 0) {
    max_context_tokens_ = std::min(max_context_tokens_, options.max_context_tokens);
  }
  options_.max_batch_tokens = std::max(options_.max_batch_tokens, 1);
  options_.max_running = std::max(options_.max_running, 1);
  speculation_ = SpeculationControl(options_.speculation);
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cut_off_.store(true);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::Start() {
  thread_ = std::thread([this] {
    if (options_.on_engine_thread) options_.on_engine_thread();
    Loop();
  });
}

absl::Status Scheduler::CheckTextFits(absl::string_view what, size_t bytes, bool prompt) const {
  if (tokenizer_ == nullptr) return absl::OkStatus();
  const int64_t at_least = tokenizer_->MinTokens(bytes);
  if (at_least <= max_context_tokens_ - (prompt ? 1 : 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " of ", bytes, " bytes is at least ",
                                                 at_least, " tokens; the context holds ",
                                                 max_context_tokens_));
}

absl::StatusOr<Scheduler::Ticket> Scheduler::Submit(
    RequestSpec spec, std::vector<std::shared_ptr<ResponseSink>> sinks) {
  const int64_t prompt_len = static_cast<int64_t>(spec.prompt.size());
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (spec.n < 1 || spec.n > kMaxSamples) {
    return InvalidParam("n", absl::StrCat("n must be in [1, ", kMaxSamples, "], not ", spec.n));
  }
  if (static_cast<int>(sinks.size()) != spec.n) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.n, " samples need as many sinks, not ", sinks.size()));
  }
  if (spec.score_only && spec.n != 1) {
    return InvalidParam("n", "a prompt scored alone has one sample");
  }
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    if (spec.prompt[i] < 0 || spec.prompt[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", spec.prompt[i], " at position ", i,
                       " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  if (spec.score_only) {
    if (prompt_len > max_context_tokens_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the text has ", prompt_len, " tokens; the context holds ", max_context_tokens_));
    }
    spec.max_new_tokens = 1;  // unused; keeps the checks below uniform
  } else if (prompt_len >= max_context_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt_len, " tokens; the context holds ", max_context_tokens_));
  }
  if (spec.max_new_tokens <= 0) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  if (!spec.score_only && prompt_len + spec.max_new_tokens > max_context_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens ", spec.max_new_tokens, " is over the limit: the ", prompt_len,
        "-token prompt leaves room for ", max_context_tokens_ - prompt_len, " new tokens"));
  }
  if (absl::Status s = ValidateSamplingParams(spec.sampling); !s.ok()) return s;
  if (spec.top_logprobs < 0 || spec.top_logprobs > kMaxTopLogprobs) {
    return InvalidParam("top_logprobs",
                        absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "], not ",
                                     spec.top_logprobs));
  }
  if (!spec.score_only && spec.sampling.min_tokens > spec.max_new_tokens) {
    return InvalidParam(
        "min_tokens", absl::StrCat("'min_tokens' ", spec.sampling.min_tokens,
                                   " is more than the request's max tokens ", spec.max_new_tokens));
  }
  // A grammar complete only with an end-of-sequence token cannot also hold that token back.
  if (spec.constraint != nullptr && spec.sampling.min_tokens > 0) {
    return InvalidParam("min_tokens",
                        "'min_tokens' cannot be combined with a response format: the format's "
                        "grammar decides where the output ends");
  }
  if (!spec.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stop strings need a model with a tokenizer");
  }
  // Every new token is checked against every stop string: bounded, so that one request cannot
  // slow the engine down for all.
  if (spec.stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxStopStrings, " stop strings, not ", spec.stop.size()));
  }
  for (const std::string& stop : spec.stop) {
    if (stop.empty() || stop.size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a stop string has 1..", kMaxStopBytes, " bytes, not ", stop.size()));
    }
  }

  auto seq = std::make_unique<Sequence>();
  seq->spec = std::move(spec);
  seq->sink = std::move(sinks[0]);
  seq->fork_sinks.assign(sinks.begin() + 1, sinks.end());
  seq->tokens = seq->spec.prompt;
  seq->sampler = NewSampler(seq->spec, config_.eos_token_ids);
  seq->draft_length = options_.speculation.max_draft_tokens;
  seq->text = NewOutputText(seq->spec, tokenizer_);
  seq->submitted = Clock::now();
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stopping_) return absl::UnavailableError("the server is shutting down");
    // Requests that start at the next step do not wait: only those beyond the running batch's
    // free places count against the queue (a burst into an idle server is not refused).
    const int free_places = std::max(0, options_.max_running - running_count_.load());
    if (queued_.load() >= options_.max_queued_requests + free_places) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "too many requests waiting (", options_.max_queued_requests, "); retry later"));
    }
    // Sample i's ticket is ticket + i.
    ticket = next_ticket_;
    next_ticket_ += seq->spec.n;
    seq->ticket = ticket;
    seq->request = ticket;
    incoming_.push_back(std::move(seq));
    queued_.fetch_add(1);
  }
  cv_.notify_all();
  return ticket;
}

void Scheduler::Cancel(Ticket ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(ticket);
  }
  cv_.notify_all();
}

bool Scheduler::Drain(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  const bool done = idle_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
    return queued_.load() == 0 && running_count_.load() == 0 && unsent_.load() == 0;
  });
  if (done) return true;
  // Time is up: cancel whatever is left (its clients are told why: CutOffStatus) and wait for
  // the engine to release it.
  cut_off_.store(true);
  for (Ticket t = 1; t < next_ticket_; ++t) cancelled_.insert(t);
  cv_.notify_all();
  idle_cv_.wait_for(lock, std::chrono::seconds(10), [&] {
    return queued_.load() == 0 && running_count_.load() == 0 && unsent_.load() == 0;
  });
  return false;
}

Scheduler::Stats Scheduler::stats() const {
  Stats s;
  s.waiting = queued_.load();
  s.running = running_count_.load();
  s.free_kv_blocks = free_kv_blocks_.load();
  s.prompt_tokens_computed = prompt_tokens_computed_.load();
  s.prefix_queried_tokens = prefix_queried_tokens_.load();
  s.prefix_hit_tokens = prefix_hit_tokens_.load();
  s.prefix_cached_blocks = prefix_cached_blocks_.load();
  s.draft_tokens = draft_tokens_.load();
  s.accepted_draft_tokens = accepted_draft_tokens_.load();
  s.draft_steps = draft_steps_.load();
  s.speculation_turned_off = speculation_turned_off_.load();
  s.kv_scales_ready = kv_scales_ready_.load();
  s.preemptions = preemptions_.load();
  s.steps_ahead = steps_ahead_.load();
  const StepRunnerStats runner = runner_.stats();
  s.steps = runner.steps;
  s.graph_steps = runner.graph_steps;
  s.overlapped_steps = runner.graph_timing.overlapped;
  s.graph_replay_us = runner.graph_timing.mean_replay_us();
  s.graph_between_us = runner.graph_timing.mean_between_us();
  s.replay_or_eager = runner.replay_or_eager;
  return s;
}

void Scheduler::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !incoming_.empty() || !cancelled_.empty() || !running_.empty() ||
               !waiting_.empty() || ahead_.has_value() || kv_resize_.has_value();
      });
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      if (stopping_) {
        for (Ticket t = 1; t < next_ticket_; ++t) cancelled_.insert(t);
      }
    }
    ApplyCancellations();
    if (!ahead_) ApplyKvResize();
    if (stopping_ && running_.empty() && waiting_.empty() && !ahead_) break;
    Admit();
    // A step that ran with sequences still running leaves its outbox to the next step.
    const bool calibrating = kv_.calibrating();
    if (!Step() || running_.empty()) FlushOutbox();
    kv_scales_ready_.store(kv_.scales_ready());
    if (calibrating && !kv_.calibrating()) {
      Log(LogLevel::kInfo, absl::StrCat("KV cache: FP8 scales set from the keys and values of ",
                                        kv_.observed_tokens(), " tokens"));
    }
    free_kv_blocks_.store(kv_.free_blocks());  // for stats(): the pool is the engine thread's
    prefix_cached_blocks_.store(kv_.prefix_stats().cached_blocks);
    if (running_.empty() && waiting_.empty()) NotifyIdle();
  }
  FlushOutbox();
  NotifyIdle();
}

void Scheduler::NotifyIdle() {
  // Under the lock: a Drain that just found work left is waiting before this wakes it.
  std::lock_guard<std::mutex> lock(mu_);
  idle_cv_.notify_all();
}

void Scheduler::Post(std::function<void()> send) {
  outbox_.push_back(std::move(send));
  unsent_.fetch_add(1);
}

void Scheduler::FlushOutbox() {
  if (outbox_.empty()) return;
  std::vector<std::function<void()>> sending;
  sending.swap(outbox_);
  for (std::function<void()>& send : sending) send();
  unsent_.fetch_sub(static_cast<int>(sending.size()));
}

void Scheduler::ApplyCancellations() {
  absl::flat_hash_set<Ticket> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled.swap(cancelled_);
  }
  if (cancelled.empty()) return;
  for (size_t i = 0; i < waiting_.size();) {
    if (cancelled.contains(waiting_[i]->request)) {
      std::unique_ptr<Sequence> seq = std::move(waiting_[i]);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      RequestUsage usage;
      usage.prompt_tokens = static_cast<int>(seq->spec.prompt.size());
      usage.completion_tokens = seq->generated;
      Report(*seq, FinishReason::kCancelled, usage, 0);
      FinishUnforked(seq.get(), FinishReason::kCancelled, CutOffStatus());
      // Posted (unsent) before it stops counting as queued: Drain never sees neither.
      Post([sink = seq->sink, usage, status = CutOffStatus()] {
        sink->OnFinish(FinishReason::kCancelled, usage, status);
      });
      queued_.fetch_sub(1);
    } else {
      ++i;
    }
  }
  // Finish() erases from running_, so collect first.
  std::vector<Sequence*> doomed;
  for (auto& seq : running_) {
    if (cancelled.contains(seq->request)) doomed.push_back(seq.get());
  }
  for (Sequence* seq : doomed) Finish(seq, FinishReason::kCancelled, CutOffStatus());
}

absl::Status Scheduler::CutOffStatus() const {
  if (!cut_off_.load()) return absl::OkStatus();
  return absl::UnavailableError(
      "the server stopped before this request finished (its drain time ran out); retry it");
}

void Scheduler::Admit() {
  if (waiting_.empty()) return;  // every step comes here; most steps have nobody waiting
  // A waiting sequence comes in only when the pool can hold every token it has (its prompt,
  // or its prompt and output after a preemption) besides what the running ones still need for
  // theirs, keeping 1% of the pool for their decodes; otherwise it and those behind it wait.
  // Admitting it anyway only has the step preempt it, or a running sequence, again, each time
  // throwing computed keys away (a Mixtral benchmark run preempted 53884 times in 8901 steps).
  int64_t available = kv_.free_blocks() - std::max(1, kv_.active_blocks() / 100);
  for (const auto& seq : running_) {
    const int64_t held = seq->has_kv ? kv_.blocks_held(seq->kv_seq) : 0;
    const bool wide = seq->has_kv ? kv_.wide(seq->kv_seq) : kv_.WantsWide(std::ssize(seq->tokens));
    available -= std::max<int64_t>(0, kv_.BlocksFor(std::ssize(seq->tokens), wide) - held);
  }
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    Sequence* seq = waiting_.front().get();
    // A request's samples take their places in the batch together (alone, any number).
    const int places = 1 + static_cast<int>(seq->fork_sinks.size());
    if (!running_.empty() && static_cast<int>(running_.size()) + places > options_.max_running) {
      break;
    }
    // Cached blocks that running sequences hold cost no free block. A prompt to score is
    // computed whole: a cached block's positions would give no logits.
    const bool match = !WantsScores(*seq);
    const int64_t need =
        kv_.BlocksFor(std::ssize(seq->tokens), kv_.WantsWide(std::ssize(seq->tokens))) -
        (match ? kv_.HeldPrefixBlocks(seq->tokens) : 0);
    if (!running_.empty() && need > available) break;
    available -= need;
    if (match && kv_.options().cache.prefix_caching) {
      seq->kv_seq = kv_.AddSequence(kv_.WantsWide(std::ssize(seq->tokens)));
      seq->has_kv = true;
      seq->computed = kv_.MatchPrefix(seq->kv_seq, seq->tokens);
      const PrefixCacheStats& prefix = kv_.prefix_stats();
      prefix_queried_tokens_.store(prefix.queried_tokens);
      prefix_hit_tokens_.store(prefix.hit_tokens);
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    // Counted as running before it stops counting as queued: Drain never sees neither.
    running_count_.store(static_cast<int>(running_.size()));
    queued_.fetch_sub(1);
  }
}

bool Scheduler::LoneSequenceStalled(Ticket ticket) {
  // Counted afresh for another sequence, or once the pool has grown or shrunk.
  if (kv_.active_blocks() != stall_pool_blocks_ || ticket != stall_ticket_) {
    stall_pool_blocks_ = kv_.active_blocks();
    stall_ticket_ = ticket;
    lone_stalls_ = 0;
  }
  return ++lone_stalls_ > kMaxLoneStalls;
}

void Scheduler::Preempt(Sequence* seq) {
  if (seq->has_kv) kv_.Release(seq->kv_seq);
  seq->has_kv = false;
  seq->computed = 0;  // recomputed from its tokens (prompt and output so far) when readmitted
  seq->scores.clear();
  auto it =
      std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  queued_.fetch_add(1);
  running_count_.store(static_cast<int>(running_.size()));
  preemptions_.fetch_add(1);
}

bool Scheduler::Step() {
  if (ahead_) return StepAhead();
  if (running_.empty()) return false;
  std::vector<Planned> plan = PlanStep();
  ReserveKv(plan);
  if (plan.empty()) return false;
  StepLayout layout = LayOut(plan);
  LaunchedRows rows;
  if (layout.scored.empty() && layout.step.ids.size() == layout.sampled.size()) {  // decodes only
    rows.rows = layout.sampled;
    for (Sequence* seq : layout.sampled) rows.tickets.push_back(seq->ticket);
    rows.positions.assign(layout.step.batch.position.begin(), layout.step.batch.position.end());
    layout.step.launch_next = ReserveAhead(rows);
  }
  const Clock::time_point started = Clock::now();
  absl::StatusOr<StepResult> result = runner_.Run(layout.step, [this] { WhileRunning(); });
  const double seconds = MillisBetween(started, Clock::now()) / 1e3;
  if (!result.ok()) {
    for (const Planned& p : plan) Finish(p.seq, FinishReason::kError, result.status());
    return true;
  }
  if (result->next_in_flight) {
    steps_ahead_.fetch_add(1);
    for (int64_t& position : rows.positions) ++position;
    ahead_ = std::move(rows);
  }
  TakeResults(plan, layout, *result, seconds);
  return true;
}

std::vector<Scheduler::Planned> Scheduler::PlanStep() {
  std::vector<Planned> plan;
  int64_t budget = options_.max_batch_tokens;
  const bool drafting = speculation_.DraftThisStep();
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& owned : running_) {
      Sequence* seq = owned.get();
      const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->computed;
      const bool is_decode = remaining == 1;
      if ((pass == 0) != is_decode || budget == 0) continue;
      std::vector<int32_t> draft;
      if (is_decode && drafting) draft = Draft(*seq, budget - 1);
      const int64_t count = std::min(remaining, budget) + static_cast<int64_t>(draft.size());
      plan.push_back({seq, count, std::move(draft)});
      budget -= count;
    }
  }
  return plan;
}

void Scheduler::ReserveKv(std::vector<Planned>& plan) {
  for (size_t i = 0; i < plan.size();) {
    Sequence* seq = plan[i].seq;
    if (!seq->has_kv) {
      seq->kv_seq = kv_.AddSequence(kv_.WantsWide(std::ssize(seq->tokens)));
      seq->has_kv = true;
    }
    // An FP8 sequence growing past fp16_above_tokens turns 16-bit first.
    const int64_t target = seq->computed + plan[i].count;
    absl::Status reserved =
        kv_.NeedsWiden(seq->kv_seq, target) ? kv_.Widen(seq->kv_seq) : absl::OkStatus();
    if (reserved.ok()) reserved = kv_.Reserve(seq->kv_seq, target);
    if (reserved.ok()) {
      ++i;
      continue;
    }
    if (running_.size() == 1 && LoneSequenceStalled(seq->ticket)) {
      // Alone and still short: the pool started below the longest context and has not grown
      // into lent memory (KvLending) for it.
      Finish(seq, FinishReason::kError,
             absl::ResourceExhaustedError(absl::StrCat(
                 "the KV pool (", kv_.active_blocks(), " blocks of ",
                 kv_.options().cache.block_size, " tokens) cannot hold this request's ", target,
                 " tokens and has not grown for it; raise kv_cache.memory_mb")));
      plan.erase(plan.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    // The victim may sit before or after `seq` in the plan; find `seq` again afterwards.
    // running_ stays in arrival order (admission takes the queue's head, a preempted sequence
    // goes back to the head), so its back is the latest arrival.
    Sequence* victim = running_.back().get();
    Preempt(victim);
    plan.erase(
        std::remove_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.seq == victim; }),
        plan.end());
    if (victim == seq) continue;  // plan[i] is now the next sequence
    i = static_cast<size_t>(
        std::find_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.seq == seq; }) -
        plan.begin());
  }
}

Scheduler::StepLayout Scheduler::LayOut(const std::vector<Planned>& plan) {
  StepLayout layout;
  StepPlan& step = layout.step;
  bool any_draws = false;  // a row's pick on the device is more than the plain arg-max
  std::vector<int64_t> score_rows;
  for (const Planned& p : plan) {
    const int64_t length = static_cast<int64_t>(p.seq->tokens.size());
    const int64_t own = p.count - static_cast<int64_t>(p.draft.size());
    for (int64_t j = 0; j < p.count; ++j) {
      const int64_t position = p.seq->computed + j;
      step.ids.push_back(j < own ? p.seq->tokens[position] : p.draft[j - own]);
      step.batch.sequence.push_back(p.seq->kv_seq);
      step.batch.position.push_back(position);
      if (WantsScores(*p.seq) && position + 1 < std::ssize(p.seq->spec.prompt)) {
        score_rows.push_back(static_cast<int64_t>(step.ids.size()) - 1);
        layout.scored.push_back({p.seq, p.seq->tokens[position + 1]});
      }
    }
    if (p.seq->spec.score_only || p.seq->computed + own != length) continue;
    // A drafted row's logits come back for its own token and every drafted one; so do those
    // of a row whose transforms or logprobs need the host, and of a prompt's last row when its
    // samples fork off there (each draws from it).
    std::optional<RowSampling> device;
    if (!p.seq->spec.logprobs && p.draft.empty() && p.seq->fork_sinks.empty()) {
      device = p.seq->sampler->device_row();
    }
    any_draws |= device.has_value() && !device->plain_argmax();
    layout.first_row.push_back(layout.sampled_rows);
    for (int64_t j = own - 1; j < p.count; ++j) {
      step.logit_rows.push_back(static_cast<int64_t>(step.ids.size()) - p.count + j);
      step.sampling.push_back(device.value_or(RowSampling()));
      if (!device) step.host_rows.push_back(layout.sampled_rows);
      ++layout.sampled_rows;
    }
    layout.sampled.push_back(p.seq);
    layout.drafts.push_back(&p.draft);
    layout.on_device.push_back(device.has_value());
  }
  step.logit_rows.insert(step.logit_rows.end(), score_rows.begin(), score_rows.end());
  if (any_draws) {
    step.sampling.resize(step.logit_rows.size());  // score rows: an arg-max nobody reads
  } else {
    step.sampling.clear();  // every row's arg-max
  }
  // The score rows' logits come to the host too; the other rows need their greedy token only.
  for (size_t r = 0; r < layout.scored.size(); ++r) {
    step.host_rows.push_back(layout.sampled_rows + static_cast<int64_t>(r));
  }
  return layout;
}

void Scheduler::TakeResults(const std::vector<Planned>& plan, const StepLayout& layout,
                            const StepResult& result, double seconds) {
  const int64_t vocab = config_.vocab_size;
  // A draft's positions count once verified (VerifyDraft).
  for (const Planned& p : plan) {
    const int64_t own = p.count - static_cast<int64_t>(p.draft.size());
    const int64_t prompt = static_cast<int64_t>(p.seq->spec.prompt.size());
    prompt_tokens_computed_.fetch_add(
        std::max<int64_t>(0, std::min(p.seq->computed + own, prompt) - p.seq->computed));
    Computed(p.seq, own);
  }
  for (size_t r = 0; r < layout.scored.size(); ++r) {
    const float* row = result.logits(layout.sampled_rows + static_cast<int64_t>(r));
    Sequence* seq = layout.scored[r].seq;
    seq->scores.push_back(LogprobsAt(row, vocab, layout.scored[r].target, seq->spec.top_logprobs));
  }
  // A prompt's scores go out once it is computed, before its first token (posted below).
  for (const Planned& p : plan) {
    if (!WantsScores(*p.seq) || p.seq->computed < std::ssize(p.seq->spec.prompt)) continue;
    p.seq->scores_sent = true;
    Post([sink = p.seq->sink, scores = std::move(p.seq->scores)] { sink->OnScores(scores); });
    if (p.seq->spec.score_only) Finish(p.seq, FinishReason::kLength);
  }
  bool any_draft = false;
  int64_t tokens = 0;
  for (size_t r = 0; r < layout.sampled.size(); ++r) {
    Sequence* seq = layout.sampled[r];
    const int64_t row = layout.first_row[r];
    if (!layout.drafts[r]->empty()) {
      any_draft = true;
      tokens += VerifyDraft(seq, result, row, *layout.drafts[r]);
      continue;
    }
    if (!seq->fork_sinks.empty()) ForkSamples(seq, result.logits(row));
    const int32_t token = result.tokens != nullptr && layout.on_device[r]
                              ? result.tokens[row]
                              : seq->sampler->Sample(result.logits(row), vocab);
    TokenLogprobs logprobs;
    if (seq->spec.logprobs) {
      logprobs = LogprobsAt(result.logits(row), vocab, token, seq->spec.top_logprobs);
    }
    HandleToken(seq, token, std::move(logprobs));
    ++tokens;
  }
  if (any_draft) draft_steps_.fetch_add(1);
  // Whether drafting pays, from decode-only steps.
  if (layout.scored.empty() && std::ssize(layout.sampled) == std::ssize(plan)) {
    bool decode_only = true;
    for (const Planned& p : plan) decode_only &= p.count == 1 + std::ssize(p.draft);
    if (decode_only) {
      speculation_.RecordStep(any_draft, seconds, tokens);
      speculation_turned_off_.store(speculation_.times_turned_off());
    }
  }
}

void Scheduler::Computed(Sequence* seq, int64_t count) {
  seq->computed += count;
  kv_.CommitPrefix(seq->kv_seq, seq->tokens, seq->computed);
}

bool Scheduler::MayLaunchAhead() const {
  // Drafting needs every step planned here (a step launched ahead has no drafts).
  return options_.overlap_decode_steps && waiting_.empty() && !kv_resize_pending_.load() &&
         !speculation_.active();
}

std::vector<int32_t> Scheduler::Draft(const Sequence& seq, int64_t room) const {
  const SpeculationOptions& o = options_.speculation;
  // A grammar's mask is known for the next token only: its rows take no drafts.
  if (seq.spec.score_only || seq.spec.logprobs || seq.draft_length <= 0 ||
      seq.sampler->constrained()) {
    return {};
  }
  // The draft's tokens and the one after them must stay within the request and the context.
  const int64_t max_tokens =
      std::min<int64_t>({seq.draft_length, room, seq.spec.max_new_tokens - seq.generated - 1,
                         max_context_tokens_ - static_cast<int64_t>(seq.tokens.size()) - 1});
  if (max_tokens <= 0) return {};
  if (o.draft_model != nullptr) {
    return o.draft_model->Draft(seq.ticket, seq.tokens, static_cast<int>(max_tokens));
  }
  return NgramDraft(seq.tokens, o.ngram_min, o.ngram_max, static_cast<int>(max_tokens));
}

int64_t Scheduler::VerifyDraft(Sequence* seq, const StepResult& result, int64_t first_row,
                               const std::vector<int32_t>& draft) {
  const int64_t vocab = config_.vocab_size;
  Sampler& sampler = *seq->sampler;
  const int drafted = static_cast<int>(draft.size());
  int accepted = 0;
  int64_t handed = 0;
  draft_tokens_.fetch_add(drafted);
  for (int i = 0; i <= drafted; ++i) {
    const float* logits = result.logits(first_row + i);
    int32_t token = 0;
    bool stands = false;
    if (i < drafted) {
      stands = sampler.AcceptDraft(logits, vocab, draft[i], token);
      if (stands) token = draft[i];
    } else {
      token = sampler.Sample(logits, vocab);  // every draft stood: one more from the last row
    }
    accepted += stands;
    const bool last = i == drafted || !stands;
    if (last) {
      seq->draft_length = NextDraftLength(seq->draft_length, drafted, accepted,
                                          options_.speculation.max_draft_tokens);
    }
    ++handed;
    if (!HandleToken(seq, token) || last) break;  // ended (`seq` is gone), or verified
    Computed(seq, 1);  // the accepted draft's keys and values, written by this step, stand
  }
  accepted_draft_tokens_.fetch_add(accepted);
  return handed;
}

void Scheduler::ResizeKv(int blocks, std::function<void(absl::StatusOr<KvResize>)> done) {
  std::unique_lock<std::mutex> lock(mu_);
  if (kv_resize_.has_value()) {
    lock.unlock();
    done(absl::FailedPreconditionError("a KV pool resize is already under way"));
    return;
  }
  kv_resize_ = PendingResize{blocks, std::move(done)};
  kv_resize_pending_.store(true);
  lock.unlock();
  cv_.notify_all();
}

void Scheduler::ApplyKvResize() {
  std::optional<PendingResize> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(kv_resize_);
  }
  if (!pending) return;
  kv_resize_pending_.store(false);
  // The pool must hold one sequence of the longest context (16-bit in an FP8 pool), or a
  // request of that length could never be admitted.
  const int64_t floor =
      std::min<int64_t>(kv_.BlocksFor(max_context_tokens_, kv_.options().fp8()), start_blocks_);
  if (pending->blocks < floor) {
    pending->done(absl::FailedPreconditionError(
        absl::StrCat("a KV pool of ", pending->blocks,
                     " blocks cannot hold one sequence of the longest context (",
                     max_context_tokens_, " tokens: ", floor, " blocks)")));
    return;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> moved = runner_.ResizeKv(kv_, pending->blocks);
  if (!moved.ok()) {
    pending->done(moved.status());
    return;
  }
  KvResize result;
  result.blocks = kv_.active_blocks();
  result.moved_blocks = *moved;
  result.millis = absl::ToDoubleMilliseconds(absl::Now() - start);
  kv_pool_blocks_.store(result.blocks);
  free_kv_blocks_.store(kv_.free_blocks());
  Log(LogLevel::kInfo, absl::StrCat("KV pool resized to ", result.blocks, " blocks (",
                                    result.moved_blocks, " moved, ", result.millis, " ms)"));
  pending->done(result);
}

bool Scheduler::ReserveAhead(const LaunchedRows& in_flight, std::vector<RowSampling>* sampling) {
  const size_t n = in_flight.rows.size();
  if (!MayLaunchAhead() || n == 0 || n != running_.size() ||
      static_cast<int64_t>(n) > options_.max_batch_tokens) {
    return false;
  }
  std::vector<RowSampling> rows;
  bool plain = true;  // every row the arg-max of untransformed logits
  for (size_t i = 0; i < n; ++i) {
    Sequence* seq = running_[i].get();
    // running_ as it was at the launch, every row in its place, the step in flight computing
    // the position after the last one in the cache.
    if (seq != in_flight.rows[i] || seq->ticket != in_flight.tickets[i] || !seq->has_kv ||
        seq->computed != in_flight.positions[i] || seq->spec.logprobs || seq->spec.score_only ||
        seq->generated + 1 >= seq->spec.max_new_tokens) {
      return false;
    }
    // The step launched behind the one in flight draws each row's token after that one's.
    std::optional<RowSampling> row = seq->sampler->device_row(/*in_flight=*/1);
    if (!row) return false;
    plain &= row->plain_argmax();
    rows.push_back(*std::move(row));
  }
  for (size_t i = 0; i < n; ++i) {
    // A sequence to widen first goes through an eager plan (Step).
    if (kv_.NeedsWiden(in_flight.rows[i]->kv_seq, in_flight.positions[i] + 2)) return false;
  }
  for (size_t i = 0; i < n; ++i) {
    // Never a preemption for a step ahead: the step runs as usual once this one is read.
    if (!kv_.Reserve(in_flight.rows[i]->kv_seq, in_flight.positions[i] + 2).ok()) return false;
  }
  if (sampling != nullptr && !plain) *sampling = std::move(rows);
  return true;
}

bool Scheduler::StepAhead() {
  LaunchedRows current = std::move(*ahead_);
  ahead_.reset();
  speculation_.DraftThisStep();  // counts the step (a cooldown runs out in chains too)
  std::vector<RowSampling> sampling;
  const bool next = ReserveAhead(current, &sampling);
  absl::StatusOr<StepResult> result = runner_.Collect(next, sampling, [this] { WhileRunning(); });
  if (!result.ok()) {
    // Every step in flight failed: the sequences still running decode again from what the
    // host has (their reserved positions are kept).
    Log(LogLevel::kWarning, absl::StrCat("decode step launched ahead failed (",
                                         result.status().message(), "); running it again"));
    return Step();
  }
  for (size_t i = 0; i < current.rows.size(); ++i) {
    // Rows whose sequence ended (or was preempted) meanwhile are dropped: compared by address
    // with the running ones first, since an ended one's is gone.
    Sequence* seq = nullptr;
    for (const auto& running : running_) {
      if (running.get() == current.rows[i]) seq = running.get();
    }
    if (seq == nullptr || seq->ticket != current.tickets[i] || !seq->has_kv ||
        seq->computed != current.positions[i] ||
        static_cast<int64_t>(seq->tokens.size()) != seq->computed + 1) {
      continue;
    }
    Computed(seq, 1);
    HandleToken(seq, result->tokens[i]);
  }
  if (result->next_in_flight) {
    steps_ahead_.fetch_add(1);
    for (int64_t& position : current.positions) ++position;
    ahead_ = std::move(current);
  }
  return true;
}

void Scheduler::ForkSamples(Sequence* parent, const float* logits) {
  std::vector<std::shared_ptr<ResponseSink>> sinks;
  sinks.swap(parent->fork_sinks);
  for (size_t i = 0; i < sinks.size(); ++i) {
    auto owned = std::make_unique<Sequence>();
    Sequence* seq = owned.get();
    seq->sample = static_cast<int>(i) + 1;
    seq->ticket = parent->ticket + seq->sample;
    seq->request = parent->request;
    seq->spec = parent->spec;
    seq->spec.sampling.seed = parent->spec.sampling.seed + seq->sample;  // wraps, as uint64
    seq->spec.prompt_logprobs = false;  // the prompt's scores went to the first sample
    seq->sink = std::move(sinks[i]);
    seq->tokens = parent->tokens;
    seq->sampler = NewSampler(seq->spec, config_.eos_token_ids);
    seq->draft_length = options_.speculation.max_draft_tokens;
    seq->text = NewOutputText(seq->spec, tokenizer_);
    seq->submitted = parent->submitted;
    // Without a block to copy the partial one into, the sample computes the prompt again.
    absl::StatusOr<PagedKvCache::SequenceId> forked = kv_.Fork(parent->kv_seq, parent->computed);
    if (forked.ok()) {
      seq->kv_seq = *forked;
      seq->has_kv = true;
      seq->computed = parent->computed;
    }
    running_.push_back(std::move(owned));
    running_count_.store(static_cast<int>(running_.size()));
    const int32_t token = seq->sampler->Sample(logits, config_.vocab_size);
    TokenLogprobs logprobs;
    if (seq->spec.logprobs) {
      logprobs = LogprobsAt(logits, config_.vocab_size, token, seq->spec.top_logprobs);
    }
    HandleToken(seq, token, std::move(logprobs));
  }
}

void Scheduler::FinishUnforked(Sequence* seq, FinishReason reason, const absl::Status& status) {
  RequestUsage usage;
  usage.prompt_tokens = static_cast<int>(seq->spec.prompt.size());
  for (std::shared_ptr<ResponseSink>& sink : seq->fork_sinks) {
    Post(
        [sink = std::move(sink), reason, usage, status] { sink->OnFinish(reason, usage, status); });
  }
  seq->fork_sinks.clear();
}

bool Scheduler::WantsScores(const Sequence& seq) {
  return seq.spec.score_only || (seq.spec.prompt_logprobs && !seq.scores_sent);
}

bool Scheduler::HandleToken(Sequence* seq, int32_t token, TokenLogprobs logprobs) {
  const Clock::time_point now = Clock::now();
  const bool first = seq->generated == 0;
  metrics_.AddToken(first, MillisBetween(first ? seq->submitted : seq->last_token, now) / 1e3);
  if (first) seq->first_token = now;
  seq->last_token = now;
  seq->tokens.push_back(token);
  ++seq->generated;
  if (!seq->sampler->Accept(token)) {
    // Only a row whose every token was masked out gets here (NaN or -inf logits).
    Finish(seq, FinishReason::kError,
           absl::InternalError(absl::StrCat("token ", token,
                                            " is not allowed by the request's "
                                            "response format (no token was)")));
    return false;
  }
  const SamplingParams& sampling = seq->spec.sampling;
  const std::vector<int>& eos = config_.eos_token_ids;
  // At least min_tokens tokens come before the one that ends the request, whatever ends it
  // but its length (the sampler holds the end tokens back; stop strings do not match yet).
  const bool ready = seq->generated > sampling.min_tokens;
  const bool is_eos =
      ready && !seq->spec.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end();
  const bool is_stop_token = ready && std::binary_search(sampling.stop_token_ids.begin(),
                                                         sampling.stop_token_ids.end(), token);
  // A grammar ends the output once it took an end-of-sequence token, ignore_eos or not.
  const bool grammar_done = seq->sampler->constraint_terminated();
  OutputText::Update update;
  // An ending token's text is left out unless include_stop_str_in_output (vLLM's rule).
  if (!(is_eos || is_stop_token || grammar_done) || sampling.include_stop_str_in_output) {
    update = seq->text->Add(token, ready);
  }
  const bool ends_on_token = is_eos || is_stop_token || grammar_done;
  const bool at_length = seq->generated >= seq->spec.max_new_tokens;
  if (!update.stopped && (ends_on_token || at_length)) update.text += seq->text->Flush();
  Post([sink = seq->sink, token, text = std::move(update.text), logprobs = std::move(logprobs),
        with_logprob = seq->spec.logprobs] {
    if (with_logprob) sink->OnLogprobs({logprobs});
    sink->OnTokens({token}, text);
  });
  if (update.stopped || is_stop_token || (grammar_done && !is_eos)) {
    Finish(seq, FinishReason::kStop);
  } else if (is_eos) {
    Finish(seq, FinishReason::kEos);
  } else if (at_length) {
    Finish(seq, FinishReason::kLength);
  } else {
    return true;
  }
  return false;
}

void Scheduler::Finish(Sequence* seq, FinishReason reason, const absl::Status& status) {
  if (seq->has_kv) kv_.Release(seq->kv_seq);
  seq->has_kv = false;
  FinishUnforked(seq, reason, status);
  if (options_.speculation.draft_model != nullptr) {
    options_.speculation.draft_model->Forget(seq->ticket);
  }
  RequestUsage usage;
  usage.prompt_tokens = static_cast<int>(seq->spec.prompt.size());
  usage.completion_tokens = seq->generated;
  double decode_ms = 0;
  if (seq->generated > 0) {
    usage.time_to_first_token_ms = MillisBetween(seq->submitted, seq->first_token);
    decode_ms = MillisBetween(seq->first_token, seq->last_token);
    if (seq->generated > 1 && decode_ms > 0) {
      usage.decode_tokens_per_second = (seq->generated - 1) * 1000.0 / decode_ms;
    }
  }
  Report(*seq, reason, usage, decode_ms);
  Post([sink = seq->sink, reason, usage, status] { sink->OnFinish(reason, usage, status); });
  auto it =
      std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  if (it != running_.end()) running_.erase(it);
  running_count_.store(static_cast<int>(running_.size()));
}

void Scheduler::Report(const Sequence& seq, FinishReason reason, const RequestUsage& usage,
                       double decode_ms) {
  // A request's prompt counts once, with its first sample.
  RequestUsage counted = usage;
  if (seq.sample > 0) counted.prompt_tokens = 0;
  metrics_.Record(counted, decode_ms);
  if (!LogEnabled(LogLevel::kInfo)) return;
  std::string id = seq.spec.id.empty() ? absl::StrCat("#", seq.request) : seq.spec.id;
  if (seq.spec.n > 1) absl::StrAppend(&id, " sample ", seq.sample);
  Log(LogLevel::kInfo, FinishedRequestLine(id, reason, usage));
}

}  // namespace strata
