// The worker's end of TRANSPORT_CUDA_IPC (link_views.h): the router's device buffers and
// interprocess events, opened once per registration, and each layer's run on them. Plain C++
// here; without CUDA in the build, opening fails with UNIMPLEMENTED.
#ifndef STRATA_COMMON_TRANSPORT_CUDA_IPC_WORKER_LINK_H_
#define STRATA_COMMON_TRANSPORT_CUDA_IPC_WORKER_LINK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/transport/cuda_ipc/link_views.h"
#include "common/transport/expert_wire.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

namespace gpu {
class DeviceExperts;
}  // namespace gpu

class WorkerLink {
 public:
  virtual ~WorkerLink() = default;

  // Queues one kDeviceRun on the experts' stream: wait for the router's input event, run the
  // request's experts from the shared input and routing into this worker's output buffer,
  // record the output event. Returns once queued (the router waits on the event). On an
  // error the stream is drained first, so that the router may reuse the buffers at once.
  virtual absl::Status Run(const ExpertRequestView& request) = 0;

  // Queues one kDeviceStep: replays this worker's graph for the request's token count and
  // layers (captured the first time they are seen): per layer, wait for the router's input
  // flag, run the experts, whose last kernel clears it and raises the output flag. Returns
  // once queued.
  virtual absl::Status RunStep(const ExpertRequestView& request) = 0;

  // Lets queued work finish (within a few seconds) and closes the handles. UNAVAILABLE when
  // the stream stays blocked, e.g. on an input event of a router that died before recording
  // it: the worker must then restart.
  virtual absl::Status Close() = 0;
};

// Opens `buffers` (the router's handles) on the device of `experts`, whose steps hold at most
// `max_tokens` tokens. Profiling: with a `clock_stamps` path, graph steps stamp the GPU clock
// per layer (slot 2 * layer + 0 once the input flag was seen, + 1 after the experts, whose last
// kernel raised the output flag), appended to that file at the next step.
absl::StatusOr<std::unique_ptr<WorkerLink>> OpenWorkerLink(const v1::CudaIpcBuffers& buffers,
                                                           const ModelConfig& config,
                                                           gpu::DeviceExperts& experts,
                                                           int max_tokens,
                                                           const std::string& clock_stamps = "");

// The same over buffers this process addresses already (`views`, e.g. a router's own in a
// test that runs both ends in one process); closing leaves them to their owner.
absl::StatusOr<std::unique_ptr<WorkerLink>> AttachWorkerLink(const cuda_ipc::LinkViews& views,
                                                             const ModelConfig& config,
                                                             gpu::DeviceExperts& experts,
                                                             int max_tokens);

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_CUDA_IPC_WORKER_LINK_H_
