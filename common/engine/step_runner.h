// One forward step at a time for whoever plans the steps (the router's Scheduler, LocalEngine):
// eagerly through ForwardPass, or by CUDA graph replay (DecodeGraphs) when the step fits a
// graph, with the next decode step launched behind it when the caller asks, so that the
// GPU goes from one step to the next without waiting for the host. Where tiered workers miss
// much, a decode step that fits a graph may run eagerly instead, timed against replays
// (ReplayOrEager). Failed replays and aborted
// steps run again eagerly here: the caller sees one answer per step, and plans only.
#ifndef STRATA_COMMON_ENGINE_STEP_RUNNER_H_
#define STRATA_COMMON_ENGINE_STEP_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/engine/decode_graphs.h"
#include "common/engine/forward_pass.h"
#include "common/engine/replay_or_eager.h"
#include "common/kv/paged_kv_cache.h"

namespace strata {

struct StepPlan {
  std::vector<int32_t> ids;
  BatchLayout batch;                // every token's KV position reserved by the caller
  std::vector<int64_t> logit_rows;  // the rows whose logits (or tokens) come back
  // Indexes into logit_rows whose logits the caller reads (sampling on the host, scoring); the
  // other rows need only their token. An eager step brings every row's.
  std::vector<int64_t> host_rows;
  // Per logit row, how a replay picks its token on the device (temperature 0 and no
  // transforms: the arg-max), or empty: every row's arg-max. The step launched behind this one
  // picks each row's next token with the same settings, one step on.
  std::vector<RowSampling> sampling;
  // The step after this one (the same rows one position on, each row's token the one this step
  // picked on the device) is wanted behind it, launched before this one is read: the caller
  // has reserved that position for every row. Honoured only when this step replays a graph
  // with no host_rows; StepResult::next_in_flight says whether it was.
  bool launch_next = false;
};

struct StepResult {
  // Per logit row, the token picked on the device after a replay (the arg-max of its logits,
  // first on ties, or the draw StepPlan::sampling asked for); null after an eager step, whose
  // logits give every row.
  const int32_t* tokens = nullptr;
  // Row r's logits [vocab]: every row after an eager step, the plan's host_rows after a
  // replay. Valid until the next call.
  const float* logits(int64_t r) const { return logits_base + r * vocab; }
  const float* logits_base = nullptr;
  int64_t vocab = 0;
  bool replayed = false;
  // The step launch_next asked for is in flight: Collect returns it.
  bool next_in_flight = false;
};

// Where the steps went (safe to read from any thread).
struct StepRunnerStats {
  int64_t steps = 0;
  int64_t graph_steps = 0;  // replayed, not run eagerly
  DecodeGraphs::Timing graph_timing;
  // Decode steps that fit a graph timed eagerly against replays (ReplayOrEager).
  ReplayOrEager::Counts replay_or_eager;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Runs `plan` to the end (nothing else may be in flight). `while_running` is the caller's
  // host work, done while the GPU is busy with the step, before a slow graph capture, or
  // before an eager step's host work: it may run more than once. An error is the step's (every
  // way of running it failed): its rows' keys and values are to be recomputed.
  virtual absl::StatusOr<StepResult> Run(const StepPlan& plan,
                                         absl::FunctionRef<void()> while_running) = 0;

  // Waits for the step launched behind the last one (StepResult::next_in_flight) and returns
  // its tokens, launching the one after it first when `launch_next` (the caller has
  // reserved its positions; honoured as in Run), its rows picked as `next_sampling` says (as
  // StepPlan::sampling; empty: as the step before, one step on; rows whose transforms touch
  // tokens must come anew, their lists counting what the caller has taken). An error fails
  // every step in flight: nothing is in flight after it, and the rows must run again from what
  // the caller has.
  virtual absl::StatusOr<StepResult> Collect(bool launch_next,
                                             absl::Span<const RowSampling> next_sampling,
                                             absl::FunctionRef<void()> while_running) = 0;

  // Whether a step launched ahead waits to be collected.
  virtual bool in_flight() const = 0;
  // Waits for every step in flight and drops their results.
  virtual void Abandon() = 0;

  // The longest context a replayed step takes (0 without graphs): longer sequences run
  // eagerly, and so does launch_next.
  virtual int64_t graph_context() const = 0;

  virtual StepRunnerStats stats() const = 0;
  virtual RouterBackend::PredictionCounts prefetch() const = 0;

  // Resizes the KV pool and the memory under it (RouterBackend::ResizeKv); nothing may be in
  // flight.
  virtual absl::StatusOr<int64_t> ResizeKv(PagedKvCache& kv, int blocks) {
    return kv.Resize(blocks);
  }
};

struct StepRunnerOptions {
  ForwardOptions forward;
  // Decode steps by CUDA graph replay, when the router backend is on a GPU and the expert
  // backend's work can be captured (else ignored).
  bool cuda_graphs = true;
  DecodeGraphOptions graphs;
  // Which way a decode step that fits a graph runs, where replays read experts from the host.
  ReplayOrEagerOptions replay_or_eager;
};

// A runner over `router` and `experts` (which, with `config` and `kv`, must outlive it).
std::unique_ptr<StepRunner> CreateStepRunner(const ModelConfig& config, RouterBackend& router,
                                             ExpertBackend& experts, PagedKvCache& kv,
                                             StepRunnerOptions options);

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_STEP_RUNNER_H_
