#include "common/engine/step_runner.h"

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backend/graph_step.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

// An expert backend may lose a step's work after answering (a worker died with it queued):
// the step runs again this many times before it fails.
constexpr int kAbortedRetries = 2;

class ForwardStepRunner : public StepRunner {
 public:
  ForwardStepRunner(const ModelConfig& config, RouterBackend& router, ExpertBackend& experts,
                    PagedKvCache& kv, StepRunnerOptions options)
      : config_(config),
        kv_(kv),
        router_(router),
        forward_(config, router, experts, options.forward),
        replay_or_eager_(options.replay_or_eager) {
    gpu::DeviceRouter* device = router.device_router();
    graph_steps_experts_ = experts.graph_steps();
    if (options.cuda_graphs && device != nullptr && graph_steps_experts_ != nullptr) {
      graphs_ = std::make_unique<DecodeGraphs>(forward_, *device, experts, *graph_steps_experts_,
                                               kv, options.graphs);
    }
  }

  ~ForwardStepRunner() override { Abandon(); }

  absl::StatusOr<StepResult> Run(const StepPlan& plan,
                                 absl::FunctionRef<void()> while_running) override {
    if (in_flight()) {
      return absl::FailedPreconditionError("step runner: a step launched ahead is not collected");
    }
    steps_.fetch_add(1, std::memory_order_relaxed);
    const bool fits = graphs_ != nullptr && graphs_->Fits(plan.batch, plan.logit_rows);
    const int64_t tokens = plan.batch.num_tokens();
    const bool decided_eager = std::exchange(eager_next_tokens_, std::nullopt) == tokens;
    if (fits && !decided_eager && ChooseReplay(tokens)) {
      absl::StatusOr<StepResult> replayed = Replay(plan, while_running);
      if (replayed.ok()) {
        graph_steps_.fetch_add(1, std::memory_order_relaxed);
        replay_or_eager_.Ended(true, tokens, true, ReplayOrEager::Clock::now());
        return replayed;
      }
      // The step runs eagerly instead (rewriting whatever keys and values the replay wrote);
      // a worker that died is rerouted there.
      const bool off = graphs_->failures() >= DecodeGraphs::kMaxFailures;
      Log(LogLevel::kWarning,
          absl::StrCat("decode graph step failed (", replayed.status().message(),
                       off ? "); CUDA graphs off until the workers change"
                           : "); running it without the graph"));
    }
    absl::StatusOr<StepResult> eager = RunEagerly(plan, while_running);
    replay_or_eager_.Ended(fits && eager.ok(), tokens, false, ReplayOrEager::Clock::now());
    return eager;
  }

  absl::StatusOr<StepResult> Collect(bool launch_next, absl::Span<const RowSampling> next_sampling,
                                     absl::FunctionRef<void()> while_running) override {
    if (!in_flight()) return absl::FailedPreconditionError("step runner: no step to collect");
    StepResult result;
    if (launch_next) {
      ASSIGN_OR_RETURN(result.next_in_flight, LaunchNext(next_sampling));
    }
    while_running();
    ASSIGN_OR_RETURN(const int32_t* tokens, graphs_->Wait());
    steps_.fetch_add(1, std::memory_order_relaxed);
    graph_steps_.fetch_add(1, std::memory_order_relaxed);
    // Launched ahead, a replay keeps the rows of the one before it.
    replay_or_eager_.Ended(true, last_launched_.num_tokens(), true, ReplayOrEager::Clock::now());
    result.tokens = tokens;
    result.replayed = true;
    result.vocab = config_.vocab_size;
    return result;
  }

  bool in_flight() const override { return graphs_ != nullptr && graphs_->in_flight() > 0; }

  void Abandon() override {
    while (in_flight()) graphs_->Wait().IgnoreError();
  }

  int64_t graph_context() const override { return graphs_ != nullptr ? graphs_->max_context() : 0; }

  StepRunnerStats stats() const override {
    StepRunnerStats s;
    s.steps = steps_.load(std::memory_order_relaxed);
    s.graph_steps = graph_steps_.load(std::memory_order_relaxed);
    if (graphs_ != nullptr) s.graph_timing = graphs_->timing();
    s.replay_or_eager = replay_or_eager_.counts();
    return s;
  }

  RouterBackend::PredictionCounts prefetch() const override { return forward_.prefetch(); }
  absl::StatusOr<int64_t> ResizeKv(PagedKvCache& kv, int blocks) override {
    if (in_flight()) return absl::FailedPreconditionError("step runner: a step is in flight");
    return router_.ResizeKv(kv, blocks);
  }

