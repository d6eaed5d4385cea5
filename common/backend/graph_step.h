// An expert backend's part in the router's decode-step CUDA graphs (common/engine/decode_graphs):
// what it must be told around the capture and each replay of a step whose expert work it does
// (ExpertBackend::graph_steps()).
#ifndef STRATA_COMMON_BACKEND_GRAPH_STEP_H_
#define STRATA_COMMON_BACKEND_GRAPH_STEP_H_

#include <cstdint>

#include "absl/status/status.h"

namespace strata {

class GraphStepExperts {
 public:
  virtual ~GraphStepExperts() = default;

  // 0 when this backend's work cannot be captured now (e.g. no worker connected); otherwise a
  // version that changes whenever a captured step would be stale (e.g. a worker came or
  // went), so the caller captures again.
  virtual uint64_t graph_version() const = 0;
  // Called before each replay of a captured step of `tokens` tokens is launched (e.g. to start
  // the workers' own graphs); an error means the step must run without the graph. A replay
  // may be begun and launched while the one before it is still in flight (after that one's
  // AwaitGraphStep); FinishStep then closes them in the order they were launched.
  virtual absl::Status BeginGraphStep(int64_t tokens) { return absl::OkStatus(); }
  // Called once the replay is launched, to confirm what BeginGraphStep started. An error means
  // the replay computes garbage: the backend has released whatever the replay waits for, and
  // the caller lets it finish, then runs the step without the graph.
  virtual absl::Status AwaitGraphStep() { return absl::OkStatus(); }
  // Called instead of a replay that could not be launched after BeginGraphStep succeeded:
  // whatever BeginGraphStep started must not wait for it.
  virtual void AbortGraphStep() {}
  // The caller brackets the capture of a decode step with true and false: a backend whose
  // captured exchanges differ from eager ones (flags on the device instead of messages)
  // records the step being captured then.
  virtual void SetGraphCapture(bool capturing) {}
  // Bytes of the experts used while in no GPU slot (a tiered worker's misses), since start; 0
  // when every expert is resident. A replay reads those in place from host memory; an eager
  // step may serve them better (the worker copies them in first, or shares them with the CPU
  // tier): the step runner tries eager steps while this grows fast (ReplayOrEager).
  virtual uint64_t missed_expert_bytes() const { return 0; }
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_GRAPH_STEP_H_
