#include "services/expert-worker/cuda_ipc_link.h"

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
#include "common/backend/cuda/clock_stamps.h"
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/backend/cuda/cuda_status.h"
#include "common/backend/cuda/stream_flags.h"
#include "common/util/status_macros.h"
#endif

namespace strata {

#if STRATA_HAVE_CUDA
namespace {

class CudaIpcLinkImpl : public CudaIpcLink {
 public:
  CudaIpcLinkImpl(const ModelConfig& config, gpu::CudaExpertBackend& experts)
      : config_(config), experts_(experts) {}
  ~CudaIpcLinkImpl() override { Close().IgnoreError(); }

  absl::Status Open(const v1::CudaIpcBuffers& b, int max_tokens, const std::string& stamps) {
    if (b.hidden_size() != static_cast<uint32_t>(config_.hidden_size) || b.top_k() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA IPC buffers of hidden size ", b.hidden_size(), " for a model of ",
                       config_.hidden_size, ": the router serves another model"));
    }
    if (b.max_tokens() > static_cast<uint32_t>(max_tokens)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the router's steps hold up to ", b.max_tokens(), " tokens and this worker's buffers ",
          max_tokens, ": give both the same --max-batch-tokens"));
    }
    max_tokens_ = b.max_tokens();
    top_k_ = b.top_k();
    // Everything is opened in this worker's own context: an opened event behaves like one
    // made here, which this device's streams may record and wait for.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device()));
    RETURN_IF_ERROR(OpenEvent(b.input_ready(), &input_ready_));
    RETURN_IF_ERROR(OpenEvent(b.output_ready(), &output_ready_));
    RETURN_IF_ERROR(OpenMemory(b.input(), &input_));
    RETURN_IF_ERROR(OpenMemory(b.expert_ids(), &ids_));
    RETURN_IF_ERROR(OpenMemory(b.expert_weights(), &weights_));
    RETURN_IF_ERROR(OpenMemory(b.output(), &output_));
    if (!b.flags().empty()) {
      if (b.num_layers() != static_cast<uint32_t>(config_.num_layers)) {
        return absl::FailedPreconditionError("CUDA IPC flags for another model");
      }
      RETURN_IF_ERROR(OpenMemory(b.flags(), &flags_));
      device_scope_flags_ = b.device_scope_flags();
      ASSIGN_OR_RETURN(blocks_done_, gpu::DeviceBuffer<uint32_t>::Allocate(1));
      CUDA_RETURN_IF_ERROR(cudaMemset(blocks_done_.data(), 0, sizeof(uint32_t)));
    }
    if (!stamps.empty()) {
      ASSIGN_OR_RETURN(stamps_, gpu::ClockStamps::Open(stamps, "worker", 2 * config_.num_layers));
    }
    return absl::OkStatus();
  }

  absl::Status RunStep(const ExpertRequestView& r) override {
    if (output_ready_ == nullptr) return absl::FailedPreconditionError("CUDA IPC link closed");
    if (flags_ == nullptr) {
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
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(last_graph_, stream));
    return absl::OkStatus();
  }

  absl::Status Run(const ExpertRequestView& r) override {
    // Everything is checked before anything is queued.
    if (output_ready_ == nullptr) return absl::FailedPreconditionError("CUDA IPC link closed");
    if (r.layer >= static_cast<uint32_t>(config_.num_layers) || !config_.layer_is_moe[r.layer]) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", r.layer, " has no experts"));
    }
    if (r.num_tokens > max_tokens_ || r.top_k == 0 || r.top_k > top_k_ ||
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
    if (output_ready_ == nullptr && input_ready_ == nullptr && input_ == nullptr) {
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
    for (void** ptr : {&input_, &ids_, &weights_, &output_, &flags_}) {
      if (*ptr != nullptr) cudaIpcCloseMemHandle(*ptr);
      *ptr = nullptr;
    }
    for (cudaEvent_t* event : {&input_ready_, &output_ready_}) {
      if (*event != nullptr) cudaEventDestroy(*event);
      *event = nullptr;
    }
    return absl::OkStatus();
  }

 private:
  int device() const { return experts_.context()->device(); }

  absl::Status Queue(const ExpertRequestView& r, cudaStream_t stream) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, input_ready_, 0));
    RETURN_IF_ERROR(experts_.RunExpertsInto(
        static_cast<int>(r.layer), static_cast<const gpu::bf16*>(input_),
        static_cast<const int32_t*>(ids_), static_cast<const float*>(weights_), r.num_tokens,
        static_cast<int>(r.top_k), static_cast<gpu::bf16*>(output_)));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(output_ready_, stream));
    return absl::OkStatus();
  }

  // The graph for r's token count, top_k and layers: checked and captured the first time.
  absl::StatusOr<cudaGraphExec_t> FindOrCapture(const ExpertRequestView& r, cudaStream_t stream) {
    if (r.num_tokens == 0 || r.num_tokens > max_tokens_ || r.top_k == 0 || r.top_k > top_k_ ||
        r.hidden_size != static_cast<uint32_t>(config_.hidden_size) || r.layers.empty()) {
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
    uint32_t* in_flags = static_cast<uint32_t*>(flags_);
    uint32_t* out_flags = in_flags + config_.num_layers;
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    absl::Status queued = absl::OkStatus();
    for (int32_t layer : r.layers) {
      queued = gpu::WaitFlag(stream, in_flags + layer, 1);
      if (queued.ok() && stamps_ != nullptr) queued = stamps_->Mark(stream, 2 * layer);
      // The experts' last kernel clears the input flag and raises the output flag itself: no
      // flag operations of their own on the path between the two processes.
      gpu::GridSignal signal;
      signal.count = 1;
      signal.clear[0] = in_flags + layer;
      signal.raise[0] = out_flags + layer;
      signal.done = blocks_done_.data();
      signal.system = !device_scope_flags_;
      if (queued.ok()) {
        queued = experts_.RunExpertsInto(
            layer, static_cast<const gpu::bf16*>(input_), static_cast<const int32_t*>(ids_),
            static_cast<const float*>(weights_), r.num_tokens, static_cast<int>(r.top_k),
            static_cast<gpu::bf16*>(output_), signal);
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

  static absl::Status OpenMemory(const std::string& bytes, void** ptr) {
    cudaIpcMemHandle_t handle;
    if (bytes.size() != sizeof(handle)) {
      return absl::InvalidArgumentError("CUDA IPC: a memory handle of the wrong size");
    }
    std::memcpy(&handle, bytes.data(), sizeof(handle));
    // A worker on another GPU reaches the router's memory through peer access.
    CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(ptr, handle, cudaIpcMemLazyEnablePeerAccess));
    return absl::OkStatus();
  }

  static absl::Status OpenEvent(const std::string& bytes, cudaEvent_t* event) {
    cudaIpcEventHandle_t handle;
    if (bytes.size() != sizeof(handle)) {
      return absl::InvalidArgumentError("CUDA IPC: an event handle of the wrong size");
    }
    std::memcpy(&handle, bytes.data(), sizeof(handle));
    CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(event, handle));
    return absl::OkStatus();
  }

  const ModelConfig& config_;
  gpu::CudaExpertBackend& experts_;
  uint32_t max_tokens_ = 0;
  uint32_t top_k_ = 0;
  void* input_ = nullptr;
  void* ids_ = nullptr;
  void* weights_ = nullptr;
  void* output_ = nullptr;
  void* flags_ = nullptr;            // uint32 [2][num_layers]: input flags, then output flags
  bool device_scope_flags_ = false;  // the router's decision (CudaIpcBuffers)
  gpu::DeviceBuffer<uint32_t> blocks_done_;             // the experts' GridSignal counter
  std::unique_ptr<gpu::ClockStamps> stamps_;            // profiling; null unless asked for
  absl::flat_hash_map<std::string, GraphExec> graphs_;  // by token count, top_k and layers
  // The last step's shape and graph (one of graphs_), reused while steps repeat it.
  cudaGraphExec_t last_graph_ = nullptr;
  uint32_t last_tokens_ = 0;
  uint32_t last_top_k_ = 0;
  std::vector<int32_t> last_layers_;
  cudaEvent_t input_ready_ = nullptr;
  cudaEvent_t output_ready_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcLink>> OpenCudaIpcLink(const v1::CudaIpcBuffers& buffers,
                                                             const ModelConfig& config,
                                                             gpu::CudaExpertBackend& experts,
                                                             int max_tokens,
                                                             const std::string& clock_stamps) {
  auto link = std::make_unique<CudaIpcLinkImpl>(config, experts);
  RETURN_IF_ERROR(link->Open(buffers, max_tokens, clock_stamps));
  return link;
}

#else

absl::StatusOr<std::unique_ptr<CudaIpcLink>> OpenCudaIpcLink(const v1::CudaIpcBuffers&,
                                                             const ModelConfig&,
                                                             gpu::CudaExpertBackend&, int,
                                                             const std::string&) {
  return absl::UnimplementedError("this build has no CUDA backend (nvcc was not found)");
}

#endif

}  // namespace strata
