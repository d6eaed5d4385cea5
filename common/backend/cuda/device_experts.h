// Experts run on raw device arrays of the caller's (ExpertBackend::device_experts()): a worker's
// end of TRANSPORT_CUDA_IPC hands them the router's buffers, opened by CUDA IPC, layer by layer
// (eagerly) or as a captured decode step (graph replays).
#ifndef STRATA_COMMON_BACKEND_CUDA_DEVICE_EXPERTS_H_
#define STRATA_COMMON_BACKEND_CUDA_DEVICE_EXPERTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/cuda_types.h"
#include "common/cuda/grid_signal.h"

namespace strata::gpu {

class DeviceExperts {
 public:
  virtual ~DeviceExperts() = default;

  // The context whose stream the runs are queued on.
  virtual CudaContext* context() const = 0;

  // out[t] = sum over the slots s of token t of weights[t][s] * expert ids[t][s] (x[t]), on
  // layer `layer`'s experts: x [n, hidden] bf16, ids and weights [n, top_k] (an id of -1 skips
  // the slot), out [n, hidden] bf16; then raises `signal`. Queued on the context's stream and
  // capturable: what it reads of the experts is found through device tables at run time.
  virtual absl::Status RunExpertsInto(int layer, const bf16* x, const int32_t* ids,
                                      const float* weights, int64_t n, int top_k, bf16* out,
                                      const GridSignal& signal = {}) = 0;

  // Eager runs: called before RunExpertsInto with the step's routing still on the device
  // (`ids`, [n, top_k]) and the stream ordered after whatever wrote it; a backend whose experts
  // are not all resident makes the used ones readable first. The default has nothing to do.
  virtual absl::Status PrepareLayer(int layer, const int32_t* ids, int64_t n, int top_k) {
    return absl::OkStatus();
  }

  // Graph steps: called before each captured step is launched on the stream (the place where
  // changes to what the tables point at land between replays): quick, it is on the step's
  // path. The default has none.
  virtual absl::Status PrepareReplay() { return absl::OkStatus(); }

  // Called once the router has its answer to a step (off the step's path): a backend whose
  // experts are not all resident learns what finished replays used and decides what to load
  // next (landing at a later PrepareReplay). The default has nothing to do.
  virtual absl::Status AfterReply() { return absl::OkStatus(); }
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_DEVICE_EXPERTS_H_
