#include "services/router/ipc_expert_backend.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_context.h"
#include "common/backend/cuda/cuda_status.h"
#include "common/backend/cuda/stream_flags.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

constexpr unsigned kEventFlags = cudaEventInterprocess | cudaEventDisableTiming;

// Shared allocations are whole multiples of 2 MiB: smaller ones may be carved from a larger
// block, which a handle would share whole (and map from its start).
template <typename T>
absl::StatusOr<gpu::DeviceBuffer<T>> AllocateShared(size_t count) {
  constexpr size_t kGranule = size_t{2} << 20;
  const size_t bytes = (count * sizeof(T) + kGranule - 1) / kGranule * kGranule;
  return gpu::DeviceBuffer<T>::Allocate(bytes / sizeof(T));
}

absl::Status PutMemHandle(void* device_ptr, std::string* out) {
  cudaIpcMemHandle_t handle;
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, device_ptr));
  out->assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return absl::OkStatus();
}

absl::Status PutEventHandle(cudaEvent_t event, std::string* out) {
  cudaIpcEventHandle_t handle;
  CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&handle, event));
  out->assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return absl::OkStatus();
}

}  // namespace

CudaIpcConnection::~CudaIpcConnection() {
  // Best effort, on whichever thread drops the last reference.
  cudaSetDevice(device_);
  if (input_ready_ != nullptr) cudaEventDestroy(input_ready_);
  if (output_ready_ != nullptr) cudaEventDestroy(output_ready_);
}

absl::StatusOr<std::unique_ptr<IpcExpertBackend>> IpcExpertBackend::Create(
    const ModelConfig& config, PlacementPlan placement, RemoteExpertOptions options,
    gpu::CudaContext* context, int max_tokens) {
  if (placement.num_workers > gpu::kMaxSplitTargets) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC experts: at most ",
                                                   gpu::kMaxSplitTargets, " workers, not ",
                                                   placement.num_workers));
  }
  if (max_tokens <= 0) return absl::InvalidArgumentError("CUDA IPC experts: max_tokens");
  std::unique_ptr<IpcExpertBackend> b(
      new IpcExpertBackend(config, std::move(placement), options, context, max_tokens));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(context->device()));
  const size_t activations = static_cast<size_t>(max_tokens) * config.hidden_size;
  ASSIGN_OR_RETURN(b->input_, AllocateShared<gpu::bf16>(activations));
  ASSIGN_OR_RETURN(b->sum_, gpu::DeviceBuffer<gpu::bf16>::Allocate(activations));
  ASSIGN_OR_RETURN(b->owners_,
                   gpu::DeviceBuffer<int32_t>::Allocate(static_cast<size_t>(config.num_layers) *
                                                        std::max(config.num_experts, 1)));
  ASSIGN_OR_RETURN(b->blocks_done_, gpu::DeviceBuffer<uint32_t>::Allocate(1));
  CUDA_RETURN_IF_ERROR(cudaMemset(b->blocks_done_.data(), 0, sizeof(uint32_t)));
  b->uploaded_owners_.resize(config.num_layers);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->release_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->deferred_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->earlier_done_, cudaEventDisableTiming));
  b->watchdog_ = std::thread([raw = b.get()] { raw->Watch(); });
  return b;
}

IpcExpertBackend::~IpcExpertBackend() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  cudaSetDevice(context_->device());
  if (release_stream_ != nullptr) cudaStreamDestroy(release_stream_);
  if (deferred_stream_ != nullptr) cudaStreamDestroy(deferred_stream_);
  if (earlier_done_ != nullptr) cudaEventDestroy(earlier_done_);
}

void IpcExpertBackend::Watch() {
  cudaSetDevice(context_->device());
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stopping_; })) {
    for (const std::shared_ptr<ExpertConnection>& connection : Connections()) {
      auto* link = dynamic_cast<CudaIpcConnection*>(connection.get());
      if (link != nullptr) ReleaseIfLost(*link);
    }
  }
}

