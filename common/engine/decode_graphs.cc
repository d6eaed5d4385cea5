#include "common/engine/decode_graphs.h"

#include <algorithm>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#if STRATA_HAVE_CUDA
#include "common/backend/cuda/cuda_router_backend.h"
#endif

namespace strata {

DecodeGraphs::DecodeGraphs(ForwardPass& forward, gpu::CudaRouterBackend& router,
                           ExpertBackend& experts, PagedKvCache& kv, DecodeGraphOptions options)
    : forward_(forward), router_(router), experts_(experts), kv_(kv), options_(options) {}

void DecodeGraphs::NoteTiming(Clock::time_point launch_returned, Clock::time_point synced) {
  auto ns = [](Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  };
  replays_.fetch_add(1, std::memory_order_relaxed);
  replay_ns_.fetch_add(ns(synced - launch_returned), std::memory_order_relaxed);
  const Clock::duration between = launch_returned - last_synced_;
  if (last_synced_ != Clock::time_point{} && between < std::chrono::milliseconds(20)) {
    pairs_.fetch_add(1, std::memory_order_relaxed);
    between_ns_.fetch_add(ns(between), std::memory_order_relaxed);
  }
  last_synced_ = synced;
}

DecodeGraphs::Timing DecodeGraphs::timing() const {
  Timing t;
  t.replays = replays_.load(std::memory_order_relaxed);
  t.replay_us = replay_ns_.load(std::memory_order_relaxed) / 1e3;
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
  const uint64_t version = experts_.graph_version();
  return version != 0 && !(failures_ >= kMaxFailures && version == failed_version_);
#else
  return false;
#endif
}

#if STRATA_HAVE_CUDA

struct DecodeGraphs::Graph {
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

DecodeGraphs::~DecodeGraphs() = default;

absl::StatusOr<DecodeGraphs::Graph*> DecodeGraphs::Capture(absl::Span<const int32_t> ids,
                                                           const BatchLayout& batch) {
  const int n = static_cast<int>(batch.num_tokens());
  if (!prepared_) {
    RETURN_IF_ERROR(router_.PrepareGraphs(options_.max_context, options_.max_sequences));
    prepared_ = true;
  }
  RETURN_IF_ERROR(router_.EnterGraphMode(n));
  absl::Cleanup leave = [&] { router_.LeaveGraphMode(); };
  std::vector<int64_t> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = i;
  cudaStream_t stream = router_.context()->stream();
  experts_.SetGraphCapture(true);
  absl::Cleanup captured_experts = [&] { experts_.SetGraphCapture(false); };
  // The host code runs once and the device work is recorded; the replay that follows is the
  // step itself.
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError("cannot begin capturing a decode graph");
  }
  Tensor unused;
  const absl::Status captured = forward_.RunOnceForCapture(ids, batch, kv_, rows, unused);
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
  auto owned = std::make_unique<Graph>();
  const cudaError_t made = cudaGraphInstantiate(&owned->exec, graph, 0);
  if (made != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("decode graph: ", cudaGetErrorString(made)));
  }
  Graph* raw = owned.get();
  graphs_[n] = std::move(owned);
  return raw;
}

absl::StatusOr<const int32_t*> DecodeGraphs::Run(absl::Span<const int32_t> ids,
                                                 const BatchLayout& batch,
                                                 absl::FunctionRef<void()> while_running) {
  last_rows_ = 0;
  absl::StatusOr<const int32_t*> greedy = Replay(ids, batch, while_running);
  if (greedy.ok()) {
    failures_ = 0;
    last_rows_ = static_cast<int>(ids.size());
    return greedy;
  }
  NoteFailure();
  return greedy.status();
}

void DecodeGraphs::NoteFailure() {
  // The eager step that follows must not see this failure's runtime error as its own.
  cudaGetLastError();
  last_rows_ = 0;
  // A graph (and the expert backend's record of it) may be half made or stale: start over.
  graphs_.clear();
  const uint64_t version = experts_.graph_version();
  if (version != failed_version_) failures_ = 0;
  failed_version_ = version;
  ++failures_;
}

