#include "services/router/ipc_expert_backend.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/stream_flags.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {
absl::StatusOr<std::unique_ptr<IpcExpertBackend>> IpcExpertBackend::Create(
    const ModelConfig& config, PlacementPlan placement, WorkerExpertOptions options,
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
  ASSIGN_OR_RETURN(b->input_, cuda_ipc::AllocateShared<gpu::bf16>(activations));
  ASSIGN_OR_RETURN(b->sum_, gpu::DeviceBuffer<gpu::bf16>::Allocate(activations));
  ASSIGN_OR_RETURN(b->owners_,
                   gpu::DeviceBuffer<int32_t>::Allocate(static_cast<size_t>(config.num_layers) *
                                                        std::max(config.num_experts, 1)));
  ASSIGN_OR_RETURN(b->blocks_done_, gpu::DeviceBuffer<uint32_t>::Allocate(1));
  CUDA_RETURN_IF_ERROR(cudaMemset(b->blocks_done_.data(), 0, sizeof(uint32_t)));
  b->uploaded_owners_.resize(config.num_layers);
  b->attached_.resize(b->num_workers());
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->deferred_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->earlier_done_, cudaEventDisableTiming));
  b->watchdog_ = std::make_unique<IpcWatchdog>(context->device(), config.num_layers,
                                               [raw = b.get()] { return raw->Links(); });
  RETURN_IF_ERROR(b->watchdog_->Start());
  return b;
}

IpcExpertBackend::~IpcExpertBackend() {
  watchdog_.reset();  // stops its thread, which reads the connections
  cudaSetDevice(context_->device());
  if (deferred_stream_ != nullptr) cudaStreamDestroy(deferred_stream_);
  if (earlier_done_ != nullptr) cudaEventDestroy(earlier_done_);
}

absl::Status IpcExpertBackend::StampClocks(const std::string& path) {
  ASSIGN_OR_RETURN(stamps_, gpu::ClockStamps::Open(path, "router", 3 * config().num_layers));
  return absl::OkStatus();
}

