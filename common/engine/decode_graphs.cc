#include "common/engine/decode_graphs.h"

#include <algorithm>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/backend/graph_step.h"
#include "common/util/status_macros.h"
#if STRATA_HAVE_CUDA
#include "common/backend/cuda/device_router.h"
#endif

namespace strata {

DecodeGraphs::DecodeGraphs(ForwardPass& forward, gpu::DeviceRouter& router, ExpertBackend& experts,
                           GraphStepExperts& graph_steps, PagedKvCache& kv,
                           DecodeGraphOptions options)
    : forward_(forward),
      router_(router),
      experts_(experts),
      graph_steps_(graph_steps),
      kv_(kv),
      options_(options) {}

void DecodeGraphs::NoteTiming(const Launched& step, Clock::time_point synced) {
  auto ns = [](Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  };
  replays_.fetch_add(1, std::memory_order_relaxed);
  if (step.overlapped) {
    // Launched before the step before it was read: the GPU went on without waiting; its own
    // time starts when that step's ended.
    const Clock::time_point start = std::max(step.launch_returned, last_synced_);
    replay_ns_.fetch_add(ns(synced - start), std::memory_order_relaxed);
    overlapped_.fetch_add(1, std::memory_order_relaxed);
  } else {
    replay_ns_.fetch_add(ns(synced - step.launch_returned), std::memory_order_relaxed);
    const Clock::duration between = step.launch_returned - last_synced_;
    if (last_synced_ != Clock::time_point{} && between < std::chrono::milliseconds(20)) {
      pairs_.fetch_add(1, std::memory_order_relaxed);
      between_ns_.fetch_add(ns(between), std::memory_order_relaxed);
    }
  }
  last_synced_ = synced;
}

DecodeGraphs::Timing DecodeGraphs::timing() const {
  Timing t;
  t.replays = replays_.load(std::memory_order_relaxed);
  t.replay_us = replay_ns_.load(std::memory_order_relaxed) / 1e3;
  t.overlapped = overlapped_.load(std::memory_order_relaxed);
  t.pairs = pairs_.load(std::memory_order_relaxed);
  t.between_us = between_ns_.load(std::memory_order_relaxed) / 1e3;
  return t;
}

bool DecodeGraphs::Fits(const BatchLayout& batch, absl::Span<const int64_t> logit_rows) const {
#if STRATA_HAVE_CUDA
  const int64_t n = batch.num_tokens();
  if (n < 1 || n > options_.max_sequences || static_cast<int64_t>(logit_rows.size()) != n) {
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (logit_rows[i] != i || batch.position[i] >= options_.max_context) return false;
    for (int64_t j = 0; j < i; ++j) {
      if (batch.sequence[i] == batch.sequence[j]) return false;
    }
  }
  // Last: the expert backend's version is the costliest check (prefill steps never get here).
  const uint64_t version = graph_steps_.graph_version();
  return version != 0 && !(failures_ >= kMaxFailures && version == failed_version_);
#else
  return false;
#endif
}

#if STRATA_HAVE_CUDA

using gpu::DeviceRouter;
static_assert(kTokenOfPreviousStep == DeviceRouter::kPreviousGreedyToken);

struct DecodeGraphs::Graph {
  cudaGraphExec_t exec[DeviceRouter::kInputSlots] = {};  // by input slot
  ~Graph() {
    for (cudaGraphExec_t e : exec) {
      if (e != nullptr) cudaGraphExecDestroy(e);
    }
  }
};

// Recorded behind each slot's launch: Wait synchronizes with its step alone, not with the one
// launched after it.
struct DecodeGraphs::StepEvents {
  cudaEvent_t done[DeviceRouter::kInputSlots] = {};
  ~StepEvents() {
    for (cudaEvent_t e : done) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
};

DecodeGraphs::~DecodeGraphs() {
  // Nothing may run on what is freed next.
  if (!in_flight_.empty()) cudaStreamSynchronize(router_.context()->stream());
}

absl::StatusOr<DecodeGraphs::Graph*> DecodeGraphs::Capture(absl::Span<const int32_t> ids,
                                                           const BatchLayout& batch) {
  const int n = static_cast<int>(batch.num_tokens());
  if (!prepared_) {
    RETURN_IF_ERROR(router_.PrepareGraphs(options_.max_context, options_.max_sequences));
    auto events = std::make_unique<StepEvents>();
    for (cudaEvent_t& e : events->done) {
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return absl::InternalError("cannot create a decode step's event");
      }
    }
    events_ = std::move(events);
    prepared_ = true;
  }
  std::vector<int64_t> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = i;
  cudaStream_t stream = router_.context()->stream();
  auto owned = std::make_unique<Graph>();
  for (int slot = 0; slot < DeviceRouter::kInputSlots; ++slot) {
    RETURN_IF_ERROR(router_.EnterGraphMode(n, slot));
    absl::Cleanup leave = [&] { router_.LeaveGraphMode(); };
    graph_steps_.SetGraphCapture(true);
    absl::Cleanup captured_experts = [&] { graph_steps_.SetGraphCapture(false); };
    // The host code runs once and the device work is recorded; the replay that follows is the
    // step itself.
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError("cannot begin capturing a decode graph");
    }
    Tensor unused;
    const absl::Status captured = forward_.Run(ids, batch, kv_, rows, unused);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    absl::Cleanup destroy = [&] {
      if (graph != nullptr) cudaGraphDestroy(graph);
    };
    if (!captured.ok()) {
      cudaGetLastError();
      return captured;
    }
    if (ended != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("decode graph capture: ", cudaGetErrorString(ended)));
    }
    const cudaError_t made = cudaGraphInstantiate(&owned->exec[slot], graph, 0);
    if (made != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("decode graph: ", cudaGetErrorString(made)));
    }
  }
  Graph* raw = owned.get();
  graphs_[n] = std::move(owned);
  return raw;
}