absl::StatusOr<const float*> DecodeGraphs::Logits(absl::Span<const int64_t> rows) {
  if (last_rows_ == 0) return absl::FailedPreconditionError("decode graph: no step to read");
  for (int64_t r : rows) {
    if (r < 0 || r >= last_rows_) return absl::OutOfRangeError("decode graph: no such row");
  }
  absl::StatusOr<const float*> logits = router_.CopyDecodeLogits(rows);
  if (!logits.ok()) NoteFailure();  // the step runs again eagerly, as after a failed replay
  return logits;
}

absl::StatusOr<const int32_t*> DecodeGraphs::Replay(absl::Span<const int32_t> ids,
                                                    const BatchLayout& batch,
                                                    absl::FunctionRef<void()> while_running) {
  const int n = static_cast<int>(batch.num_tokens());
  if (static_cast<int>(ids.size()) != n) {
    return absl::InvalidArgumentError("decode graph: ids do not match the batch");
  }
  const uint64_t version = experts_.graph_version();
  if (version != version_) {
    graphs_.clear();  // captured against experts that changed since
    version_ = version;
  }
  Graph* graph = nullptr;
  if (auto it = graphs_.find(n); it != graphs_.end()) {
    graph = it->second.get();
  } else {
    while_running();  // a capture takes a while: what the caller has waiting goes first
    ASSIGN_OR_RETURN(graph, Capture(ids, batch));
  }
  // The host code of the pass does not run in a replay; noted before the workers are told,
  // so that their messages carry this step's hot ratio.
  forward_.NoteBatch(batch);
  // The workers are told first: their wake-up and launches overlap the router's own.
  RETURN_IF_ERROR(experts_.BeginGraphStep(n));
  positions_.resize(n);
  tables_.resize(n);
  for (int i = 0; i < n; ++i) {
    positions_[i] = static_cast<int32_t>(batch.position[i]);
    tables_[i] = &kv_.block_table(batch.sequence[i]);
  }
  if (absl::Status written = router_.WriteDecodeInputs(ids, positions_, tables_); !written.ok()) {
    experts_.AbortGraphStep();
    return written;
  }
  cudaStream_t stream = router_.context()->stream();
  const cudaError_t launched = cudaGraphLaunch(graph->exec, stream);
  if (launched != cudaSuccess) {
    cudaGetLastError();
    experts_.AbortGraphStep();
    return absl::InternalError(absl::StrCat("decode graph launch: ", cudaGetErrorString(launched)));
  }
  const Clock::time_point launch_returned = Clock::now();
  while_running();
  const absl::Status started = experts_.AwaitGraphStep();
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (synced == cudaSuccess) {
    NoteTiming(launch_returned, Clock::now());
  } else {
    NoteEagerStep();  // the step runs again eagerly
  }
  const absl::Status finished = experts_.FinishStep();  // also when the replay failed
  if (synced != cudaSuccess) {
    return absl::InternalError(absl::StrCat("decode graph replay: ", cudaGetErrorString(synced)));
  }
  if (!started.ok()) return started;
  RETURN_IF_ERROR(finished);
  return router_.decode_greedy();
}

#else

struct DecodeGraphs::Graph {};
DecodeGraphs::~DecodeGraphs() = default;
absl::StatusOr<DecodeGraphs::Graph*> DecodeGraphs::Capture(absl::Span<const int32_t>,
                                                           const BatchLayout&) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<const int32_t*> DecodeGraphs::Run(absl::Span<const int32_t>, const BatchLayout&,
                                                 absl::FunctionRef<void()>) {
  return absl::UnimplementedError("no CUDA in this build");
}
absl::StatusOr<const float*> DecodeGraphs::Logits(absl::Span<const int64_t>) {
  return absl::UnimplementedError("no CUDA in this build");
}
void DecodeGraphs::NoteFailure() {}
absl::StatusOr<const int32_t*> DecodeGraphs::Replay(absl::Span<const int32_t>, const BatchLayout&,
                                                    absl::FunctionRef<void()>) {
  return absl::UnimplementedError("no CUDA in this build");
}

#endif

}  // namespace strata
