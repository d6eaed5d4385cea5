// A StepRunner without a model, for testing what plans the steps: each row's next token is a
// fixed function of the row's token and position (NextToken), or with a `script` the script's
// tokens in turn for every request and then the end of sequence, given as greedy tokens, as
// logits peaked at it (RowLogit), or both. With `replays` on it behaves like decode-graph replays:
// a decode-only step with launch_next leaves the next step in flight for Collect. It checks what a
// real runner relies on (every position reserved in the KV cache, Run never with a step in flight)
// and can be told to fail a Run or a Collect.
#ifndef STRATA_TESTS_TESTING_FAKE_STEP_RUNNER_H_
#define STRATA_TESTS_TESTING_FAKE_STEP_RUNNER_H_

#include <algorithm>
#include <atomic>
#include <map>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "common/engine/step_runner.h"
#include "common/model/model_config.h"

namespace strata::testing {

// The smallest model the scheduler accepts beside a FakeStepRunner: one layer, one head of one
// dimension, token 0 the end of sequence.
inline ModelConfig FakeConfig(int64_t vocab) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 1;
  c.max_position_embeddings = 4096;
  c.eos_token_ids = {0};
  return c;
}

class FakeStepRunner : public StepRunner {
 public:
  FakeStepRunner(PagedKvCache& kv, int64_t vocab) : kv_(kv), vocab_(vocab) {}

  static int32_t NextToken(int32_t token, int64_t position, int64_t vocab) {
    return static_cast<int32_t>((int64_t{token} * 31 + position * 7 + 1) % vocab);
  }

  // A logit row peaked at `next` (20): flat at 0 below it, or with `shaped_logits` a pattern
  // of many ties (RowLogit), for log-probabilities worth checking.
  static float RowLogit(int32_t next, int64_t id, bool shaped, bool flat = false) {
    if (flat) return 0.0f;
    if (id == next) return 20.0f;
    return shaped ? static_cast<float>((id * 5 + next) % 9) * 0.75f - 3.0f : 0.0f;
  }

  // Decode-only steps that ask for it get the next step launched behind them.
  bool replays = false;
  bool shaped_logits = false;
  // Every logit 0: a sampled token is the draw alone (greedy ones the lowest id).
  bool flat_logits = false;
  // How long each Run takes: requests that stay under way long enough to be cancelled.
  std::chrono::milliseconds run_time{0};
  // The Run / Collect calls (counted from 1) that fail; 0: none.
  int fail_run_call = 0;
  int fail_collect_call = 0;

