// The router's ExpertBackend when the router runs on a GPU and its workers run on GPUs of the
// same host (TRANSPORT_CUDA_IPC, common/transport/cuda_ipc/link_views.h): activations never leave
// the device. Per MoE layer the router's stream copies the layer's input into the buffer every
// worker reads and writes each worker's routing (other workers' experts -1); eager steps then
// hand each worker the layer by an event and a kDeviceRun message, and the router's stream
// waits for the workers' output events and sums the partials. Placement, liveness and
// rerouting are WorkerExpertBackend's.
//
// Decode steps replayed as CUDA graphs (DecodeGraphs; ipc_graph_steps.cc) hand layers over by
// flags: each captured layer's routing split (or the router's gate kernel, TakeHandOff) also
// raises the workers' input flags, and the router's stream waits for their output flags. A
// worker on another GPU raises them through its peer mapping (the GPUs need native peer
// atomics, as NVLink has). BeginGraphStep sends each worker one kDeviceStep message with its
// layers, which replays the worker's own graph; the router launches its own replay before it
// collects the answers (AwaitGraphStep), so that the workers' wake-up and launches overlap its
// own. The next step's replay may be begun while this one runs: each side's stream queues it
// behind its own, and the flags are never raised for the next step before this one lowered
// them.
//
// A worker that dies before answering costs its layer, which runs again on the others (as
// WorkerExpertBackend does). One that dies after answering is the watchdog's (ipc_watchdog.h):
// FinishStep then aborts the step so that it runs again without that worker.
#ifndef STRATA_SERVICES_ROUTER_IPC_EXPERT_BACKEND_H_
#define STRATA_SERVICES_ROUTER_IPC_EXPERT_BACKEND_H_

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/graph_step.h"
#include "common/cuda/clock_stamps.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/cuda_types.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kernels/expert_split_kernels.h"
#include "common/cuda/kernels/norm_gate_kernels.h"
#include "common/transport/cuda_ipc/router_link.h"
#include "services/router/cuda_ipc_connection.h"
#include "services/router/ipc_watchdog.h"
#include "services/router/shm_expert_connection.h"
#include "services/router/worker_expert_backend.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

