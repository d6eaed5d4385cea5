#include "services/expert-worker/worker_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "services/expert-worker/cpu_tier_client.h"

namespace strata {

WorkerExecutor::WorkerExecutor(const ModelConfig& config, ExpertBackend& backend)
    : config_(config), executor_(config, backend) {}

WorkerExecutor::WorkerExecutor(const ModelConfig& config, ExpertTiers& tiers, ExpertSlots& slots)
    : config_(config), tiers_(&tiers), executor_(config, slots.backend()) {}

void WorkerExecutor::SetCpuTier(CpuTierClient* client, ColdPathChooser choose) {
  cpu_tier_ = client;
  choose_cpu_ = client == nullptr ? nullptr : std::move(choose);
}

TierCounters WorkerExecutor::counters() const {
  return tiers_ != nullptr ? tiers_->counters() : untiered_;
}

absl::Status WorkerExecutor::CountExperts(const ExpertRequestView& request) {
  return DistinctExperts(request.experts, config_.num_experts, experts_, tokens_, position_);
}

absl::Status WorkerExecutor::Run(const ExpertRequestView& request) {
  if (request.layer >= static_cast<uint32_t>(config_.num_layers) ||
      !config_.layer_is_moe[request.layer]) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", request.layer, " has no experts"));
  }
  RETURN_IF_ERROR(CountExperts(request));
  if (tiers_ == nullptr) {
    untiered_.hot_hits += experts_.size();
    RETURN_IF_ERROR(executor_.Run(request));
    result_ = &executor_.partial();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ApplyMemory(request));
  // choose_cpu_ is empty without a CPU tier (SetCpuTier); Acquire clears cpu_ first.
  RETURN_IF_ERROR(
      tiers_->Acquire(static_cast<int>(request.layer), experts_, tokens_, choose_cpu_, &cpu_));
  if (cpu_.empty()) {
    RETURN_IF_ERROR(executor_.Run(request));
    result_ = &executor_.partial();
    return absl::OkStatus();
  }
  result_ = &partial_;
  return RunOnCpuTier(request, cpu_);
}

absl::Status WorkerExecutor::ApplyMemory(const ExpertRequestView& request) {
  if (tiers_ == nullptr) return absl::OkStatus();
  const int lent = static_cast<int>(std::min<uint32_t>(request.lent_slots, 1u << 30));
  // Slots taken back before a higher ratio's hot set needs them; given back after a lower
  // ratio's has left them.
  if (lent < tiers_->lent_slots()) RETURN_IF_ERROR(tiers_->SetLentSlots(lent));
  if (request.hot_ratio >= 0.0f) RETURN_IF_ERROR(tiers_->SetHotRatio(request.hot_ratio));
  if (lent > tiers_->lent_slots()) RETURN_IF_ERROR(tiers_->SetLentSlots(lent));
  return absl::OkStatus();
}

absl::Status WorkerExecutor::Prefetch(const ExpertRequestView& request) {
  if (tiers_ == nullptr) return absl::OkStatus();  // everything is resident
  if (request.layer >= static_cast<uint32_t>(config_.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("prefetch: layer ", request.layer));
  }
  return tiers_->Prefetch(static_cast<int>(request.layer), request.experts);
}

absl::Status WorkerExecutor::RunOnCpuTier(const ExpertRequestView& request,
                                          const std::vector<int>& cpu) {
  local_ids_.assign(request.experts.begin(), request.experts.end());
  cpu_ids_.assign(local_ids_.size(), -1);
  // Mark the CPU tier's experts in position_ (by expert id, -1 between calls; ids were
  // range-checked by CountExperts) instead of searching `cpu` for every slot.
  constexpr int kOnCpuTier = -2;
  for (int e : cpu) position_[e] = kOnCpuTier;
  for (size_t i = 0; i < local_ids_.size(); ++i) {
    if (local_ids_[i] < 0 || position_[local_ids_[i]] != kOnCpuTier) continue;
    cpu_ids_[i] = local_ids_[i];
    local_ids_[i] = -1;
  }
  for (int e : cpu) position_[e] = -1;
  ExpertRequestView local = request, remote = request;
  local.experts = local_ids_;
  remote.experts = cpu_ids_;
  remote.hot_ratio = -1.0f;
  // The expert store computes its share while this worker computes the resident experts.
  absl::Status status = cpu_tier_->Submit(remote);
  bool local_done = false;
  if (status.ok()) {
    RETURN_IF_ERROR(executor_.Run(local));
    partial_ = executor_.partial();
    local_done = true;
    status = cpu_tier_->Collect(cpu_partial_, absl::Seconds(30));
    if (status.ok() && cpu_partial_.size() == partial_.size()) {
      for (int64_t i = 0; i < partial_.size(); ++i) partial_.data()[i] += cpu_partial_.data()[i];
      return absl::OkStatus();
    }
  }
  // strata-expert-store failed or went away: copy those experts in and run them here from now on.
  Log(LogLevel::kWarning,
      absl::StrCat("CPU tier failed (", status.message(), "); copying its experts instead"));
  // A late response would put the channel out of step: stop using it altogether (the GPU
  // path's host tier shares it).
  cpu_tier_->Abandon();
  SetCpuTier(nullptr, nullptr);
  const int layer = static_cast<int>(request.layer);
  RETURN_IF_ERROR(tiers_->EnsureResident(layer, cpu, experts_));
  if (!local_done) {
    RETURN_IF_ERROR(executor_.Run(request));
    partial_ = executor_.partial();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(executor_.Run(remote));
  const Tensor& rest = executor_.partial();
  for (int64_t i = 0; i < partial_.size(); ++i) partial_.data()[i] += rest.data()[i];
  return absl::OkStatus();
}

}  // namespace strata
