// IpcExpertBackend's part in decode-step CUDA graphs (GraphStepExperts): what a captured
// layer records instead of messages and events, and the kDeviceStep protocol around each replay
// (one message per worker to start its own graph, its answer, and what is released or run out
// when a replay cannot go ahead).
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/stream_flags.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "services/router/ipc_expert_backend.h"

namespace strata {

void IpcExpertBackend::ClearStarted() {
  for (int w : started_) {
    if (CudaIpcConnection* link = graph_connections_[w].get()) {
      link->DropGraphAwait();
    }
  }
  started_.clear();
}

uint64_t IpcExpertBackend::graph_version() const {
  // A tiered worker reads its misses in place during a replay: only one that cannot stops them.
  uint64_t version = 0;
  bool any = false;
  for (const std::shared_ptr<CudaIpcConnection>& link : Links()) {
    const bool alive = link != nullptr && link->Alive();
    if (alive && !link->graph_steps()) return 0;  // its layers run eagerly
    any = any || alive;
    version = version * 1000003 + (alive ? link->generation() : 0);
  }
  // A rerouted layer changes the owners the captured split routes by, not the connections.
  version = version * 1000003 + owners_version_.load();
  // Shifted, not or-ed, to keep 0 for "no graphs": `| 1` would absorb an owners bump of one
  // whenever the rest of the hash is even.
  return any ? (version << 1 | 1) : 0;
}

uint64_t IpcExpertBackend::missed_expert_bytes() const {
  uint64_t bytes = 0;
  for (int w = 0; w < num_workers(); ++w) {
    const TierCounters t = tiers(w);
    bytes += t.misses * t.slot_bytes;
  }
  return bytes;
}

absl::Status IpcExpertBackend::BeginGraphStep(int64_t tokens) {
  const ModelConfig& c = config();
  const std::vector<std::shared_ptr<ExpertConnection>> connections = Connections();
  graph_step_ = NextStep();
  step_tokens_ = tokens;
  sent_.clear();
  ClearStarted();  // empty unless a step ended on a path that did not finish it
  // A replay still in flight: marks its end, before which no worker's flags may be released
  // for this one (AwaitGraphStep).
  earlier_in_flight_ = !awaited_steps_.empty();
  if (earlier_in_flight_) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(earlier_done_, context_->stream()));
  }
  absl::Status status;
  for (int w = 0; w < static_cast<int>(graph_layers_.size()) && status.ok(); ++w) {
    if (graph_layers_[w].empty()) continue;
    CudaIpcConnection* link = graph_connections_[w].get();
    if (link == nullptr || w >= static_cast<int>(connections.size()) ||
        connections[w] != graph_connections_[w] || !link->Alive()) {
      status = absl::UnavailableError(
          absl::StrCat("expert worker ", w, " is not the one the decode graphs were made with"));
      break;
    }
    ExpertRequestView request;
    request.kind = ExpertMessageKind::kDeviceStep;
    request.step = graph_step_;
    request.num_tokens = static_cast<uint32_t>(tokens);
    request.top_k = static_cast<uint32_t>(std::max(c.top_k, 1));
    request.hidden_size = static_cast<uint32_t>(c.hidden_size);
    request.hot_ratio = hot_ratio();
    request.lent_slots = lent_slots(w);
    request.layers = graph_layers_[w];
    status = link->Send(request);
    if (status.ok()) sent_.push_back(w);
  }
  if (status.ok()) return status;
  AbortGraphStep();
  return status;
}

absl::Status IpcExpertBackend::CollectAnswers(std::vector<int>& failed) {
  absl::Status status;
  for (int w : sent_) {
    bool transport_failed = false;
    const absl::Status received = ReceiveResponse(
        w, *graph_connections_[w], graph_step_,
        [&](const ExpertResponseView& response) {
          if (!response.on_device || response.num_tokens != step_tokens_) {
            return absl::DataLossError(
                absl::StrCat("expert worker ", w, " answered a different request"));
          }
          return absl::OkStatus();
        },
        &transport_failed);
    if (received.ok()) {
      started_.push_back(w);
      graph_connections_[w]->graph_awaited.fetch_add(1);
    } else {
      // A worker that answered with an error started nothing. One whose answer never came may
      // have, and its graph would wait for flags that are cleared once this step is over, with
      // every later request queued behind it: its channel is closed, so that it registers
      // again, or restarts when its stream stays stuck.
      if (transport_failed) {
        Log(LogLevel::kError, absl::StrCat("expert worker ", w,
                                           " did not answer a graph step: ", received.message()));
        graph_connections_[w]->Close();
      }
      failed.push_back(w);
      if (status.ok()) status = absl::UnavailableError(received.message());
    }
  }
  sent_.clear();
  return status;
}

