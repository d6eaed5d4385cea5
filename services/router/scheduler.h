// Continuous batching: requests join and leave the running batch between forward steps;
// prompts are prefilled in chunks under a per-step token budget; when the paged KV cache runs
// out of blocks the newest running request is preempted and later recomputed, never failed.
#ifndef STRATA_SERVICES_ROUTER_SCHEDULER_H_
#define STRATA_SERVICES_ROUTER_SCHEDULER_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/step_runner.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/request.h"
#include "services/router/request_metrics.h"
#include "services/router/speculation.h"

namespace strata {

// Bounds of a request's stop strings (each new token is checked against every one).
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 1024;

struct SchedulerOptions {
  int max_batch_tokens = 512;      // tokens per forward step: decodes plus prefill chunks
  int max_running = 64;            // sequences in the running batch
  int max_queued_requests = 256;   // waiting requests beyond this are refused
  int64_t max_context_tokens = 0;  // 0: the model's context, bounded by the KV pool
  // Runs first on the engine thread (a GPU router makes its device current there).
  std::function<void()> on_engine_thread = nullptr;
  // While a decode step runs, the next one of the same batch is asked for behind it
  // (StepPlan::launch_next: with decode graphs, its tokens the ones the first picked on the
  // GPU), so that the GPU does not wait for the host between steps. Only when every row's
  // token is picked there (no logprobs, and at most kMaxDeviceTransformTokens tokens for its
  // penalties and bias), none reaches its token limit at the first step and no request waits; a row
  // that ends at the first step (end of sequence, a stop string, a cancel) costs its row of the
  // second.
  bool overlap_decode_steps = true;
  // Prompt-lookup speculation (off unless max_draft_tokens > 0): greedy and sampled decode
  // rows without logprobs draft tokens, verified in the step (exact for sampling).
  SpeculationOptions speculation;
};

class Scheduler {
 public:
  using Ticket = uint64_t;

  // `runner`, `kv` and `tokenizer` (may be null) must outlive the scheduler. The scheduler is
  // policy only: what runs in each step; `runner` runs it.
  Scheduler(const ModelConfig& config, StepRunner& runner, PagedKvCache& kv,
            const Tokenizer* tokenizer, SchedulerOptions options);
  ~Scheduler();

  // Starts the engine thread.
  void Start();

  // Validates and queues a request: INVALID_ARGUMENT for bad input, RESOURCE_EXHAUSTED when
  // the queue is full, UNAVAILABLE while draining. `sinks` receive the output of the request's
  // samples, one each (spec.n of them).
  absl::StatusOr<Ticket> Submit(RequestSpec spec, std::vector<std::shared_ptr<ResponseSink>> sinks);
  absl::StatusOr<Ticket> Submit(RequestSpec spec, std::shared_ptr<ResponseSink> sink) {
    return Submit(std::move(spec), std::vector<std::shared_ptr<ResponseSink>>{std::move(sink)});
  }
  // Ends a request, every sample of it (their sinks get kCancelled), and frees its KV blocks.
  void Cancel(Ticket ticket);
  // Refuses new requests, waits up to `timeout` for those in flight, then cancels the rest.
  // True when everything finished in time.
  bool Drain(absl::Duration timeout);

  int64_t max_context_tokens() const { return max_context_tokens_; }
  // INVALID_ARGUMENT when a text of `bytes` bytes is sure to encode to more tokens than fit
  // (Tokenizer::MinTokens; a prompt must leave room for one new token): what the front ends
  // ask before they pay for tokenizing it. OK without a tokenizer.
  absl::Status CheckTextFits(absl::string_view what, size_t bytes, bool prompt) const;
  // Token slots in the KV pool, and its blocks.
  int64_t kv_pool_tokens() const { return kv_.pool_tokens(); }
  int kv_pool_blocks() const { return kv_pool_blocks_.load(); }
  // Blocks the pool has beyond those it started with: memory the workers lent (KvLending); the
  // pool grows past its start only so.
  int kv_borrowed_blocks() const { return std::max(0, kv_pool_blocks_.load() - start_blocks_); }