void IpcExpertBackend::ReleaseIfLost(CudaIpcConnection& link) {
  std::lock_guard<std::mutex> lock(release_mu_);
  if (link.graph_awaited_.load() > 0 && !link.Alive()) {
    // A replayed step waits on output flags this worker will never raise: release them all
    // for good (the split kernel's lowering leaves kFlagReleased up) and run the step again.
    // The step is marked lost before its stream can go on: FinishStep must not see it done
    // and not lost.
    lost_.store(true);
    const size_t layers = static_cast<size_t>(config().num_layers);
    if (gpu::FillFlags(release_stream_, link.flags_.data() + layers, gpu::kFlagReleased, layers)
            .ok()) {
      link.graph_awaited_.store(0);
      Log(LogLevel::kWarning,
          "an expert worker died during a replayed step; the step runs again without it");
    }
  }
  if (!link.awaited_.load() || link.Alive()) return;
  // Gone, after the router's stream started waiting for its output event.
  const cudaError_t state = cudaEventQuery(link.output_ready_);
  if (state != cudaErrorNotReady) {
    if (state != cudaSuccess) cudaGetLastError();
    link.awaited_.store(false);
    return;
  }
  // Its record will never run. A record here completes at once and releases the waiting
  // stream; what that stream computed meanwhile is wrong, so the step runs again (marked
  // first, as above).
  lost_.store(true);
  cudaEventRecord(link.output_ready_, release_stream_);
  link.awaited_.store(false);
  Log(LogLevel::kWarning,
      "an expert worker died with its GPU work queued; the step runs again without it");
}

absl::Status IpcExpertBackend::StampClocks(const std::string& path) {
  ASSIGN_OR_RETURN(stamps_, gpu::ClockStamps::Open(path, "router", 3 * config().num_layers));
  return absl::OkStatus();
}

namespace {

// One replay fewer waits on the link (never below none: the watchdog may have let go of all).
void DropAwaited(CudaIpcConnection& link, std::atomic<int>& awaited) {
  int v = awaited.load();
  while (v > 0 && !awaited.compare_exchange_weak(v, v - 1)) {
  }
}

}  // namespace

void IpcExpertBackend::ClearStarted() {
  for (int w : started_) {
    if (CudaIpcConnection* link = graph_connections_[w].get()) {
      DropAwaited(*link, link->graph_awaited_);
    }
  }
  started_.clear();
}

