#include "common/transport/cuda_ipc/worker_link.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#if STRATA_HAVE_CUDA
#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "common/backend/cuda/device_experts.h"
#include "common/cuda/clock_stamps.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/stream_flags.h"
#include "common/util/status_macros.h"
#endif

namespace strata {

#if STRATA_HAVE_CUDA
namespace {

absl::Status OpenMemory(const std::string& bytes, void** ptr) {
  cudaIpcMemHandle_t handle;
  if (bytes.size() != sizeof(handle)) {
    return absl::InvalidArgumentError("CUDA IPC: a memory handle of the wrong size");
  }
  std::memcpy(&handle, bytes.data(), sizeof(handle));
  // A worker on another GPU reaches the router's memory through peer access.
  CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(ptr, handle, cudaIpcMemLazyEnablePeerAccess));
  return absl::OkStatus();
}

absl::Status OpenEvent(const std::string& bytes, cudaEvent_t* event) {
  cudaIpcEventHandle_t handle;
  if (bytes.size() != sizeof(handle)) {
    return absl::InvalidArgumentError("CUDA IPC: an event handle of the wrong size");
  }
  std::memcpy(&handle, bytes.data(), sizeof(handle));
  CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(event, handle));
  return absl::OkStatus();
}

class WorkerLinkImpl : public WorkerLink {
 public:
  WorkerLinkImpl(const ModelConfig& config, gpu::DeviceExperts& experts)
      : config_(config), experts_(experts) {}
  ~WorkerLinkImpl() override { Close().IgnoreError(); }