absl::Status IpcExpertBackend::FinishStep() {
  // Only the workers a replay started wait on it (none in an eager step); replays finish in
  // the order they were launched.
  if (!awaited_steps_.empty()) {
    for (const std::shared_ptr<CudaIpcConnection>& link : awaited_steps_.front()) {
      link->DropGraphAwait();
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
      const cudaError_t reset =
          cudaMemsetAsync(link->buffers().flags(), 0, bytes, watchdog_->release_stream());
      if (reset != cudaSuccess && status.ok()) {
        status = gpu::CudaStatus(reset, "cudaMemsetAsync", __FILE__, __LINE__);
      }
    }
    reset_flags_.clear();
    const cudaError_t synced = cudaStreamSynchronize(watchdog_->release_stream());
    if (synced != cudaSuccess && status.ok()) {
      status = gpu::CudaStatus(synced, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
  }
  if (watchdog_->TakeLost()) {
    return absl::AbortedError("an expert worker died with this step's GPU work queued");
  }
  RETURN_IF_ERROR(status);
  // Profiling last: nothing above may be skipped by its failure.
  if (stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Flush(context_->stream()));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ExpertConnection>> IpcExpertBackend::Attach(
    int index, std::unique_ptr<ShmExpertConnection> channel, v1::CudaIpcBuffers& buffers,
    const std::string& worker_gpu_uuid, bool graph_steps) {
  const ModelConfig& c = config();
  // Registration runs on a gRPC thread: make the router's device current there.
  CUDA_RETURN_IF_ERROR(cudaSetDevice(context_->device()));
  // The connection this one replaces goes soon: free no stream that still waits on it.
  if (index < 0 || index >= num_workers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert worker ", index, " of ", num_workers(), " registered"));
  }
  if (const std::shared_ptr<CudaIpcConnection> old = Links()[index]) {
    watchdog_->ReleaseIfLost(*old);
  }
  cuda_ipc::LinkShape shape;
  shape.device = context_->device();
  shape.max_tokens = static_cast<uint32_t>(max_tokens_);
  shape.top_k = static_cast<uint32_t>(std::max(c.top_k, 1));
  shape.hidden_size = static_cast<uint32_t>(c.hidden_size);
  shape.num_layers = static_cast<uint32_t>(c.num_layers);
  // Unknown GPUs (an older worker, a failed query) keep system scope.
  const absl::StatusOr<std::string> router_gpu = gpu::GpuUuid(context_->device());
  shape.device_scope_flags = gpu::DeviceScopeSignalsAllowed() && router_gpu.ok() &&
                             !worker_gpu_uuid.empty() && worker_gpu_uuid == *router_gpu;
  // On the private stream: the legacy stream would wait for the engine's (perhaps capturing).
  ASSIGN_OR_RETURN(std::unique_ptr<cuda_ipc::RouterLink> link_buffers,
                   cuda_ipc::RouterLink::Create(shape, watchdog_->release_stream()));
  RETURN_IF_ERROR(link_buffers->Export(input_.data(), buffers));
  auto link = std::make_shared<CudaIpcConnection>(std::move(channel), std::move(link_buffers),
                                                  next_generation_.fetch_add(1), graph_steps);
  {
    std::lock_guard<std::mutex> lock(attached_mu_);
    attached_[index] = link;
  }
  return std::shared_ptr<ExpertConnection>(std::move(link));
}

absl::StatusOr<cuda_ipc::LinkViews> IpcExpertBackend::AttachedViews(int index) {
  std::shared_ptr<CudaIpcConnection> link;
  {
    std::lock_guard<std::mutex> lock(attached_mu_);
    if (index >= 0 && index < static_cast<int>(attached_.size())) link = attached_[index].lock();
  }
  if (link == nullptr) {
    return absl::NotFoundError(absl::StrCat("expert worker ", index, " has no CUDA IPC link"));
  }
  return link->buffers().views(input_.data());
}

std::vector<std::shared_ptr<CudaIpcConnection>> IpcExpertBackend::LinksOf(
    const std::vector<std::shared_ptr<ExpertConnection>>& connections) const {
  std::vector<std::shared_ptr<CudaIpcConnection>> links(connections.size());
  std::lock_guard<std::mutex> lock(attached_mu_);
  for (size_t w = 0; w < connections.size() && w < attached_.size(); ++w) {
    std::shared_ptr<CudaIpcConnection> link = attached_[w].lock();
    // The identity of the objects: worker w's connection is the one Attach made.
    if (link != nullptr && link == connections[w]) links[w] = std::move(link);
  }
  return links;
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
  std::vector<std::shared_ptr<CudaIpcConnection>> links;
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
    const bool combine_waits =
        n == 1 && workers.size() == 1 && stamps_ == nullptr && gpu::FlagWaitsPoll();
    RETURN_IF_ERROR(CaptureExchange(layer, workers, links, connections, combine_waits, partials));
    if (partials.count == 1) holder = connections[workers[0]];
    return SumPartials(partials, n, std::move(holder), out);
  }
  for (int w : workers)
    CUDA_RETURN_IF_ERROR(cudaEventRecord(links[w]->buffers().input_ready(), stream));

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
    request.lent_slots = lent_slots(w);
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
      const cudaError_t waited = cudaStreamWaitEvent(stream, links[w]->buffers().output_ready(), 0);
      if (waited != cudaSuccess && status.ok()) {
        status = gpu::CudaStatus(waited, "cudaStreamWaitEvent", __FILE__, __LINE__);
      }
      links[w]->awaited.store(true);
      partials.parts[partials.count++] = links[w]->buffers().output();
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
    std::vector<std::shared_ptr<CudaIpcConnection>>& links, int* failed) const {
  workers.clear();
  for (int w = 0; w < num_workers(); ++w) {
    if (std::find(owner.begin(), owner.end(), w) != owner.end()) workers.push_back(w);
  }
  links = LinksOf(connections);
  links.resize(num_workers());
  for (int w : workers) {
    if (links[w] == nullptr || !links[w]->Alive()) {
      *failed = w;
      return absl::UnavailableError(
          absl::StrCat("expert worker ", w, " is not connected over CUDA IPC"));
    }
  }
  return absl::OkStatus();
}

void IpcExpertBackend::PlanSplit(int layer, const std::vector<int>& workers,
                                 const std::vector<std::shared_ptr<CudaIpcConnection>>& links,
                                 gpu::RoutingSplit& split, gpu::GridSignal& signal) {
  const size_t layers = static_cast<size_t>(config().num_layers);
  static_assert(gpu::kMaxSplitTargets <= gpu::kMaxSignalFlags, "a flag pair per split target");
  split = gpu::RoutingSplit();
  signal = gpu::GridSignal();  // a captured step: the kernel raises the workers' input flags
  signal.system = false;       // unless a worker's link needs system scope
  for (int w : workers) {
    signal.system |= !links[w]->buffers().shape().device_scope_flags;
    split.worker[split.count] = w;
    split.ids[split.count] = links[w]->buffers().ids();
    split.weights[split.count] = links[w]->buffers().weights();
    ++split.count;
    if (capturing_) {
      // The output flag the last replay left up goes down before the worker can raise it again.
      signal.clear[signal.count] = links[w]->buffers().output_flag(layer);
      signal.raise[signal.count] = links[w]->buffers().input_flag(layer);
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
  std::vector<std::shared_ptr<CudaIpcConnection>> links;
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
