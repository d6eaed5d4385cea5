// A worker's expert tiers over a fixed set of slots (GPU memory, or private host memory):
//  - hot:  hot_ratio x the experts it owns, the most activated by the calibration counts,
//          pinned in slots;
//  - warm: the remaining slots, filled on demand and emptied by a replacement policy;
//  - cold: everything else, read from the expert store's shared memory when used (copied into
//          a warm slot, or computed by strata-expert-store's CPU tier when the cost model says so);
//          on slots that read cold experts in place (a GPU's, over PCIe), replayed decode steps
//          run a miss from where it is and the tiers copy it in afterwards when it is worth a
//          slot (AfterReplays).
// Not thread-safe: the worker calls it from one thread at a time (its serving thread, or gRPC
// threads under the worker's lock).
#ifndef STRATA_SERVICES_EXPERT_WORKER_EXPERT_TIERS_H_
#define STRATA_SERVICES_EXPERT_WORKER_EXPERT_TIERS_H_

#include <cmath>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/backend/expert_slots.h"
#include "common/model/model_config.h"
#include "common/placement/cache_policy.h"
#include "common/transport/expert_wire.h"

namespace strata {

enum class WarmPolicy { kLru, kLfu };

struct ExpertTierOptions {
  WarmPolicy policy = WarmPolicy::kLfu;
  // LFU ages (halves every count) after this many uses; 0 picks 8 x the slot count.
  int64_t lfu_halve_every = 0;
  // Warm slots that must stay available however high the hot ratio: the most distinct experts
  // one request can need (one layer's experts, or tokens x top_k when fewer).
  int min_warm_slots = 0;
  // Misses of replayed steps (read in place) copied into warm slots per AfterReplays call at
  // most, over warm experts the policy ranks lower, and into slots still free: copies share
  // PCIe with the reads in place.
  int max_promotions = 4;
  int max_free_promotions = 16;
  // Fill the slots the hot set leaves free with the next-ranked owned experts, as warm ones,
  // when the owned set is given (a GPU worker: otherwise they stay empty until misses fill
  // them).
  bool warm_start = false;
};

struct OwnedExpert {
  int layer = 0;
  int expert = 0;
  uint64_t count = 0;  // calibration activations; 0 when unknown
};

// Whether a cold expert used by `tokens` tokens is computed on the CPU tier instead of copied;
// `first`: the first miss of a layer step (a chooser that shares a step's misses between the
// two paths starts its totals there).
using ColdPathChooser = std::function<bool(int layer, int expert, int64_t tokens, bool first)>;

class ExpertTiers : public SlotResidency {
 public:
  // `slots` and `store` (the cold tier) must outlive the tiers. InvalidArgument when there are
  // fewer slots than options.min_warm_slots.
  static absl::StatusOr<std::unique_ptr<ExpertTiers>> Create(const ModelConfig& config,
                                                             ExpertSlots& slots,
                                                             const ExpertWeightSource& store,
                                                             ExpertTierOptions options);

  // The experts this worker owns (after each registration) and the hot ratio: picks the hot
  // set and loads it.
  absl::Status SetOwned(std::vector<OwnedExpert> owned, float hot_ratio);
  // Re-picks the hot set for a new ratio in [0, 1]: experts leaving it become warm (evictable),
  // experts joining it are loaded now. A no-op when the ratio is unchanged.
  absl::Status SetHotRatio(float hot_ratio);
  float hot_ratio() const { return hot_ratio_; }
  // Gives the memory of `lent` slots back (the router's KV pool takes it: docs/tiers.md), or
  // takes it again when `lent` is lower: slots past the usable ones are emptied (a hot expert
  // there is loaded again below them) and their memory released. Never more than leaves the
  // hot set and min_warm_slots; lending less than asked is not an error (counters().lent_slots
  // says what is lent), nor is memory that is not back yet when taking it again.
  absl::Status SetLentSlots(int lent);
  int lent_slots() const { return slots_.num_slots() - slots_.usable_slots(); }