class IpcExpertBackend : public WorkerExpertBackend,
                         public GraphStepExperts,
                         public gpu::GateHandOffSource {
 public:
  // Buffers for steps of up to `max_tokens` tokens on `context`'s device, whose stream the
  // router backend uses; the context must outlive the backend.
  static absl::StatusOr<std::unique_ptr<IpcExpertBackend>> Create(const ModelConfig& config,
                                                                  PlacementPlan placement,
                                                                  WorkerExpertOptions options,
                                                                  gpu::CudaContext* context,
                                                                  int max_tokens);
  ~IpcExpertBackend() override;

  // ABORTED when the watchdog released a dead worker's output event during the step.
  absl::Status FinishStep() override;

  // After a captured one-token layer with one worker: its output flag, which the combine waits
  // for itself; else null.
  const uint32_t* output_ready_flag() const override { return output_ready_flag_; }

  GraphStepExperts* graph_steps() override { return this; }
  // Changes whenever a worker registers again or comes or goes, or a layer's owners change;
  // 0 while none is connected over CUDA IPC, or while one connected cannot run graph steps.
  uint64_t graph_version() const override;
  // Sends each worker of the captured step its kDeviceStep. UNAVAILABLE when one fails, or
  // when a worker's connection is not the one the graphs were captured with; the workers
  // already started are run out first.
  absl::Status BeginGraphStep(int64_t tokens) override;
  // Waits for the workers' answers (their graphs queued, not run). UNAVAILABLE when one did
  // not start: its output flags are raised from a side stream so that the replay finishes.
  absl::Status AwaitGraphStep() override;
  void AbortGraphStep() override;
  void SetGraphCapture(bool capturing) override;
  // The tiered workers' misses (their counters as of their last answers) times their slots'
  // bytes.
  uint64_t missed_expert_bytes() const override;

  // In a capture without clock stamps: the layer's split and input flags, for the router's gate
  // kernel to do (its Exchange then launches no split kernel). Engine thread.
  void TakeHandOff(int layer, int64_t n, gpu::GateHandOff& hand_off) override;

  // Profiling: replayed steps stamp the GPU clock per MoE layer (slot 3 * layer + 0 before the
  // input copy, + 1 once the input flags are raised, + 2 once the output flags were seen) and
  // FinishStep appends them to `path`.
  absl::Status StampClocks(const std::string& path);

  // Allocates worker `index`'s buffers and events, writes their handles into `buffers` and
  // wraps `channel`; install the result with SetConnection. worker_gpu_uuid: the worker's GPU
  // (gpu::GpuUuid; empty when unknown); graph_steps: it can run captured decode steps. Any
  // thread.
  absl::StatusOr<std::shared_ptr<ExpertConnection>> Attach(
      int index, std::unique_ptr<ShmExpertConnection> channel, v1::CudaIpcBuffers& buffers,
      const std::string& worker_gpu_uuid, bool graph_steps);
  // What Attach last exported for worker `index`, as addresses of this process: for a worker's
  // end in the same process (AttachWorkerLink), which cannot open the handles. NOT_FOUND before
  // Attach.
  absl::StatusOr<cuda_ipc::LinkViews> AttachedViews(int index);

 protected:
  // `x` and `routing` on the router's device; `out` becomes a device view [n, hidden] bf16.
  absl::Status Exchange(int layer, const Tensor& x, const RoutingTable& routing,
                        const std::vector<int>& owner,
                        const std::vector<std::shared_ptr<ExpertConnection>>& connections,
                        Tensor& out, int* failed) override;

 private:
  IpcExpertBackend(const ModelConfig& config, PlacementPlan placement, WorkerExpertOptions options,
                   gpu::CudaContext* context, int max_tokens)
      : WorkerExpertBackend(config, std::move(placement), options),
        context_(context),
        max_tokens_(max_tokens) {}
  // Each worker's CUDA IPC link where its connection in `connections` (a snapshot of
  // Connections()) is the one Attach made, null elsewhere; Links() for the current ones.
  std::vector<std::shared_ptr<CudaIpcConnection>> LinksOf(
      const std::vector<std::shared_ptr<ExpertConnection>>& connections) const;
  std::vector<std::shared_ptr<CudaIpcConnection>> Links() const { return LinksOf(Connections()); }
  // The workers that run an expert of `owner` and their links, checked to be connected over
  // CUDA IPC (else UNAVAILABLE, with `failed` set).
  absl::Status LinksFor(const std::vector<int>& owner,
                        const std::vector<std::shared_ptr<ExpertConnection>>& connections,
                        std::vector<int>& workers,
                        std::vector<std::shared_ptr<CudaIpcConnection>>& links, int* failed) const;
  // Each worker's routing buffers, and in a capture the flags that hand `layer` to them.
  void PlanSplit(int layer, const std::vector<int>& workers,
                 const std::vector<std::shared_ptr<CudaIpcConnection>>& links,
                 gpu::RoutingSplit& split, gpu::GridSignal& signal);
  // Puts `owner` (expert -> worker) for `layer` on the device when it changed.
  absl::Status UploadOwners(int layer, const std::vector<int>& owner);
  // out = the partials' sum ([n, hidden]; a single partial is viewed in place, `holder`
  // keeping its buffer alive).
  absl::Status SumPartials(const gpu::PartialSet& partials, int64_t n, std::shared_ptr<void> holder,
                           Tensor& out);
  // The captured part of Exchange: flags instead of messages and events. combine_waits (one
  // worker): the wait for its output flag is left to the combine (output_ready_flag_).
  absl::Status CaptureExchange(int layer, const std::vector<int>& workers,
                               const std::vector<std::shared_ptr<CudaIpcConnection>>& links,
                               const std::vector<std::shared_ptr<ExpertConnection>>& connections,
                               bool combine_waits, gpu::PartialSet& partials);
  // Receives the answers to BeginGraphStep's messages: started_ gets the workers that started,
  // `failed` the others.
  absl::Status CollectAnswers(std::vector<int>& failed);
  // Runs out the graphs of workers that were started for a step that will not replay: layer by
  // layer on the router's stream, signals as a replay's split kernel does and waits for the
  // output flag (a worker that dies meanwhile is released by the watchdog). Best effort over
  // all of them.
  absl::Status RunOut();
  // The workers of a replay that will not be launched are no longer awaited: drops their
  // graph_awaited count and clears started_.
  void ClearStarted();

  gpu::CudaContext* context_;
  int max_tokens_;
  // By worker index, the connection Attach made last (not held: SetConnection holds it, and
  // may replace it by another kind).
  mutable std::mutex attached_mu_;
  std::vector<std::weak_ptr<CudaIpcConnection>> attached_;
  gpu::DeviceBuffer<gpu::bf16> input_;             // [max_tokens, hidden], read by every worker
  gpu::DeviceBuffer<gpu::bf16> sum_;               // [max_tokens, hidden]: the partials' sum
  gpu::DeviceBuffer<int32_t> owners_;              // [num_layers][num_experts]
  gpu::DeviceBuffer<uint32_t> blocks_done_;        // the split kernel's GridSignal counter
  std::vector<std::vector<int>> uploaded_owners_;  // what owners_ holds, by layer
  std::shared_ptr<void> keep_alive_ = std::make_shared<int>(0);
  std::atomic<uint64_t> next_generation_{1};
  std::atomic<uint64_t> owners_version_{0};  // bumped whenever owners_ changes
  // Per worker, the MoE layers of the last captured step and the connection whose buffers
  // and flags it uses (held: the graphs point into them). Engine thread.
  std::vector<std::vector<int32_t>> graph_layers_;
  std::vector<std::shared_ptr<CudaIpcConnection>> graph_connections_;
  // The layer the router's gate kernel is handing off (TakeHandOff) and to which workers'
  // connections (held: the gate kernel writes into their buffers); its Exchange checks them
  // and launches no split. -1: none. Engine thread.
  int handed_off_layer_ = -1;
  // By worker index; null where the worker has none of the layer's experts.
  std::vector<std::shared_ptr<ExpertConnection>> handed_off_connections_;
  bool capturing_ = false;                       // between SetGraphCapture(true) and (false)
  const uint32_t* output_ready_flag_ = nullptr;  // the last Exchange's; engine thread
  // The replay BeginGraphStep announced: its step, tokens, the workers told and those started
  // (until AwaitGraphStep).
  uint64_t graph_step_ = 0;
  int64_t step_tokens_ = 0;
  std::vector<int> sent_;
  std::vector<int> started_;
  // Launched replays not yet finished (at most two: one may be launched behind another), oldest
  // first: the workers each one started.
  std::deque<std::vector<std::shared_ptr<CudaIpcConnection>>> awaited_steps_;
  // Workers that did not start a launched replay: their flags are cleared once it is over.
  std::vector<std::shared_ptr<CudaIpcConnection>> reset_flags_;
  std::unique_ptr<gpu::ClockStamps> stamps_;  // profiling; null unless StampClocks
  // Recorded on the router's stream by BeginGraphStep when a replay is still in flight
  // (earlier_in_flight_): that replay's end, which releases for a replay behind it wait for
  // on deferred_stream_. Engine thread.
  cudaStream_t deferred_stream_ = nullptr;
  cudaEvent_t earlier_done_ = nullptr;
  bool earlier_in_flight_ = false;
  std::unique_ptr<IpcWatchdog> watchdog_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_IPC_EXPERT_BACKEND_H_
