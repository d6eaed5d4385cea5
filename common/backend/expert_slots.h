// Expert memory of a tiered worker: a fixed number of equal slots in the backend's memory
// (device memory on a GPU, private host memory on a CPU), each holding the weights of one
// (layer, expert). The worker's tier manager decides what goes where; the backend that
// computes over the slots (ExpertSlots::backend) runs only experts that are bound.
#ifndef STRATA_COMMON_BACKEND_EXPERT_SLOTS_H_
#define STRATA_COMMON_BACKEND_EXPERT_SLOTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/backend/backend.h"
#include "common/model/model_weights.h"

namespace strata {

class ExpertSlots {
 public:
  virtual ~ExpertSlots() = default;

  virtual int num_slots() const = 0;
  // Bytes one slot takes (weights in the backend's format, scales and biases included).
  virtual uint64_t slot_bytes() const = 0;

  // Copies `weights` (host memory: the expert store's shared memory) into `slot` and binds
  // the slot to (layer, expert), unbinding whatever the slot held. May return before the copy
  // has finished: RunExperts is ordered after it (a GPU waits on the copy's event).
  virtual absl::Status Load(int slot, int layer, int expert, const FfnWeights& weights) = 0;
  // Unbinds `slot`; a no-op when it holds nothing.
  virtual void Release(int slot) = 0;

  // Runs bound experts only: every slot of `routing` with an expert id >= 0 must name a
  // (layer, expert) that is bound now (an error otherwise). Host `x` and host
  // `routing` in, host `out` back, as ExpertBackend::RunExperts.
  virtual ExpertBackend& backend() = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_EXPERT_SLOTS_H_