absl::Status IpcExpertBackend::FinishStep() {
  // Only the workers a replay started wait on it (none in an eager step); replays finish in
  // the order they were launched.
  if (!awaited_steps_.empty()) {
    for (const std::shared_ptr<CudaIpcConnection>& link : awaited_steps_.front()) {
      DropAwaited(*link, link->graph_awaited_);
    }
    awaited_steps_.pop_front();
  }
  absl::Status status;
  // Flags are reset only once no replay is in flight: a later one may wait on them yet.
  if (!reset_flags_.empty() && awaited_steps_.empty()) {
    // Workers that failed to start a replayed step, now over: none of their flags may stay up
    // (a released output flag would let the next replay pass its wait at once).
    const size_t bytes = 2 * static_cast<size_t>(config().num_layers) * sizeof(uint32_t);
    for (const std::shared_ptr<CudaIpcConnection>& link : reset_flags_) {
      const cudaError_t reset = cudaMemsetAsync(link->flags_.data(), 0, bytes, release_stream_);
      if (reset != cudaSuccess && status.ok()) {
        status = gpu::CudaStatus(reset, "cudaMemsetAsync", __FILE__, __LINE__);
      }
    }
    reset_flags_.clear();
    const cudaError_t synced = cudaStreamSynchronize(release_stream_);
    if (synced != cudaSuccess && status.ok()) {
      status = gpu::CudaStatus(synced, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
  }
  if (lost_.exchange(false)) {
    return absl::AbortedError("an expert worker died with this step's GPU work queued");
  }
  RETURN_IF_ERROR(status);
  // Profiling last: nothing above may be skipped by its failure.
  if (stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Flush(context_->stream()));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ExpertConnection>> IpcExpertBackend::Attach(
    int index, std::unique_ptr<ShmExpertConnection> channel, v1::CudaIpcBuffers& buffers,
    const std::string& worker_gpu_uuid) {
  const ModelConfig& c = config();
  // Registration runs on a gRPC thread: make the router's device current there.
  CUDA_RETURN_IF_ERROR(cudaSetDevice(context_->device()));
  // The connection this one replaces goes soon: free no stream that still waits on it.
  const std::vector<std::shared_ptr<ExpertConnection>> current = Connections();
  if (index >= 0 && index < static_cast<int>(current.size())) {
    if (auto* old = dynamic_cast<CudaIpcConnection*>(current[index].get())) ReleaseIfLost(*old);
  }
  std::shared_ptr<CudaIpcConnection> link(new CudaIpcConnection());
  link->device_ = context_->device();
  // Unknown GPUs (an older worker, a failed query) keep system scope.
  const absl::StatusOr<std::string> router_gpu = gpu::GpuUuid(context_->device());
  link->device_scope_flags_ = gpu::DeviceScopeSignalsAllowed() && router_gpu.ok() &&
                              !worker_gpu_uuid.empty() && worker_gpu_uuid == *router_gpu;
  const int top_k = std::max(c.top_k, 1);
  const size_t slots = static_cast<size_t>(max_tokens_) * top_k;
  ASSIGN_OR_RETURN(link->ids_, AllocateShared<int32_t>(slots));
  ASSIGN_OR_RETURN(link->weights_, AllocateShared<float>(slots));
  ASSIGN_OR_RETURN(link->output_,
                   AllocateShared<gpu::bf16>(static_cast<size_t>(max_tokens_) * c.hidden_size));
  ASSIGN_OR_RETURN(link->flags_, AllocateShared<uint32_t>(2 * static_cast<size_t>(c.num_layers)));
  // On the private stream: the legacy stream would wait for the engine's (perhaps capturing).
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(link->flags_.data(), 0,
                                       2 * static_cast<size_t>(c.num_layers) * sizeof(uint32_t),
                                       release_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(release_stream_));
  link->generation_ = next_generation_.fetch_add(1);
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&link->input_ready_, kEventFlags));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&link->output_ready_, kEventFlags));
  buffers.set_device(context_->device());
  buffers.set_max_tokens(static_cast<uint32_t>(max_tokens_));
  buffers.set_top_k(static_cast<uint32_t>(top_k));
  buffers.set_hidden_size(static_cast<uint32_t>(c.hidden_size));
  RETURN_IF_ERROR(PutMemHandle(input_.data(), buffers.mutable_input()));
  RETURN_IF_ERROR(PutMemHandle(link->ids_.data(), buffers.mutable_expert_ids()));
  RETURN_IF_ERROR(PutMemHandle(link->weights_.data(), buffers.mutable_expert_weights()));
  RETURN_IF_ERROR(PutMemHandle(link->output_.data(), buffers.mutable_output()));
  RETURN_IF_ERROR(PutMemHandle(link->flags_.data(), buffers.mutable_flags()));
  buffers.set_num_layers(static_cast<uint32_t>(c.num_layers));
  buffers.set_device_scope_flags(link->device_scope_flags_);
  RETURN_IF_ERROR(PutEventHandle(link->input_ready_, buffers.mutable_input_ready()));
  RETURN_IF_ERROR(PutEventHandle(link->output_ready_, buffers.mutable_output_ready()));
  link->channel_ = std::move(channel);
  return std::shared_ptr<ExpertConnection>(std::move(link));
}