absl::Status DecodeGraphs::CheckFollows(absl::Span<const int32_t> ids,
                                        const BatchLayout& batch) const {
  const Launched& before = in_flight_.back();
  const size_t n = static_cast<size_t>(batch.num_tokens());
  bool follows = n == before.sequences.size();
  for (size_t i = 0; follows && i < n; ++i) {
    follows =
        batch.sequence[i] == before.sequences[i] && batch.position[i] == before.positions[i] + 1;
  }
  if (!follows) {
    return absl::FailedPreconditionError(
        "decode graph: a step launched behind another must run its rows one position on");
  }
  return absl::OkStatus();
}

absl::Status DecodeGraphs::Launch(absl::Span<const int32_t> ids, const BatchLayout& batch,
                                  absl::Span<const RowSampling> sampling) {
  last_rows_ = 0;
  const int n = static_cast<int>(batch.num_tokens());
  if (static_cast<int>(ids.size()) != n) {
    return FailInFlight(absl::InvalidArgumentError("decode graph: ids do not match the batch"));
  }
  if (in_flight_.size() >= DeviceRouter::kInputSlots) {
    return FailInFlight(absl::FailedPreconditionError("decode graph: two steps already in flight"));
  }
  const bool overlapped = !in_flight_.empty();
  if (overlapped) {
    RETURN_IF_ERROR(FailInFlight(CheckFollows(ids, batch)));
  } else if (std::find(ids.begin(), ids.end(), kTokenOfPreviousStep) != ids.end()) {
    return FailInFlight(absl::InvalidArgumentError(
        "decode graph: a token of the previous step, with no step in flight"));
  }
  const uint64_t version = graph_steps_.graph_version();
  if (version != version_) {
    if (overlapped) {
      return FailInFlight(absl::UnavailableError(
          "decode graph: the expert backend changed under a step in flight"));
    }
    graphs_.clear();  // captured against experts that changed since
    version_ = version;
  }
  Graph* graph = nullptr;
  if (auto it = graphs_.find(n); it != graphs_.end()) {
    graph = it->second.get();
  } else if (overlapped) {
    return FailInFlight(absl::FailedPreconditionError("decode graph: none for a step in flight"));
  } else {
    absl::StatusOr<Graph*> captured = Capture(ids, batch);
    if (!captured.ok()) return FailInFlight(captured.status());
    graph = *captured;
  }
  return LaunchReplay(*graph, ids, batch, sampling, overlapped);
}

absl::Status DecodeGraphs::LaunchReplay(Graph& graph, absl::Span<const int32_t> ids,
                                        const BatchLayout& batch,
                                        absl::Span<const RowSampling> sampling, bool overlapped) {
  const int n = static_cast<int>(batch.num_tokens());
  const int slot = next_slot_;
  // The host code of the pass does not run in a replay; noted before the workers are told,
  // so that their messages carry this step's hot ratio.
  forward_.NoteBatch(batch);
  // The workers are told first: their wake-up and launches overlap the router's own.
  if (absl::Status begun = graph_steps_.BeginGraphStep(n); !begun.ok()) return FailInFlight(begun);
  positions_.resize(n);
  sequences_.assign(batch.sequence.begin(), batch.sequence.end());
  for (int i = 0; i < n; ++i) positions_[i] = static_cast<int32_t>(batch.position[i]);
  if (absl::Status written =
          router_.WriteDecodeInputs(slot, ids, positions_, sequences_, kv_, sampling);
      !written.ok()) {
    graph_steps_.AbortGraphStep();
    return FailInFlight(written);
  }
  cudaStream_t stream = router_.context()->stream();
  const cudaError_t launched = cudaGraphLaunch(graph.exec[slot], stream);
  if (launched != cudaSuccess) {
    cudaGetLastError();
    graph_steps_.AbortGraphStep();
    return FailInFlight(
        absl::InternalError(absl::StrCat("decode graph launch: ", cudaGetErrorString(launched))));
  }
  // Launched: from here a failure lets the replay run out with its workers (FailInFlight), as
  // aborting would raise flags for workers that already ran it.
  const cudaError_t recorded = cudaEventRecord(events_->done[slot], stream);
  Launched step;
  step.slot = slot;
  step.sequences.assign(batch.sequence.begin(), batch.sequence.end());
  step.positions.assign(batch.position.begin(), batch.position.end());
  step.overlapped = overlapped;
  step.launch_returned = Clock::now();
  in_flight_.push_back(std::move(step));
  next_slot_ = (slot + 1) % DeviceRouter::kInputSlots;
  // An error here leaves the replay computing garbage behind released waits, and any step
  // still in flight may pass the same waits early: all of them fail.
  absl::Status started = graph_steps_.AwaitGraphStep();
  if (started.ok() && recorded != cudaSuccess) {
    cudaGetLastError();
    started =
        absl::InternalError(absl::StrCat("decode graph event: ", cudaGetErrorString(recorded)));
  }
  return FailInFlight(started);
}

