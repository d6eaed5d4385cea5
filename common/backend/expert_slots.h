// Expert memory of a tiered worker: a fixed number of equal slots in the backend's memory
// (device memory on a GPU, private host memory on a CPU), each holding the weights of one
// (layer, expert). The worker's tier manager decides what goes where; the backend that
// computes over the slots (ExpertSlots::backend) runs only experts that are bound.
#ifndef STRATA_COMMON_BACKEND_EXPERT_SLOTS_H_
#define STRATA_COMMON_BACKEND_EXPERT_SLOTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/backend/backend.h"
#include "common/model/model_weights.h"

namespace strata {

// The distinct experts of a layer's routing `ids` (slots of -1 skipped), in first-seen order,
// and the tokens of each (a token's slots name distinct experts). INVALID_ARGUMENT for an id
// >= num_experts, the others counted all the same. `position` is scratch: num_experts entries
// of -1, left so.
inline absl::Status DistinctExperts(absl::Span<const int32_t> ids, int num_experts,
                                    std::vector<int>& experts, std::vector<int64_t>& tokens,
                                    std::vector<int>& position) {
  experts.clear();
  tokens.clear();
  position.resize(num_experts, -1);
  absl::Status status;
  for (const int32_t e : ids) {
    if (e < 0) continue;
    if (e >= num_experts) {
      if (status.ok())
        status = absl::InvalidArgumentError(absl::StrCat("expert ", e, " out of range"));
      continue;
    }
    if (position[e] < 0) {
      position[e] = static_cast<int>(experts.size());
      experts.push_back(e);
      tokens.push_back(0);
    }
    ++tokens[position[e]];
  }
  for (int seen : experts) position[seen] = -1;
  return status;
}

// How often a replayed step used one (layer, expert): once per layer step that ran it.
struct ExpertUse {
  int layer = 0;
  int expert = 0;
  uint32_t count = 0;
};

// Computes some of an eager layer step's experts off the device while the device runs the
// others: strata-expert-store's CPU tier, where the cold experts' weights already are.
class HostExpertTier {
 public:
  virtual ~HostExpertTier() = default;
  // Starts the experts `ids` names ([n, top_k], -1 for the slots left to the device) of
  // `layer` on x ([n, hidden] float32) with the routing `weights` ([n, top_k]).
  virtual absl::Status Submit(int layer, int64_t n, int top_k, absl::Span<const float> x,
                              absl::Span<const int32_t> ids, absl::Span<const float> weights) = 0;
  // Waits for the submitted experts' weighted sums, [n, hidden] float32. Any error means the
  // tier is gone: the caller runs those experts itself, Abandons it and stops using it.
  virtual absl::Status Collect(Tensor& partial) = 0;
  // No answer outstanding will be collected: the tier must not be used again by anyone.
  virtual void Abandon() = 0;
};

// The tier manager's side of slots whose experts run on device arrays (a CUDA IPC worker,
// ExpertSlots::device_experts()): the slots tell it what is about to run or what ran, and it
// Loads and Releases in answer, on the same thread.
class SlotResidency {
 public:
  virtual ~SlotResidency() = default;
  // An eager layer step is about to run the distinct `experts` of `layer`, tokens[i] tokens
  // using experts[i]: count the uses and load the misses (they run once loaded). With a host
  // tier (`host` not null) the misses the cost model sends there are returned in `host`
  // instead, and stay cold.
  virtual absl::Status BeforeLayer(int layer, absl::Span<const int> experts,
                                   absl::Span<const int64_t> tokens, std::vector<int>* host) = 0;
  // Loads `experts` of `layer` without counting uses (the host tier failed for them), keeping
  // `keep` resident too.
  virtual absl::Status EnsureResident(int layer, absl::Span<const int> experts,
                                      absl::Span<const int> keep) = 0;
  // Replayed steps that finished used `uses`, counted on the device, misses read in place
  // (cold_readable_in_place): count them and load the misses worth a slot.
  virtual absl::Status AfterReplays(absl::Span<const ExpertUse> uses) = 0;
};

class ExpertSlots {
 public:
  virtual ~ExpertSlots() = default;

  virtual int num_slots() const = 0;
  // Bytes one slot takes (weights in the backend's format, scales and biases included).
  virtual uint64_t slot_bytes() const = 0;

  // Slots [0, n) of num_slots() are in use from here on; the memory of the others goes back
  // (a GPU's to the device, where another process can take it: the router's KV pool) until a
  // later call takes it again. Slots at or past n must be released first (FAILED_PRECONDITION
  // otherwise). RESOURCE_EXHAUSTED, with the slots as they were, when the memory to grow into
  // is not there.
  virtual absl::Status SetUsableSlots(int n) {
    if (n == num_slots()) return absl::OkStatus();
    return absl::UnimplementedError("these expert slots cannot give memory back");
  }
  virtual int usable_slots() const { return num_slots(); }

  // Copies `weights` (host memory: the expert store's shared memory) into `slot` and binds
  // the slot to (layer, expert), unbinding whatever the slot held. May return before the copy
  // has finished: RunExperts is ordered after it (a GPU waits on the copy's event).
  virtual absl::Status Load(int slot, int layer, int expert, const FfnWeights& weights) = 0;
  // Unbinds `slot`; a no-op when it holds nothing.
  virtual void Release(int slot) = 0;

  // Where an owned expert's weights are while no slot holds it (the expert store's memory): a
  // backend that can read them in place does so for a cold expert instead of failing.
  virtual absl::Status SetCold(int layer, int expert, const FfnWeights& weights) {
    return absl::OkStatus();
  }
  // Whether every expert SetCold named can be read in place.
  virtual bool cold_readable_in_place() const { return false; }

  // Pins `memory` (the expert store's shared-memory segments, once each) for slots in device
  // memory, so Loads from it are asynchronous DMA instead of copies through the driver's
  // staging; the memory must stay mapped until it is unregistered or the slots go. Host slots
  // read it as it is: nothing to do.
  virtual absl::Status RegisterHostMemory(absl::Span<const uint8_t> memory) {
    return absl::OkStatus();
  }
  // Undoes RegisterHostMemory (after the Loads from it have landed); a no-op for memory that
  // is not registered.
  virtual absl::Status UnregisterHostMemory(absl::Span<const uint8_t> memory) {
    return absl::OkStatus();
  }
  // Starts the copies of the Loads queued so far now instead of at the next run (a prefetch:
  // the copies overlap whatever runs before their layer). Host slots copy as they Load.
  virtual absl::Status StartLoads() { return absl::OkStatus(); }
  // Waits until every Load queued so far has landed (for measurements, tests and a worker's
  // warm start; RunExperts needs no such wait). Host slots copy as they Load.
  virtual absl::Status WaitForLoads() { return absl::OkStatus(); }

  // Runs bound experts only: every slot of `routing` with an expert id >= 0 must name a
  // (layer, expert) that is bound now (an error otherwise). Host `x` and host
  // `routing` in, host `out` back, as ExpertBackend::RunExperts.
  virtual ExpertBackend& backend() = 0;

  // The slots' experts run on device arrays (gpu::DeviceExperts), null when they cannot be;
  // `residency` (must outlive the slots, or be unset first) is told what runs there.
  virtual gpu::DeviceExperts* device_experts() { return nullptr; }
  virtual void SetResidency(SlotResidency* residency) {}
  // Eager device runs send the misses BeforeLayer picks to `tier` (must outlive the slots, or
  // be unset first); null: every miss is loaded. Slots that run no device arrays ignore it.
  virtual void SetHostTier(HostExpertTier* tier) {}
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_EXPERT_SLOTS_H_