uint64_t IpcExpertBackend::graph_version() const {
  // Workers here hold every expert (the coordinator refuses a tiered one over CUDA IPC).
  uint64_t version = 0;
  bool any = false;
  for (const std::shared_ptr<ExpertConnection>& connection : Connections()) {
    const auto* link = dynamic_cast<const CudaIpcConnection*>(connection.get());
    const bool alive = link != nullptr && link->Alive();
    any = any || alive;
    version = version * 1000003 + (alive ? link->generation_ : 0);
  }
  // A rerouted layer changes the owners the captured split routes by, not the connections.
  version = version * 1000003 + owners_version_.load();
  return any ? (version | 1) : 0;
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
      graph_connections_[w]->graph_awaited_.fetch_add(1);
    } else {
      // A worker that answered with an error started nothing. One whose answer never came may
      // have, and its graph would wait for flags that are cleared once this step is over, with
      // every later request queued behind it: its channel is closed, so that it registers
      // again, or restarts when its stream stays stuck.
      if (transport_failed) {
        Log(LogLevel::kError, absl::StrCat("expert worker ", w,
                                           " did not answer a graph step: ", received.message()));
        graph_connections_[w]->channel_->Close();
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
  cudaStream_t release = release_stream_;
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
            gpu::FillFlags(release, link->flags_.data() + layers, gpu::kFlagReleased, layers);
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
    uint32_t* in = graph_connections_[w]->flags_.data();
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
    int layer, const std::vector<int>& workers, const std::vector<CudaIpcConnection*>& links,
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
    const uint32_t* output_flag = links[w]->flags_.data() + layers + layer;
    if (combine_waits) {
      output_ready_flag_ = output_flag;
    } else {
      RETURN_IF_ERROR(gpu::WaitFlag(stream, output_flag, 1));
    }
    partials.parts[partials.count++] = links[w]->output_.data();
    graph_layers_[w].push_back(layer);
    // links[w] is this connection, checked to be over CUDA IPC.
    graph_connections_[w] = std::static_pointer_cast<CudaIpcConnection>(connections[w]);
  }
  if (stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Mark(stream, 3 * layer + 2));
  return absl::OkStatus();
}