  // Every request's reply: these tokens, then token 0 (FakeConfig's end of sequence). Eager
  // steps only (not with `replays`). A request's first logit row is told from a decode row by
  // its position: not the one after its sequence slot's last logit row, or not alone in the
  // step (a prefill's last chunk).
  void SetScript(std::vector<int32_t> script) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(script);
  }

  absl::StatusOr<StepResult> Run(const StepPlan& plan,
                                 absl::FunctionRef<void()> while_running) override {
    std::this_thread::sleep_for(run_time);
    std::lock_guard<std::mutex> lock(mu_);
    ++runs_;
    plans_.push_back(plan);
    max_blocks_in_use_ = std::max(max_blocks_in_use_, kv_.blocks_in_use());
    if (!pending_.empty()) return Violation("Run with a step in flight");
    for (int64_t i = 0; i < plan.batch.num_tokens(); ++i) {
      if (plan.batch.position[i] >= kv_.capacity(plan.batch.sequence[i])) {
        return Violation("a step's position is not reserved");
      }
    }
    while_running();
    if (runs_ == fail_run_call) return absl::InternalError("injected step failure");
    std::vector<int32_t> tokens;
    for (int64_t row : plan.logit_rows) {
      tokens.push_back(script_.empty() ? NextToken(plan.ids[row], plan.batch.position[row], vocab_)
                                       : ScriptToken(plan, row));
    }
    const bool decode_only = plan.logit_rows.size() == plan.ids.size();
    StepResult result = Answer(tokens, /*replayed=*/replays && decode_only, plan.host_rows);
    if (result.replayed && plan.launch_next && plan.host_rows.empty()) {
      result.next_in_flight = Launch(plan.batch, tokens);
      if (result.next_in_flight && !ReservedOneMore(plan.batch)) {
        return Violation("a step launched ahead has no reserved position");
      }
    }
    return result;
  }

  absl::StatusOr<StepResult> Collect(bool launch_next, absl::Span<const RowSampling> next_sampling,
                                     absl::FunctionRef<void()> while_running) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++collects_;
    if (launch_next) next_samplings_.emplace_back(next_sampling.begin(), next_sampling.end());
    if (pending_.empty()) return Violation("Collect with nothing in flight");
    Pending step = pending_.front();
    pending_.erase(pending_.begin());
    std::vector<int32_t> tokens;
    for (size_t r = 0; r < step.tokens.size(); ++r) {
      tokens.push_back(NextToken(step.tokens[r], step.batch.position[r], vocab_));
    }
    StepResult result = Answer(tokens, /*replayed=*/true, {});
    if (launch_next) {
      result.next_in_flight = Launch(step.batch, tokens);
      if (!ReservedOneMore(step.batch)) return Violation("a step launched ahead is unreserved");
    }
    while_running();
    if (collects_ == fail_collect_call) {
      pending_.clear();  // every step in flight fails with it
      return absl::UnavailableError("injected failure of a step launched ahead");
    }
    return result;
  }

  bool in_flight() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return !pending_.empty();
  }
  void Abandon() override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();
  }
  int64_t graph_context() const override { return replays ? 1 << 20 : 0; }
  StepRunnerStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    StepRunnerStats s;
    s.steps = runs_ + collects_;
    return s;
  }
  RouterBackend::PredictionCounts prefetch() const override { return {}; }

  std::vector<StepPlan> plans() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_;
  }
  // The most KV blocks sequences held at a Run.
  int64_t max_blocks_in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_blocks_in_use_;
  }
  int collects() const {
    std::lock_guard<std::mutex> lock(mu_);
    return collects_;
  }
  // The rows' sampling each Collect that launched a step ahead was given.
  std::vector<std::vector<RowSampling>> next_samplings() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_samplings_;
  }
  // The first contract violation seen ("" when none).
  std::string violation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violation_;
  }

 private:
  struct Pending {
    BatchLayout batch;
    std::vector<int32_t> tokens;  // each row's input token
  };

  absl::Status Violation(const std::string& what) {
    if (violation_.empty()) violation_ = what;
    return absl::InternalError(what);
  }

  // The script's next token for the sequence of `row`.
  int32_t ScriptToken(const StepPlan& plan, int64_t row) {
    const int64_t slot = plan.batch.sequence[row];
    const int64_t position = plan.batch.position[row];
    const int64_t rows_of_slot = std::count(plan.batch.sequence.begin(), plan.batch.sequence.end(),
                                            plan.batch.sequence[row]);
    ScriptState& state = script_states_[slot];
    if (rows_of_slot > 1 || position != state.next_position) state.next_index = 0;
    state.next_position = position + 1;
    const size_t index = state.next_index++;
    return index < script_.size() ? script_[index] : 0;
  }

  bool ReservedOneMore(const BatchLayout& batch) const {
    for (int64_t i = 0; i < batch.num_tokens(); ++i) {
      if (batch.position[i] + 1 >= kv_.capacity(batch.sequence[i])) return false;
    }
    return true;
  }

  bool Launch(const BatchLayout& batch, const std::vector<int32_t>& tokens) {
    Pending next;
    next.batch = batch;
    for (int64_t& p : next.batch.position) ++p;
    next.tokens = tokens;
    pending_.push_back(std::move(next));
    return true;
  }

  // Greedy tokens (replays), logits peaked at each row's token (eager steps: every row;
  // replays: the host rows).
  StepResult Answer(const std::vector<int32_t>& tokens, bool replayed,
                    const std::vector<int64_t>& host_rows) {
    StepResult result;
    result.replayed = replayed;
    result.vocab = vocab_;
    greedy_ = tokens;
    logits_.assign(tokens.size() * vocab_, 0.0f);
    for (size_t r = 0; r < tokens.size(); ++r) {
      const bool wanted = !replayed || std::find(host_rows.begin(), host_rows.end(),
                                                 static_cast<int64_t>(r)) != host_rows.end();
      if (!wanted) continue;
      for (int64_t id = 0; id < vocab_; ++id) {
        logits_[r * vocab_ + id] = RowLogit(tokens[r], id, shaped_logits, flat_logits);
      }
    }
    result.logits_base = logits_.data();
    if (replayed) result.tokens = greedy_.data();
    return result;
  }

  PagedKvCache& kv_;
  const int64_t vocab_;
  mutable std::mutex mu_;
  int runs_ = 0;
  int collects_ = 0;
  int64_t max_blocks_in_use_ = 0;
  std::vector<StepPlan> plans_;
  std::vector<Pending> pending_;
  std::vector<int32_t> greedy_;
  std::vector<float> logits_;
  std::vector<std::vector<RowSampling>> next_samplings_;
  std::string violation_;
  struct ScriptState {
    int64_t next_position = -1;  // a decode row of the same request comes here
    size_t next_index = 0;
  };
  std::vector<int32_t> script_;
  std::map<int64_t, ScriptState> script_states_;  // by sequence slot
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_FAKE_STEP_RUNNER_H_
