// Runs the router's per-layer messages on this worker: on a backend that holds every expert
// (no memory budget), or through the expert tiers (a budget), whose misses are copied from the
// expert store or computed by strata-expert-store's CPU tier.
#ifndef STRATA_SERVICES_EXPERT_WORKER_WORKER_EXECUTOR_H_
#define STRATA_SERVICES_EXPERT_WORKER_WORKER_EXECUTOR_H_

#include <vector>

#include "common/transport/expert_executor.h"
#include "services/expert-worker/expert_tiers.h"

namespace strata {

class CpuTierClient;

class WorkerExecutor {
 public:
  // Every expert resident in `backend`: each use counts as a hot hit.
  WorkerExecutor(const ModelConfig& config, ExpertBackend& backend);
  // Experts in `slots`, managed by `tiers`.
  WorkerExecutor(const ModelConfig& config, ExpertTiers& tiers, ExpertSlots& slots);

  // Sends the misses `choose` picks to strata-expert-store's CPU tier (null `client`: none).
  void SetCpuTier(CpuTierClient* client, ColdPathChooser choose);

  // A kRun request: the weighted sum of its experts per token into partial(). Applies the
  // request's hot ratio and lent slots first. Not thread-safe: one request at a time.
  absl::Status Run(const ExpertRequestView& request);
  // A kPrefetch message: starts loading the predicted experts.
  absl::Status Prefetch(const ExpertRequestView& request);
  // The router's hot ratio (negative: leave it) and the slots lent to its KV pool, of a
  // request the executor does not run itself (CUDA IPC runs on the device experts).
  absl::Status ApplyMemory(const ExpertRequestView& request);

  const Tensor& partial() const { return *result_; }
  TierCounters counters() const;

 private:
  // The distinct experts of the request and their token counts.
  absl::Status CountExperts(const ExpertRequestView& request);
  absl::Status RunOnCpuTier(const ExpertRequestView& request, const std::vector<int>& cpu);

  const ModelConfig& config_;
  ExpertTiers* tiers_ = nullptr;
  ExpertExecutor executor_;
  CpuTierClient* cpu_tier_ = nullptr;
  ColdPathChooser choose_cpu_;
  TierCounters untiered_;
  std::vector<int> experts_;
  std::vector<int64_t> tokens_;
  std::vector<int> position_;  // by expert id; -1 between calls
  std::vector<int> cpu_;       // this layer's experts for the CPU tier (reused)
  std::vector<int32_t> local_ids_, cpu_ids_;
  Tensor partial_, cpu_partial_;  // partial_: the sum when the CPU tier took a share
  const Tensor* result_ = &partial_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_WORKER_WORKER_EXECUTOR_H_