absl::Status IpcExpertBackend::UploadOwners(int layer, const std::vector<int>& owner) {
  if (uploaded_owners_[layer] == owner) return absl::OkStatus();
  const ModelConfig& c = config();
  if (static_cast<int>(owner.size()) != c.num_experts) {
    return absl::InternalError("CUDA IPC experts: placement does not match the model");
  }
  const std::vector<int32_t> row(owner.begin(), owner.end());
  cudaStream_t stream = context_->stream();
  // Rare (the first step, or a worker came or went): waited for, so `row` can go.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(owners_.data() + static_cast<size_t>(layer) * c.num_experts,
                                       row.data(), row.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  uploaded_owners_[layer] = owner;
  owners_version_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status IpcExpertBackend::Exchange(
    int layer, const Tensor& x, const RoutingTable& routing, const std::vector<int>& owner,
    const std::vector<std::shared_ptr<ExpertConnection>>& connections, Tensor& out, int* failed) {
  output_ready_flag_ = nullptr;  // set below where it applies
  const ModelConfig& c = config();
  const int64_t n = x.rows();
  const int64_t h = c.hidden_size;
  const int k = routing.top_k;
  if (x.device() != Device::kCuda || !routing.on_device() || x.cols() != h) {
    return absl::InvalidArgumentError(
        "CUDA IPC experts: the layer's input and routing must be on the router's device");
  }
  if (n > max_tokens_ || k <= 0 || k > std::max(c.top_k, 1)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC experts: ", n, " tokens x ", k,
                                                   " slots do not fit the buffers (", max_tokens_,
                                                   " x ", c.top_k, ")"));
  }
  // Every worker that runs an expert of this layer takes part: the routing stays on the
  // device, so which of them the tokens picked is not known here.
  std::vector<int> workers;
  std::vector<CudaIpcConnection*> links;
  RETURN_IF_ERROR(LinksFor(owner, connections, workers, links, failed));
  cudaStream_t stream = context_->stream();
  if (capturing_ && uploaded_owners_[layer] != owner) {
    // The upload waits for its copy, which a capture cannot; the eager step that follows a
    // failed capture uploads it.
    return absl::FailedPreconditionError("expert owners changed since the last eager step");
  }
  if (!capturing_) RETURN_IF_ERROR(UploadOwners(layer, owner));
  const bool handed_off = capturing_ && handed_off_layer_ == layer;
  handed_off_layer_ = -1;
  if (handed_off) {
    // A worker that registered again in between: the gate kernel wrote to the old link.
    std::vector<std::shared_ptr<ExpertConnection>> now(num_workers());
    for (int w : workers) now[w] = connections[w];
    const bool same = now == handed_off_connections_;
    if (!same) {
      return absl::FailedPreconditionError(
          "the workers of a layer changed between its gate and its exchange");
    }
  }
  if (capturing_ && stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Mark(stream, 3 * layer));
  if (!handed_off) {  // else the gate kernel copied, split and signalled
    gpu::RoutingSplit split;
    gpu::GridSignal signal;
    PlanSplit(layer, workers, links, split, signal);
    const gpu::SplitInput input{static_cast<const gpu::bf16*>(x.device_data()), input_.data(), h};
    CUDA_RETURN_IF_ERROR(
        gpu::LaunchSplitRouting(input, routing.device_expert, routing.device_weight, n, k,
                                owners_.data() + static_cast<size_t>(layer) * c.num_experts,
                                c.num_experts, split, signal, stream));
  }
  gpu::PartialSet partials;
  std::shared_ptr<void> holder;  // keeps a single partial's buffer alive with the view
  if (capturing_) {
    // One worker and no stamps: the combine's add + norm waits for its output flag itself.
    // Only at one token, where it was measured: the combine's blocks wait on SMs the worker's
    // experts use, one a token.
    const bool combine_waits = n == 1 && workers.size() == 1 &&
                               stamps_ == nullptr && gpu::FlagWaitsPoll();
    RETURN_IF_ERROR(CaptureExchange(layer, workers, links, connections, combine_waits, partials));
    if (partials.count == 1) holder = connections[workers[0]];
    return SumPartials(partials, n, std::move(holder), out);
  }
  for (int w : workers) CUDA_RETURN_IF_ERROR(cudaEventRecord(links[w]->input_ready_, stream));

  const uint64_t step = NextStep();
  std::vector<bool> sent(num_workers(), false);
  absl::Status status;
  for (int w : workers) {
    ExpertRequestView request;
    request.kind = ExpertMessageKind::kDeviceRun;
    request.step = step;
    request.layer = static_cast<uint32_t>(layer);
    request.num_tokens = static_cast<uint32_t>(n);
    request.top_k = static_cast<uint32_t>(k);
    request.hidden_size = static_cast<uint32_t>(h);
    request.hot_ratio = hot_ratio();
    status = links[w]->Send(request);
    if (!status.ok()) {
      *failed = w;
      break;
    }
    sent[w] = true;
  }
  for (int w : workers) {
    if (!sent[w]) continue;
    bool transport_failed = false;
    const absl::Status received = ReceiveResponse(
        w, *links[w], step,
        [&](const ExpertResponseView& response) {
          if (!response.on_device || response.num_tokens != n || response.hidden_size != h) {
            return absl::DataLossError(
                absl::StrCat("expert worker ", w, " answered a different request"));
          }
          return absl::OkStatus();
        },
        &transport_failed);
    if (received.ok()) {
      // Also when the layer fails elsewhere: whatever this stream does next (a rerun writes
      // the same buffers) must follow this worker's kernels.
      const cudaError_t waited = cudaStreamWaitEvent(stream, links[w]->output_ready_, 0);
      if (waited != cudaSuccess && status.ok()) {
        status = gpu::CudaStatus(waited, "cudaStreamWaitEvent", __FILE__, __LINE__);
      }
      links[w]->awaited_.store(true);
      partials.parts[partials.count++] = links[w]->output_.data();
      holder = connections[w];
    }
    if (transport_failed && *failed < 0) *failed = w;
    if (status.ok()) status = received;
  }
  if (!status.ok()) return status;
  return SumPartials(partials, n, std::move(holder), out);
}