absl::Status IpcExpertBackend::AwaitGraphStep() {
  std::vector<int> failed;
  const absl::Status status = CollectAnswers(failed);
  const size_t layers = static_cast<size_t>(config().num_layers);
  // The worker may still be running the replay before this one, which its flags guard: then
  // the release waits for that replay's end (it finishes normally: the worker started it), on
  // a stream of its own so that the watchdog's releases never queue behind it.
  cudaStream_t release = watchdog_->release_stream();
  if (!failed.empty() && earlier_in_flight_) {
    release = deferred_stream_;
    if (cudaStreamWaitEvent(release, earlier_done_, 0) != cudaSuccess) {
      cudaGetLastError();
      Log(LogLevel::kError, "releasing a replayed step: cannot wait for the one before it");
    }
  }
  for (int w : failed) {
    // The replay waits for output flags this worker will not raise: release them for good
    // here, and clear every flag of its once the step is over (FinishStep).
    CudaIpcConnection* link = graph_connections_[w].get();
    if (absl::Status s =
            gpu::FillFlags(release, link->buffers().flags() + layers, gpu::kFlagReleased, layers);
        !s.ok()) {
      Log(LogLevel::kError, absl::StrCat("releasing a replayed step: ", s.message()));
    }
    reset_flags_.push_back(graph_connections_[w]);
  }
  // The replay is launched: the workers it started wait on it until FinishStep.
  std::vector<std::shared_ptr<CudaIpcConnection>>& awaited = awaited_steps_.emplace_back();
  for (int w : started_) awaited.push_back(graph_connections_[w]);
  started_.clear();
  return status;
}

void IpcExpertBackend::SetGraphCapture(bool capturing) {
  capturing_ = capturing;
  handed_off_layer_ = -1;
  handed_off_connections_.clear();
  if (!capturing) return;
  // A new capture: the step's layers and connections are recorded as it goes.
  for (std::vector<int32_t>& list : graph_layers_) list.clear();
  for (std::shared_ptr<CudaIpcConnection>& link : graph_connections_) link.reset();
}

void IpcExpertBackend::AbortGraphStep() {
  std::vector<int> failed;
  CollectAnswers(failed).IgnoreError();
  if (absl::Status s = RunOut(); !s.ok()) {
    Log(LogLevel::kError, absl::StrCat("running out the workers' graph step: ", s.message()));
  }
}

absl::Status IpcExpertBackend::RunOut() {
  const size_t layers = static_cast<size_t>(config().num_layers);
  cudaStream_t stream = context_->stream();
  absl::Status status;
  for (int w : started_) {
    uint32_t* in = graph_connections_[w]->buffers().flags();
    for (int32_t layer : graph_layers_[w]) {
      // As a replay's split kernel does: lower the output flag the last replay left up (but
      // not a released one) and raise the input flag; then wait for the worker.
      gpu::GridSignal signal;
      signal.count = 1;
      signal.clear[0] = in + layers + layer;
      signal.raise[0] = in + layer;
      signal.done = blocks_done_.data();
      const cudaError_t raised = gpu::LaunchSignal(signal, stream);
      if (status.ok() && raised != cudaSuccess) {
        status = gpu::CudaStatus(raised, "LaunchSignal", __FILE__, __LINE__);
      }
      if (absl::Status s = gpu::WaitFlag(stream, in + layers + layer, 1); status.ok()) status = s;
    }
  }
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (status.ok() && synced != cudaSuccess) {
    status = gpu::CudaStatus(synced, "cudaStreamSynchronize", __FILE__, __LINE__);
  }
  // Run out: a worker that exits now costs no step.
  ClearStarted();
  return status;
}

absl::Status IpcExpertBackend::CaptureExchange(
    int layer, const std::vector<int>& workers,
    const std::vector<std::shared_ptr<CudaIpcConnection>>& links,
    const std::vector<std::shared_ptr<ExpertConnection>>& connections, bool combine_waits,
    gpu::PartialSet& partials) {
  const size_t layers = static_cast<size_t>(config().num_layers);
  graph_layers_.resize(num_workers());
  graph_connections_.resize(num_workers());
  cudaStream_t stream = context_->stream();
  // The split kernel raised the input flags; the output flags stay up until the next replay's.
  if (stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Mark(stream, 3 * layer + 1));
  for (int w : workers) {
    // A worker that registered again during the capture: its earlier layers used the old
    // link's flags and buffers.
    if (graph_connections_[w] != nullptr && graph_connections_[w] != connections[w]) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert worker ", w, " changed while a decode step was captured"));
    }
    const uint32_t* output_flag = links[w]->buffers().output_flag(layer);
    if (combine_waits) {
      output_ready_flag_ = output_flag;
    } else {
      RETURN_IF_ERROR(gpu::WaitFlag(stream, output_flag, 1));
    }
    partials.parts[partials.count++] = links[w]->buffers().output();
    graph_layers_[w].push_back(layer);
    graph_connections_[w] = links[w];  // connections[w], over CUDA IPC (LinksFor)
  }
  if (stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Mark(stream, 3 * layer + 2));
  return absl::OkStatus();
}

}  // namespace strata