absl::StatusOr<const int32_t*> DecodeGraphs::Wait() {
  if (in_flight_.empty()) {
    return absl::FailedPreconditionError("decode graph: no step in flight to wait for");
  }
  const Launched& step = in_flight_.front();
  const cudaError_t synced = cudaEventSynchronize(events_->done[step.slot]);
  if (synced != cudaSuccess) {
    cudaGetLastError();
    return FailInFlight(
        absl::InternalError(absl::StrCat("decode graph replay: ", cudaGetErrorString(synced))));
  }
  NoteTiming(step, Clock::now());
  const int slot = step.slot;
  const int rows = static_cast<int>(step.sequences.size());
  in_flight_.pop_front();
  if (absl::Status finished = experts_.FinishStep(); !finished.ok()) {
    // E.g. a worker died with the step's work queued: whatever is still in flight waited on
    // the same released flags.
    return FailInFlight(finished);
  }
  failures_ = 0;
  if (in_flight_.empty()) last_rows_ = rows;
  return router_.decode_greedy(slot);
}

absl::Status DecodeGraphs::FailInFlight(absl::Status cause) {
  if (cause.ok()) return cause;
  if (!in_flight_.empty()) {
    if (cudaStreamSynchronize(router_.context()->stream()) != cudaSuccess) cudaGetLastError();
    for (size_t i = 0; i < in_flight_.size(); ++i) experts_.FinishStep().IgnoreError();
    in_flight_.clear();
  }
  NoteEagerStep();  // the steps run again eagerly
  NoteFailure();
  return cause;
}

void DecodeGraphs::NoteFailure() {
  // The eager step that follows must not see this failure's runtime error as its own.
  cudaGetLastError();
  last_rows_ = 0;
  // A graph (and the expert backend's record of it) may be half made or stale: start over.
  graphs_.clear();
  const uint64_t version = graph_steps_.graph_version();
  if (version != failed_version_) failures_ = 0;
  failed_version_ = version;
  ++failures_;
}

absl::StatusOr<const float*> DecodeGraphs::Logits(absl::Span<const int64_t> rows) {
  if (last_rows_ == 0 || !in_flight_.empty()) {
    return absl::FailedPreconditionError("decode graph: no step to read");
  }
  for (int64_t r : rows) {
    if (r < 0 || r >= last_rows_) return absl::OutOfRangeError("decode graph: no such row");
  }
  absl::StatusOr<const float*> logits = router_.CopyDecodeLogits(rows);
  if (!logits.ok()) NoteFailure();  // the step runs again eagerly, as after a failed replay
  return logits;
}

#else

struct DecodeGraphs::Graph {};
struct DecodeGraphs::StepEvents {};
DecodeGraphs::~DecodeGraphs() = default;
absl::StatusOr<DecodeGraphs::Graph*> DecodeGraphs::Capture(absl::Span<const int32_t>,
                                                           const BatchLayout&) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::Status DecodeGraphs::Launch(absl::Span<const int32_t>, const BatchLayout&,
                                  absl::Span<const RowSampling>) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<const int32_t*> DecodeGraphs::Wait() {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<const float*> DecodeGraphs::Logits(absl::Span<const int64_t>) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::Status DecodeGraphs::CheckFollows(absl::Span<const int32_t>, const BatchLayout&) const {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::Status DecodeGraphs::LaunchReplay(Graph&, absl::Span<const int32_t>, const BatchLayout&,
                                        absl::Span<const RowSampling>, bool) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::Status DecodeGraphs::FailInFlight(absl::Status cause) { return cause; }
void DecodeGraphs::NoteFailure() {}

#endif

}  // namespace strata