absl::Status IpcExpertBackend::LinksFor(
    const std::vector<int>& owner,
    const std::vector<std::shared_ptr<ExpertConnection>>& connections, std::vector<int>& workers,
    std::vector<CudaIpcConnection*>& links, int* failed) const {
  workers.clear();
  for (int w = 0; w < num_workers(); ++w) {
    if (std::find(owner.begin(), owner.end(), w) != owner.end()) workers.push_back(w);
  }
  links.assign(num_workers(), nullptr);
  for (int w : workers) {
    links[w] = dynamic_cast<CudaIpcConnection*>(connections[w].get());
    if (links[w] == nullptr || !links[w]->Alive()) {
      *failed = w;
      return absl::UnavailableError(
          absl::StrCat("expert worker ", w, " is not connected over CUDA IPC"));
    }
  }
  return absl::OkStatus();
}

void IpcExpertBackend::PlanSplit(int layer, const std::vector<int>& workers,
                                 const std::vector<CudaIpcConnection*>& links,
                                 gpu::RoutingSplit& split, gpu::GridSignal& signal) {
  const size_t layers = static_cast<size_t>(config().num_layers);
  static_assert(gpu::kMaxSplitTargets <= gpu::kMaxSignalFlags, "a flag pair per split target");
  split = gpu::RoutingSplit();
  signal = gpu::GridSignal();  // a captured step: the kernel raises the workers' input flags
  signal.system = false;       // unless a worker's link needs system scope
  for (int w : workers) {
    signal.system |= !links[w]->device_scope_flags_;
    split.worker[split.count] = w;
    split.ids[split.count] = links[w]->ids_.data();
    split.weights[split.count] = links[w]->weights_.data();
    ++split.count;
    if (capturing_) {
      // The output flag the last replay left up goes down before the worker can raise it again.
      signal.clear[signal.count] = links[w]->flags_.data() + layers + layer;
      signal.raise[signal.count] = links[w]->flags_.data() + layer;
      ++signal.count;
    }
  }
  signal.done = blocks_done_.data();
}

void IpcExpertBackend::TakeHandOff(int layer, int64_t n, gpu::GateHandOff& hand_off) {
  hand_off = gpu::GateHandOff();
  handed_off_layer_ = -1;
  handed_off_connections_.clear();
  if (!capturing_ || stamps_ != nullptr || n > max_tokens_ || layer < 0 ||
      layer >= config().num_layers) {
    return;
  }
  const std::vector<std::shared_ptr<ExpertConnection>> connections = Connections();
  const std::vector<int> owner = EffectiveOwners(layer, Usable(connections));
  if (uploaded_owners_[layer] != owner) return;  // Exchange refuses the capture
  std::vector<int> workers;
  std::vector<CudaIpcConnection*> links;
  int failed = -1;
  if (!LinksFor(owner, connections, workers, links, &failed).ok()) return;
  hand_off.active = true;
  hand_off.input = input_.data();
  hand_off.owner = owners_.data() + static_cast<size_t>(layer) * config().num_experts;
  PlanSplit(layer, workers, links, hand_off.split, hand_off.signal);
  handed_off_layer_ = layer;
  handed_off_connections_.assign(num_workers(), nullptr);
  for (int w : workers) handed_off_connections_[w] = connections[w];
}

absl::Status IpcExpertBackend::SumPartials(const gpu::PartialSet& partials, int64_t n,
                                           std::shared_ptr<void> holder, Tensor& out) {
  const int64_t h = config().hidden_size;
  cudaStream_t stream = context_->stream();
  if (partials.count == 1) {
    out = Tensor::DeviceView(const_cast<gpu::bf16*>(partials.parts[0]), n, h, std::move(holder));
    return absl::OkStatus();
  }
  if (partials.count == 0) {
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(sum_.data(), 0, static_cast<size_t>(n * h) * sizeof(gpu::bf16), stream));
  } else {
    CUDA_RETURN_IF_ERROR(gpu::LaunchSumPartials(partials, n * h, sum_.data(), stream));
  }
  out = Tensor::DeviceView(sum_.data(), n, h, keep_alive_);
  return absl::OkStatus();
}

}  // namespace strata