  // Resizes the KV pool between steps (PagedKvCache::Resize: shrinking moves the blocks in use
  // below the new end). FAILED_PRECONDITION for a pool too small for one sequence of the
  // longest context, or for the blocks in use. `done` runs on the engine thread.
  struct KvResize {
    int blocks = 0;  // the pool's now
    int64_t moved_blocks = 0;
    double millis = 0;  // the engine thread's time on it (device copies go with the next step)
  };
  void ResizeKv(int blocks, std::function<void(absl::StatusOr<KvResize>)> done);
  struct Stats {
    int waiting = 0;
    int running = 0;
    int free_kv_blocks = 0;
    int64_t steps = 0;
    int64_t preemptions = 0;
    int64_t graph_steps = 0;       // steps run by CUDA graph replay
    int64_t overlapped_steps = 0;  // of those, launched before the step before them was read
    double graph_replay_us = 0;    // mean; DecodeGraphs::Timing
    double graph_between_us = 0;   // mean
    int64_t steps_ahead = 0;       // steps asked for behind the one before (launch_next)
    ReplayOrEager::Counts replay_or_eager;
    // Prompt positions whose keys and values steps computed: a prompt's prefill once for all
    // its samples, not its cached prefix; again after a preemption.
    int64_t prompt_tokens_computed = 0;
    // Prefix caching: prompt tokens looked up, and found with their keys and values cached.
    int64_t prefix_queried_tokens = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t prefix_cached_blocks = 0;
    // Speculation: tokens drafted, those accepted, steps that verified drafts, and how often
    // drafting was turned off for not paying.
    int64_t draft_tokens = 0;
    int64_t accepted_draft_tokens = 0;
    int64_t draft_steps = 0;
    int64_t speculation_turned_off = 0;
    bool kv_scales_ready = false;  // an FP8 cache's scales are set
  };
  Stats stats() const;
  // Finished requests' totals (any thread).
  const RequestMetrics& metrics() const { return metrics_; }

 private:
  struct Sequence;

  void Loop();
  // One forward step over the running batch (PlanStep, ReserveKv, LayOut, the run,
  // TakeResults); false when there was nothing to run.
  bool Step();
  // A running sequence's share of a step.
  struct Planned {
    Sequence* seq;
    int64_t count;               // positions computed this step (with the draft's)
    std::vector<int32_t> draft;  // a decode row's drafted tokens, after its own
  };
  // The step's rows within max_batch_tokens: decodes first (one token each and their drafts,
  // latency-critical), then prefill chunks in admission order.
  std::vector<Planned> PlanStep();
  // Reserves the plan's KV; when the pool is short (decodes outgrew it), preempts the latest
  // arrivals (out of the plan too), or ends a lone sequence the pool cannot grow for.
  void ReserveKv(std::vector<Planned>& plan);
  // Which logit rows a step's sequences get: its sampled rows first (one each, more with a
  // draft), then the prompt positions that give scores.
  struct StepLayout {
    struct ScoreRow {
      Sequence* seq;
      int32_t target;  // the token whose log-probability the row gives
    };
    StepPlan step;
    std::vector<Sequence*> sampled;
    std::vector<int64_t> first_row;                   // sampled[r]'s first logit row
    std::vector<const std::vector<int32_t>*> drafts;  // sampled[r]'s draft
    std::vector<bool> on_device;  // sampled[r]'s token is picked on the device after a replay
    int64_t sampled_rows = 0;
    std::vector<ScoreRow> scored;  // the rows after the sampled ones
  };
  StepLayout LayOut(const std::vector<Planned>& plan);
  // After the run: positions computed, scores kept (and sent once a prompt is done), tokens
  // taken (drafts verified), and whether drafting paid in this step.
  void TakeResults(const std::vector<Planned>& plan, const StepLayout& layout,
                   const StepResult& result, double seconds);
  // A decode step in flight: its rows (running_ at launch) and the position each computes.
  struct LaunchedRows {
    std::vector<Sequence*> rows;
    std::vector<Ticket> tickets;  // a row whose sequence ended is not the same ticket's
    std::vector<int64_t> positions;
  };
  // Whether the decode step behind `in_flight` (the same rows one position on, their tokens
  // the ones `in_flight` picks on the device; SchedulerOptions::overlap_decode_steps) may be asked
  // for: the batch qualifies and every row's next position is reserved (never by a preemption).
  // `sampling` (may be null) gets the rows' RowSampling for that step, empty when every row
  // takes the arg-max of untransformed logits.
  bool ReserveAhead(const LaunchedRows& in_flight, std::vector<RowSampling>* sampling = nullptr);
  // Whether any step may be launched ahead now: the option is on and no request waits (one
  // that waits is admitted at the next step instead).
  bool MayLaunchAhead() const;
  // The step after one whose tokens came from a launch ahead: reads it, asking for the next
  // one behind it first when it can.
  bool StepAhead();
  // The outbox goes out while the GPU runs a step.
  void WhileRunning() { FlushOutbox(); }
  void Admit();
  // Frees a running sequence's blocks and puts it back at the head of the queue.
  void Preempt(Sequence* seq);
  void Finish(Sequence* seq, FinishReason reason, const absl::Status& status = absl::OkStatus());
  // Counts a finished request and logs its line (info); `decode_ms`: first token to last.
  void Report(const Sequence& seq, FinishReason reason, const RequestUsage& usage,
              double decode_ms);
  // `logprobs`: the token's log-probabilities, for a sequence that asked for them. False when
  // the token ended the sequence (then freed: `seq` must not be used again).
  bool HandleToken(Sequence* seq, int32_t token, TokenLogprobs logprobs = {});
  // A request's prompt is computed: its other samples fork off `parent` (RequestSpec::n), each
  // sharing its KV blocks and drawing its first token from the prompt's last `logits` row.
  void ForkSamples(Sequence* parent, const float* logits);
  // The samples of a request that ends before its prompt is computed end with it.
  void FinishUnforked(Sequence* seq, FinishReason reason, const absl::Status& status);
  // Whether the sequence's prompt positions give scores (score_only, or prompt_logprobs not
  // yet sent: a preempted sequence does not score its prompt again).
  static bool WantsScores(const Sequence& seq);
  // A decode row's draft for this step (empty: none), at most `room` tokens.
  std::vector<int32_t> Draft(const Sequence& seq, int64_t room) const;
  // Verifies `draft` against the logit rows from `first_row` (one more than the draft) and
  // hands out the tokens that stand; returns them.
  int64_t VerifyDraft(Sequence* seq, const StepResult& result, int64_t first_row,
                      const std::vector<int32_t>& draft);
  // `count` more of the sequence's tokens have their keys and values in the cache.
  void Computed(Sequence* seq, int64_t count);
  void ApplyCancellations();
  // How a cancelled request ends: OK when its client cancelled it, UNAVAILABLE once the
  // server cut it off at a stop.
  absl::Status CutOffStatus() const;
  // A resize asked for, once nothing is in flight.
  void ApplyKvResize();
  // What goes to the clients (tokens, scores, finishes) waits in the outbox, in order, until
  // the next step's GPU work is under way: a streamed write can cost the GPU more idle time
  // than the step's own host work. Flushed during the next replay, before an eager step, and
  // whenever no step follows at once.
  void Post(std::function<void()> send);
  void FlushOutbox();
  void NotifyIdle();