  // Checks `views` against the model and this worker's buffers, then sets up graph steps.
  absl::Status Attach(const cuda_ipc::LinkViews& v, int max_tokens, bool owns_handles,
                      const std::string& stamps) {
    views_ = v;
    owns_handles_ = owns_handles;
    if (v.hidden_size != static_cast<uint32_t>(config_.hidden_size) || v.top_k == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA IPC buffers of hidden size ", v.hidden_size, " for a model of ",
                       config_.hidden_size, ": the router serves another model"));
    }
    if (v.max_tokens > static_cast<uint32_t>(max_tokens)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the router's steps hold up to ", v.max_tokens, " tokens and this worker's buffers ",
          max_tokens, ": give both the same --max-batch-tokens"));
    }
    if (v.flags != nullptr) {
      if (v.num_layers != static_cast<uint32_t>(config_.num_layers)) {
        return absl::FailedPreconditionError("CUDA IPC flags for another model");
      }
      ASSIGN_OR_RETURN(blocks_done_, gpu::DeviceBuffer<uint32_t>::Allocate(1));
      CUDA_RETURN_IF_ERROR(cudaMemset(blocks_done_.data(), 0, sizeof(uint32_t)));
    }
    if (!stamps.empty()) {
      ASSIGN_OR_RETURN(stamps_, gpu::ClockStamps::Open(stamps, "worker", 2 * config_.num_layers));
    }
    return absl::OkStatus();
  }

  // Opens the router's handles in this worker's own context (an opened event behaves like one
  // made here, which this device's streams may record and wait for).
  absl::Status Open(const v1::CudaIpcBuffers& b, int max_tokens, const std::string& stamps) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device()));
    owns_handles_ = true;  // whatever opens below is closed by Close, also on a failure
    cuda_ipc::LinkViews v;
    v.device = b.device();
    v.max_tokens = b.max_tokens();
    v.top_k = b.top_k();
    v.hidden_size = b.hidden_size();
    v.num_layers = b.num_layers();
    v.device_scope_flags = b.device_scope_flags();
    views_ = v;
    RETURN_IF_ERROR(OpenEvent(b.input_ready(), &views_.input_ready));
    RETURN_IF_ERROR(OpenEvent(b.output_ready(), &views_.output_ready));
    RETURN_IF_ERROR(OpenMemory(b.input(), &views_.input));
    void* ptr = nullptr;
    RETURN_IF_ERROR(OpenMemory(b.expert_ids(), &ptr));
    views_.ids = static_cast<int32_t*>(ptr);
    RETURN_IF_ERROR(OpenMemory(b.expert_weights(), &ptr));
    views_.weights = static_cast<float*>(ptr);
    RETURN_IF_ERROR(OpenMemory(b.output(), &views_.output));
    if (!b.flags().empty()) {
      RETURN_IF_ERROR(OpenMemory(b.flags(), &ptr));
      views_.flags = static_cast<uint32_t*>(ptr);
    }
    return Attach(views_, max_tokens, /*owns_handles=*/true, stamps);
  }

  absl::Status RunStep(const ExpertRequestView& r) override {
    if (views_.output_ready == nullptr) {
      return absl::FailedPreconditionError("CUDA IPC link closed");
    }
    if (views_.flags == nullptr) {
      return absl::FailedPreconditionError("the router shared no flags for graph steps");
    }
    cudaStream_t stream = experts_.context()->stream();
    // The router waited for the last step's output flags: that step is done, and the
    // synchronizing flush waits for nothing more.
    if (stamps_ != nullptr) RETURN_IF_ERROR(stamps_->Flush(stream));
    // Decoding repeats one step shape: the last graph is checked against it without a key.
    if (last_graph_ == nullptr || r.num_tokens != last_tokens_ || r.top_k != last_top_k_ ||
        !std::equal(r.layers.begin(), r.layers.end(), last_layers_.begin(), last_layers_.end())) {
      last_graph_ = nullptr;  // FindOrCapture may drop every graph
      ASSIGN_OR_RETURN(last_graph_, FindOrCapture(r, stream));
      last_tokens_ = r.num_tokens;
      last_top_k_ = r.top_k;
      last_layers_.assign(r.layers.begin(), r.layers.end());
    }
    RETURN_IF_ERROR(experts_.PrepareReplay());
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(last_graph_, stream));
    return absl::OkStatus();
  }

  absl::Status Run(const ExpertRequestView& r) override {
    // Everything is checked before anything is queued.
    if (views_.output_ready == nullptr) {
      return absl::FailedPreconditionError("CUDA IPC link closed");
    }
    if (r.layer >= static_cast<uint32_t>(config_.num_layers) || !config_.layer_is_moe[r.layer]) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", r.layer, " has no experts"));
    }
    if (r.num_tokens > views_.max_tokens || r.top_k == 0 || r.top_k > views_.top_k ||
        r.hidden_size != static_cast<uint32_t>(config_.hidden_size)) {
      return absl::InvalidArgumentError(absl::StrCat("device run of ", r.num_tokens, " tokens x ",
                                                     r.top_k, " does not fit the buffers"));
    }
    cudaStream_t stream = experts_.context()->stream();
    absl::Status status = Queue(r, stream);
    if (!status.ok()) cudaStreamSynchronize(stream);  // best effort
    return status;
  }

  absl::Status Close() override {
    if (views_.output_ready == nullptr && views_.input_ready == nullptr &&
        views_.input == nullptr) {
      return absl::OkStatus();
    }
    cudaSetDevice(device());
    // Unmapping waits for no one: let the queued runs finish first, but not forever.
    cudaStream_t stream = experts_.context()->stream();
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    cudaError_t state = cudaStreamQuery(stream);
    while (state == cudaErrorNotReady && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      state = cudaStreamQuery(stream);
    }
    if (state == cudaErrorNotReady) {
      return absl::UnavailableError(
          "the GPU stream is still blocked after the router left (an input event it never "
          "recorded); this worker must restart");
    }
    graphs_.clear();
    last_graph_ = nullptr;
    if (owns_handles_) {
      for (void* ptr :
           {views_.input, static_cast<void*>(views_.ids), static_cast<void*>(views_.weights),
            views_.output, static_cast<void*>(views_.flags)}) {
        if (ptr != nullptr) cudaIpcCloseMemHandle(ptr);
      }
      for (cudaEvent_t event : {views_.input_ready, views_.output_ready}) {
        if (event != nullptr) cudaEventDestroy(event);
      }
    }
    views_ = cuda_ipc::LinkViews();
    return absl::OkStatus();
  }

 private:
  int device() const { return experts_.context()->device(); }

  absl::Status Queue(const ExpertRequestView& r, cudaStream_t stream) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, views_.input_ready, 0));
    const int layer = static_cast<int>(r.layer);
    RETURN_IF_ERROR(experts_.PrepareLayer(layer, views_.ids, r.num_tokens, r.top_k));
    RETURN_IF_ERROR(experts_.RunExpertsInto(
        layer, static_cast<const gpu::bf16*>(views_.input), views_.ids, views_.weights,
        r.num_tokens, static_cast<int>(r.top_k), static_cast<gpu::bf16*>(views_.output)));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(views_.output_ready, stream));
    return absl::OkStatus();
  }

  // The graph for r's token count, top_k and layers: checked and captured the first time.
  absl::StatusOr<cudaGraphExec_t> FindOrCapture(const ExpertRequestView& r, cudaStream_t stream) {
    if (r.num_tokens == 0 || r.num_tokens > views_.max_tokens || r.top_k == 0 ||
        r.top_k > views_.top_k || r.hidden_size != static_cast<uint32_t>(config_.hidden_size) ||
        r.layers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("device step of ", r.num_tokens, " tokens x ",
                                                     r.top_k, " does not fit the buffers"));
    }
    for (int32_t layer : r.layers) {
      if (layer < 0 || layer >= config_.num_layers || !config_.layer_is_moe[layer]) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " has no experts"));
      }
    }
    std::string key = absl::StrCat(r.num_tokens, ":", r.top_k, ":");
    key.append(reinterpret_cast<const char*>(r.layers.data()), r.layers.size() * sizeof(int32_t));
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (graphs_.size() >= kMaxGraphs) {
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // none of them still running
        graphs_.clear();
      }
      ASSIGN_OR_RETURN(cudaGraphExec_t exec, Capture(r, stream));
      it = graphs_.emplace(std::move(key), GraphExec(exec)).first;
    }
    return it->second.get();
  }

  struct DestroyExec {
    void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
  };
  using GraphExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, DestroyExec>;
  // Batch sizes (the router's graphs go up to 64) x layer sets; all dropped beyond.
  static constexpr size_t kMaxGraphs = 128;

  absl::StatusOr<cudaGraphExec_t> Capture(const ExpertRequestView& r, cudaStream_t stream) {
    uint32_t* flags = views_.flags;
    // What the tables point at may change before the first replay (PrepareReplay).
    RETURN_IF_ERROR(experts_.PrepareReplay());
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    absl::Status queued = absl::OkStatus();
    for (int32_t layer : r.layers) {
      queued = gpu::WaitFlag(stream, flags + cuda_ipc::InputFlag(layer), 1);
      if (queued.ok() && stamps_ != nullptr) queued = stamps_->Mark(stream, 2 * layer);
      // The experts' last kernel clears the input flag and raises the output flag itself: no
      // flag operations of their own on the path between the two processes.
      gpu::GridSignal signal;
      signal.count = 1;
      signal.clear[0] = flags + cuda_ipc::InputFlag(layer);
      signal.raise[0] = flags + cuda_ipc::OutputFlag(config_.num_layers, layer);
      signal.done = blocks_done_.data();
      signal.system = !views_.device_scope_flags;
      if (queued.ok()) {
        queued =
            experts_.RunExpertsInto(layer, static_cast<const gpu::bf16*>(views_.input), views_.ids,
                                    views_.weights, r.num_tokens, static_cast<int>(r.top_k),
                                    static_cast<gpu::bf16*>(views_.output), signal);
      }
      if (queued.ok() && stamps_ != nullptr) queued = stamps_->Mark(stream, 2 * layer + 1);
      if (!queued.ok()) break;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!queued.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      return queued.ok() ? gpu::CudaStatus(ended, "cudaStreamEndCapture", __FILE__, __LINE__)
                         : queued;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_RETURN_IF_ERROR(made);
    return exec;
  }

  const ModelConfig& config_;
  gpu::DeviceExperts& experts_;
  cuda_ipc::LinkViews views_;
  bool owns_handles_ = false;                           // opened here: closed here
  gpu::DeviceBuffer<uint32_t> blocks_done_;             // the experts' GridSignal counter
  std::unique_ptr<gpu::ClockStamps> stamps_;            // profiling; null unless asked for
  absl::flat_hash_map<std::string, GraphExec> graphs_;  // by token count, top_k and layers
  // The last step's shape and graph (one of graphs_), reused while steps repeat it.
  cudaGraphExec_t last_graph_ = nullptr;
  uint32_t last_tokens_ = 0;
  uint32_t last_top_k_ = 0;
  std::vector<int32_t> last_layers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerLink>> OpenWorkerLink(const v1::CudaIpcBuffers& buffers,
                                                           const ModelConfig& config,
                                                           gpu::DeviceExperts& experts,
                                                           int max_tokens,
                                                           const std::string& clock_stamps) {
  auto link = std::make_unique<WorkerLinkImpl>(config, experts);
  RETURN_IF_ERROR(link->Open(buffers, max_tokens, clock_stamps));
  return link;
}

absl::StatusOr<std::unique_ptr<WorkerLink>> AttachWorkerLink(const cuda_ipc::LinkViews& views,
                                                             const ModelConfig& config,
                                                             gpu::DeviceExperts& experts,
                                                             int max_tokens) {
  auto link = std::make_unique<WorkerLinkImpl>(config, experts);
  RETURN_IF_ERROR(link->Attach(views, max_tokens, /*owns_handles=*/false, ""));
  return link;
}

#else

absl::StatusOr<std::unique_ptr<WorkerLink>> OpenWorkerLink(const v1::CudaIpcBuffers&,
                                                           const ModelConfig&, gpu::DeviceExperts&,
                                                           int, const std::string&) {
  return absl::UnimplementedError("this build has no CUDA backend (nvcc was not found)");
}

absl::StatusOr<std::unique_ptr<WorkerLink>> AttachWorkerLink(const cuda_ipc::LinkViews&,
                                                             const ModelConfig&,
                                                             gpu::DeviceExperts&, int) {
  return absl::UnimplementedError("this build has no CUDA backend (nvcc was not found)");
}

#endif

}  // namespace strata