  // Makes the distinct `experts` of `layer` resident, `tokens[i]` tokens using experts[i]:
  // hits are counted, misses copied into warm slots (never evicting a hot expert or one of
  // `experts`), except the misses `cpu_path` picks, which are returned in `cpu` and stay cold.
  absl::Status Acquire(int layer, absl::Span<const int> experts, absl::Span<const int64_t> tokens,
                       const ColdPathChooser& cpu_path, std::vector<int>* cpu);
  // Copies `experts` of `layer` in without counting uses (the CPU tier failed for them),
  // keeping `keep` resident too.
  absl::Status EnsureResident(int layer, absl::Span<const int> experts,
                              absl::Span<const int> keep) override;
  // Starts loading the predicted experts of `layer` that are not resident, into warm slots
  // (the copies start now: ExpertSlots::StartLoads), as far as slots allow without evicting
  // other predictions not used yet. Those stay spared until `layer`'s request has come.
  absl::Status Prefetch(int layer, absl::Span<const int32_t> experts);

  // Hands the slots `tier` for their eager layer steps (ExpertSlots::SetHostTier) and keeps
  // `choose`, which picks the misses BeforeLayer sends there; null detaches both. `tier` must
  // outlive its attachment.
  void AttachHostTier(HostExpertTier* tier, ColdPathChooser choose) {
    slots_.SetHostTier(tier);
    host_chooser_ = tier != nullptr ? std::move(choose) : nullptr;
  }

  // SlotResidency. BeforeLayer is Acquire, with the host tier chooser when `host` is given.
  // AfterReplays counts each use as a hot hit, a warm hit or a miss (read in place), and copies
  // the misses the warm policy ranks above its victim into warm slots, max_promotions at most.
  absl::Status BeforeLayer(int layer, absl::Span<const int> experts,
                           absl::Span<const int64_t> tokens, std::vector<int>* host) override;
  absl::Status AfterReplays(absl::Span<const ExpertUse> uses) override;

  bool resident(int layer, int expert) const { return slot_of_.contains({layer, expert}); }
  const TierCounters& counters() const { return counters_; }

 private:
  ExpertTiers(const ModelConfig& config, ExpertSlots& slots, const ExpertWeightSource& store,
              ExpertTierOptions options);

  // The hot set the ratio asks for, before the slots cap it.
  int HotWanted() const {
    return static_cast<int>(std::lround(hot_ratio_ * static_cast<double>(owned_.size())));
  }
  int warm_capacity() const { return slots_.usable_slots() - static_cast<int>(hot_.size()); }
  absl::Status PickHotSet();
  // The owned experts, most wanted first: by calibration counts, or by the uses seen so far.
  std::vector<ExpertKey> Ranked() const;
  // Without calibration counts: once the uses seen reach 4 x the owned experts, and each time
  // they double, the hot set is picked again from them. Called before a request's experts are
  // looked at, so that nothing it needs is evicted after it was found.
  absl::Status RepickIfDue();
  absl::Status FillFreeSlots();
  // Evicts warm experts past the warm share, then loads the hot experts not resident.
  absl::Status FitWarmAndLoadHot();
  // Loads (layer, expert) into a free slot, evicting warm experts `protect` does not keep:
  // prefetched experts not used yet last, and with `spare_prefetched` never (a prediction does
  // not evict another's).
  absl::Status LoadInto(ExpertKey key, bool hot, const absl::flat_hash_set<ExpertKey>& protect,
                        bool spare_prefetched = false);
  void Evict(ExpertKey key);
  // `layer`'s prefetched experts not used yet are spared no longer.
  void ExpirePrefetched(int layer);

  const ModelConfig& config_;
  ExpertSlots& slots_;
  const ExpertWeightSource& store_;
  ExpertTierOptions options_;
  std::unique_ptr<ExpertCachePolicy> warm_;  // warm residents only
  std::vector<OwnedExpert> owned_;
  absl::flat_hash_map<ExpertKey, uint64_t> uses_;  // ranks the hot set without calibration
  absl::flat_hash_set<ExpertKey> hot_;             // the hot set (resident or being loaded)
  absl::flat_hash_map<ExpertKey, int> slot_of_;    // every resident expert
  std::vector<int> free_slots_;
  absl::flat_hash_set<ExpertKey> prefetched_;  // loaded by a prefetch, not used since
  float hot_ratio_ = -1.0f;
  bool calibrated_ = false;
  ColdPathChooser host_chooser_;
  uint64_t total_uses_ = 0;
  uint64_t next_repick_ = 0;  // total_uses_ at which the hot set is picked again; 0: never
  TierCounters counters_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_WORKER_EXPERT_TIERS_H_