  const ModelConfig& config_;
  StepRunner& runner_;
  PagedKvCache& kv_;
  const Tokenizer* tokenizer_;
  SchedulerOptions options_;
  int64_t max_context_tokens_ = 0;

  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  struct PendingResize {
    int blocks;
    std::function<void(absl::StatusOr<KvResize>)> done;
  };
  std::optional<PendingResize> kv_resize_;  // under mu_
  std::atomic<bool> kv_resize_pending_{false};
  int start_blocks_ = 0;  // the pool's at start
  // A sequence running alone that the pool cannot hold preempts itself and comes back, until
  // the pool grows (memory lent to it) or this many times at one pool size.
  static constexpr int kMaxLoneStalls = 64;
  bool LoneSequenceStalled(Ticket ticket);
  int lone_stalls_ = 0;
  Ticket stall_ticket_ = 0;
  int stall_pool_blocks_ = -1;
  std::atomic<int> kv_pool_blocks_{0};
  absl::flat_hash_set<Ticket> cancelled_;
  bool stopping_ = false;
  bool draining_ = false;
  Ticket next_ticket_ = 1;
  std::atomic<int> queued_{0};  // incoming plus waiting
  // Drain ran out of time: what is cancelled now is cut off, not cancelled by its client.
  std::atomic<bool> cut_off_{false};
  std::atomic<int> running_count_{0};
  std::atomic<int64_t> preemptions_{0};
  std::atomic<int64_t> steps_ahead_{0};
  SpeculationControl speculation_{SpeculationOptions{}};  // set from options_ at construction
  std::atomic<int64_t> draft_tokens_{0}, accepted_draft_tokens_{0}, draft_steps_{0};
  std::atomic<int64_t> speculation_turned_off_{0};
  std::atomic<bool> kv_scales_ready_{false};
  std::atomic<int> free_kv_blocks_{0};  // as of the engine thread's last step
  std::atomic<int64_t> prompt_tokens_computed_{0};
  std::atomic<int64_t> prefix_queried_tokens_{0};
  std::atomic<int64_t> prefix_hit_tokens_{0};
  std::atomic<int64_t> prefix_cached_blocks_{0};
  RequestMetrics metrics_;
  std::atomic<int> unsent_{0};  // outbox entries: idle only once they are out too
  std::condition_variable idle_cv_;

  // Owned by the engine thread.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  std::vector<std::function<void()>> outbox_;
  std::optional<LaunchedRows> ahead_;  // a decode step launched ahead, not yet read
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_SCHEDULER_H_
