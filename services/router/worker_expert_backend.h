// The router's ExpertBackend over its workers: sends each worker only the tokens routed to the
// experts it owns, over that worker's connection (a shared-memory ring or a gRPC stream), and
// sums the partial results the workers send back. Placement, liveness and rerouting are here
// for every transport; IpcExpertBackend derives from it for workers on GPUs of this host.
#ifndef STRATA_SERVICES_ROUTER_WORKER_EXPERT_BACKEND_H_
#define STRATA_SERVICES_ROUTER_WORKER_EXPERT_BACKEND_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/backend/backend.h"
#include "common/model/model_config.h"
#include "common/placement/placement_plan.h"
#include "common/transport/expert_connection.h"

namespace strata {

struct WorkerExpertOptions {
  // Per layer exchange: the backstop for a worker whose liveness the transport cannot tell
  // (the shared-memory channels' heartbeats find a stopped one far sooner).
  absl::Duration timeout = absl::Seconds(60);
  // A worker of this host still stalled this long after it was declared failed is killed
  // (SIGKILL), for its supervisor to restart; infinite: never.
  absl::Duration kill_stalled_after = absl::Seconds(5);
};

// Why a worker stopped being used, since when.
struct WorkerFailure {
  bool stalled = false;  // its process ran but stopped answering (stopped, stuck, swapped out)
  std::string reason;
  absl::Time since;
  std::optional<ExpertConnection::Process> process;  // on this host, when known
  bool killed = false;                               // the router killed that process
};

class WorkerExpertBackend : public ExpertBackend {
 public:
  WorkerExpertBackend(const ModelConfig& config, PlacementPlan placement,
                      WorkerExpertOptions options);
  ~WorkerExpertBackend() override = default;

  // Installs (or replaces, after a restart) worker `index`'s connection; `wants_prefetch`: the
  // worker keeps only some experts resident and takes prefetch hints. Thread-safe.
  // `shares_memory`: the worker's memory is the router's (the same GPU, or both on the host's
  // CPUs), so it can lend slots to the KV pool.
  void SetConnection(int index, std::shared_ptr<ExpertConnection> connection,
                     bool wants_prefetch = false, bool shares_memory = false);
  bool shares_memory(int index) const;
  int num_connected() const;
  // Whether worker `index` is registered and its process alive.
  bool connected(int index) const;
  int num_workers() const { return num_workers_; }
  const PlacementPlan& placement() const { return placement_; }

  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;
  // Sends each worker that takes hints the predicted experts it would run.
  void Prefetch(int layer, const RoutingTable& predicted) override;
  bool wants_prefetch() const override;

  // The hot ratio every request carries to the workers (negative: leave theirs). Thread-safe.
  void set_hot_ratio(float ratio) { hot_ratio_.store(ratio); }
  float hot_ratio() const { return hot_ratio_.load(); }
  // The slots worker `index` is asked to lend to the KV pool, carried by every request (a
  // worker on the router's device sharing one budget with it; 0 otherwise). Thread-safe.
  void set_lent_slots(int index, uint32_t slots);
  uint32_t lent_slots(int index) const;
  // Worker `index`'s tier counters as of its last response. Thread-safe.
  TierCounters tiers(int index) const;

  // Layers that ran again because a worker failed during them or was gone.
  int64_t reroutes() const { return reroutes_.load(); }
  // What the gRPC connections of every worker, past and present, moved (they count into it).
  WireBytes& wire_bytes() { return wire_bytes_; }
  const WireBytes& wire_bytes() const { return wire_bytes_; }
  // Whether gRPC connections made from now on carry activations as FP8 (set before workers
  // register).
  void set_fp8_activations(bool fp8) { fp8_activations_.store(fp8); }
  bool fp8_activations() const { return fp8_activations_.load(); }

  // Notices the workers that failed since the last look, as the next layer would, so that an
  // idle router notices too: their connections are abandoned (a worker that comes back
  // registers again) and failure() says why; a worker of this host still stalled
  // kill_stalled_after later is killed, for its supervisor to restart. Thread-safe; the
  // router's monitor calls it often.
  void CheckWorkers();
  // Why worker `index` is not used, while it is not (nullopt while it is, and before its first
  // registration). Thread-safe.
  std::optional<WorkerFailure> failure(int index) const;

 protected:
  // Who runs each expert of `layer` now: its planned owner, or a survivor when that is gone.
  std::vector<int> EffectiveOwners(int layer, const std::vector<bool>& usable) const;
  std::vector<bool> Usable(const std::vector<std::shared_ptr<ExpertConnection>>& connections);
  // Worker `w` failed during a layer through `connection`: no layer uses that connection again.
  void Failed(int w, ExpertConnection& connection, const absl::Status& why);
  // One layer's exchange with `owner[expert]` as the placement. On a worker's failure sets
  // `failed` to its index (and leaves every other channel in step); RunExperts then runs the
  // layer again without that worker. This one moves host activations over the connections.
  virtual absl::Status Exchange(int layer, const Tensor& x, const RoutingTable& routing,
                                const std::vector<int>& owner,
                                const std::vector<std::shared_ptr<ExpertConnection>>& connections,
                                Tensor& out, int* failed);
  // Receives worker `w`'s response to `step` (skipping answers to abandoned earlier steps),
  // keeps its tier counters and hands it to `consume`, whose status is returned.
  absl::Status ReceiveResponse(int w, ExpertConnection& connection, uint64_t step,
                               absl::FunctionRef<absl::Status(const ExpertResponseView&)> consume,
                               bool* transport_failed);
  uint64_t NextStep() { return ++step_; }
  // A copy of the installed connections (null where none). Thread-safe.
  std::vector<std::shared_ptr<ExpertConnection>> Connections() const;
  const ModelConfig& config() const { return config_; }

 private:
  const ModelConfig& config_;
  PlacementPlan placement_;
  int num_workers_;
  WorkerExpertOptions options_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<ExpertConnection>> connections_;
  uint64_t step_ = 0;
  std::atomic<int64_t> reroutes_{0};
  WireBytes wire_bytes_;
  std::atomic<bool> fp8_activations_{false};
  std::atomic<float> hot_ratio_{-1.0f};
  std::unique_ptr<std::atomic<uint32_t>[]> lent_slots_;  // [worker]
  std::vector<TierCounters> tiers_;                      // guarded by mu_
  std::vector<bool> wants_prefetch_;                     // guarded by mu_
  std::vector<bool> shares_memory_;                      // guarded by mu_
  std::atomic<int> tiered_workers_{0};                   // workers registered with wants_prefetch
  std::vector<std::vector<int32_t>> prefetch_lists_;     // Prefetch's, by worker (engine thread)
  // Usable() then: a change is a worker gone or back (logged, failures_ kept). Read on every
  // layer without the lock, changed under mu_.
  std::unique_ptr<std::atomic<bool>[]> was_usable_;
  std::vector<bool> ever_usable_;                       // guarded by mu_
  std::vector<std::optional<WorkerFailure>> failures_;  // guarded by mu_
  // Per-worker staging, reused across calls.
  struct Staging {
    std::vector<int64_t> rows;  // token rows of x sent to this worker
    std::vector<float> hidden;
    std::vector<int32_t> experts;
    std::vector<float> weights;
  };
  std::vector<Staging> staging_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_WORKER_EXPERT_BACKEND_H_