 private:
  absl::StatusOr<StepResult> Replay(const StepPlan& plan, absl::FunctionRef<void()> while_running) {
    // A capture takes a while: what the caller has waiting goes first.
    if (graphs_->NeedsCapture(plan.batch.num_tokens())) while_running();
    RETURN_IF_ERROR(graphs_->Launch(plan.ids, plan.batch, plan.sampling));
    last_launched_ = plan.batch;
    last_sampling_ = plan.sampling;
    StepResult result;
    if (plan.launch_next && plan.host_rows.empty()) {
      ASSIGN_OR_RETURN(result.next_in_flight, LaunchNext({}));
    }
    while_running();
    ASSIGN_OR_RETURN(result.tokens, graphs_->Wait());
    result.replayed = true;
    result.vocab = config_.vocab_size;
    if (!plan.host_rows.empty()) {
      ASSIGN_OR_RETURN(result.logits_base, graphs_->Logits(plan.host_rows));
    }
    return result;
  }

  // Launches the step after the newest one in flight, its rows one position on, picked as
  // `sampling` says (empty: as the last, one step on); false when it does not fit a graph. An
  // error fails every step in flight.
  absl::StatusOr<bool> LaunchNext(absl::Span<const RowSampling> sampling) {
    BatchLayout next = last_launched_;
    for (int64_t& p : next.position) ++p;
    rows_.resize(next.position.size());
    for (size_t i = 0; i < rows_.size(); ++i) rows_[i] = static_cast<int64_t>(i);
    if (!graphs_->Fits(next, rows_)) return false;
    // The next step is decided here; Run takes the decision when it did not launch.
    if (!ChooseReplay(next.num_tokens())) {
      eager_next_tokens_ = next.num_tokens();
      return false;
    }
    previous_tokens_.assign(rows_.size(), kTokenOfPreviousStep);
    if (sampling.empty()) {
      for (RowSampling& row : last_sampling_) ++row.step;  // each row's next token
    } else {
      last_sampling_.assign(sampling.begin(), sampling.end());
    }
    RETURN_IF_ERROR(graphs_->Launch(previous_tokens_, next, last_sampling_));
    last_launched_ = std::move(next);
    return true;
  }

  bool ChooseReplay(int64_t tokens) {
    return replay_or_eager_.Replay(tokens,
                                   [this] { return graph_steps_experts_->missed_expert_bytes(); });
  }

  absl::StatusOr<StepResult> RunEagerly(const StepPlan& plan,
                                        absl::FunctionRef<void()> while_running) {
    while_running();  // before the step's host work
    if (graphs_ != nullptr) graphs_->NoteEagerStep();
    absl::Status status = forward_.Run(plan.ids, plan.batch, kv_, plan.logit_rows, logits_);
    for (int retry = 0; retry < kAbortedRetries && absl::IsAborted(status); ++retry) {
      status = forward_.Run(plan.ids, plan.batch, kv_, plan.logit_rows, logits_);
    }
    if (absl::IsAborted(status)) return absl::UnavailableError(status.message());
    RETURN_IF_ERROR(status);
    StepResult result;
    result.logits_base = logits_.data();
    result.vocab = config_.vocab_size;
    return result;
  }

  const ModelConfig& config_;
  PagedKvCache& kv_;
  RouterBackend& router_;
  ForwardPass forward_;
  GraphStepExperts* graph_steps_experts_ = nullptr;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step eager
  ReplayOrEager replay_or_eager_;
  // The tokens of the decode step LaunchNext decided to run eagerly, for the Run that comes
  // for it.
  std::optional<int64_t> eager_next_tokens_;
  Tensor logits_;
  BatchLayout last_launched_;               // the newest replay launched
  std::vector<RowSampling> last_sampling_;  // and its rows' sampling
  std::vector<int64_t> rows_;
  std::vector<int32_t> previous_tokens_;
  std::atomic<int64_t> steps_{0}, graph_steps_{0};
};

}  // namespace

std::unique_ptr<StepRunner> CreateStepRunner(const ModelConfig& config, RouterBackend& router,
                                             ExpertBackend& experts, PagedKvCache& kv,
                                             StepRunnerOptions options) {
  return std::make_unique<ForwardStepRunner>(config, router, experts, kv, std::move(options));
}

}  // namespace strata
