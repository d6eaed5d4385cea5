#include "services/expert-worker/expert_tiers.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {

ExpertTiers::ExpertTiers(const ModelConfig& config, ExpertSlots& slots,
                         const ExpertWeightSource& store, ExpertTierOptions options)
    : config_(config), slots_(slots), store_(store), options_(options) {}

absl::StatusOr<std::unique_ptr<ExpertTiers>> ExpertTiers::Create(const ModelConfig& config,
                                                                 ExpertSlots& slots,
                                                                 const ExpertWeightSource& store,
                                                                 ExpertTierOptions options) {
  if (slots.num_slots() < std::max(options.min_warm_slots, 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the expert memory budget holds ", slots.num_slots(), " expert slot(s) of ",
        slots.slot_bytes() >> 20, " MiB; at least ", std::max(options.min_warm_slots, 1),
        " are needed (the distinct experts one layer step can use)"));
  }
  std::unique_ptr<ExpertTiers> t(new ExpertTiers(config, slots, store, options));
  const int n = slots.num_slots();
  // The policy's own capacity is the whole pool; the warm share is enforced here, since it
  // moves with the hot ratio.
  if (options.policy == WarmPolicy::kLru) {
    t->warm_ = std::make_unique<LruPolicy>(n);
  } else {
    const int64_t halve = options.lfu_halve_every > 0 ? options.lfu_halve_every : 8LL * n;
    t->warm_ = std::make_unique<LfuAgingPolicy>(n, halve);
  }
  for (int s = slots.usable_slots() - 1; s >= 0; --s) t->free_slots_.push_back(s);
  t->counters_.slot_bytes = slots.slot_bytes();
  t->counters_.warm_slots = static_cast<uint32_t>(slots.usable_slots());
  return t;
}

absl::Status ExpertTiers::SetOwned(std::vector<OwnedExpert> owned, float hot_ratio) {
  for (const OwnedExpert& o : owned) {
    const FfnWeights* weights = store_.Find(o.layer, o.expert);
    if (weights == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("layer ", o.layer, " has no expert ", o.expert, " in the store"));
    }
    RETURN_IF_ERROR(slots_.SetCold(o.layer, o.expert, *weights));
  }
  owned_ = std::move(owned);
  calibrated_ =
      std::any_of(owned_.begin(), owned_.end(), [](const OwnedExpert& o) { return o.count > 0; });
  next_repick_ = calibrated_ ? 0 : 4 * std::max<uint64_t>(owned_.size(), 1);
  hot_ratio_ = -1.0f;  // forces a new pick
  RETURN_IF_ERROR(SetHotRatio(hot_ratio));
  return options_.warm_start ? FillFreeSlots() : absl::OkStatus();
}

std::vector<ExpertKey> ExpertTiers::Ranked() const {
  std::vector<std::pair<uint64_t, ExpertKey>> ranked;
  ranked.reserve(owned_.size());
  for (const OwnedExpert& o : owned_) {
    const ExpertKey key{o.layer, o.expert};
    const auto it = uses_.find(key);
    ranked.push_back({calibrated_ ? o.count : (it == uses_.end() ? 0 : it->second), key});
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<ExpertKey> keys;
  keys.reserve(ranked.size());
  for (const auto& [count, key] : ranked) keys.push_back(key);
  return keys;
}

absl::Status ExpertTiers::FillFreeSlots() {
  for (const ExpertKey& key : Ranked()) {
    if (free_slots_.empty() || warm_->size() >= warm_capacity()) break;
    if (slot_of_.contains(key)) continue;
    RETURN_IF_ERROR(LoadInto(key, /*hot=*/false, {}));
  }
  return absl::OkStatus();
}

absl::Status ExpertTiers::RepickIfDue() {
  if (next_repick_ == 0 || total_uses_ < next_repick_) return absl::OkStatus();
  next_repick_ *= 2;
  return PickHotSet();
}

absl::Status ExpertTiers::SetHotRatio(float hot_ratio) {
  if (!(hot_ratio >= 0.0f && hot_ratio <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("hot ratio ", hot_ratio, " is outside [0, 1]"));
  }
  if (hot_ratio == hot_ratio_) return absl::OkStatus();
  hot_ratio_ = hot_ratio;
  return PickHotSet();
}

absl::Status ExpertTiers::PickHotSet() {
  const std::vector<ExpertKey> ranked = Ranked();
  const int wanted = HotWanted();
  const int limit = slots_.usable_slots() - std::max(options_.min_warm_slots, 1);
  const int count = std::clamp(wanted, 0, std::max(limit, 0));

  absl::flat_hash_set<ExpertKey> next;
  for (int i = 0; i < count; ++i) next.insert(ranked[i]);
  // Leaving the hot set: resident ones become warm.
  for (const ExpertKey& key : hot_) {
    if (next.contains(key) || !slot_of_.contains(key)) continue;
    RETURN_IF_ERROR(warm_->Admit(key));
  }
  // Joining it: resident warm ones are pinned; the rest are loaded below.
  for (const ExpertKey& key : next) {
    if (warm_->Contains(key)) warm_->Erase(key);
  }
  hot_ = std::move(next);
  counters_.hot_slots = static_cast<uint32_t>(hot_.size());
  counters_.warm_slots = static_cast<uint32_t>(warm_capacity());
  return FitWarmAndLoadHot();
}

absl::Status ExpertTiers::FitWarmAndLoadHot() {
  while (warm_->size() > warm_capacity()) {
    const std::optional<ExpertKey> victim = warm_->Victim();
    if (!victim) break;
    Evict(*victim);
  }
  for (const ExpertKey& key : hot_) {
    if (!slot_of_.contains(key)) RETURN_IF_ERROR(LoadInto(key, /*hot=*/true, hot_));
  }
  return absl::OkStatus();
}

absl::Status ExpertTiers::SetLentSlots(int lent) {
  // The hot set and one layer step's worth of warm slots stay.
  const int floor = static_cast<int>(hot_.size()) + std::max(options_.min_warm_slots, 1);
  lent = std::clamp(lent, 0, std::max(slots_.num_slots() - floor, 0));
  const int usable = slots_.num_slots() - lent;
  const int before = slots_.usable_slots();
  if (usable == before) return absl::OkStatus();
  if (usable > before) {
    if (absl::Status grown = slots_.SetUsableSlots(usable); !grown.ok()) {
      // The memory is not back yet (another process holds it): stay as we are, asked again
      // with the next request.
      return absl::IsResourceExhausted(grown) ? absl::OkStatus() : grown;
    }
    for (int slot = usable - 1; slot >= before; --slot) free_slots_.push_back(slot);
    // Lowest slot first from the back, as at the start.
    std::sort(free_slots_.begin(), free_slots_.end(), std::greater<int>());
    // A hot set the lent slots had capped grows back to its ratio.
    if (hot_ratio_ >= 0.0f && static_cast<int>(hot_.size()) < HotWanted()) {
      RETURN_IF_ERROR(PickHotSet());
    }
  } else {
    std::vector<ExpertKey> leaving;
    for (const auto& [key, slot] : slot_of_) {
      if (slot >= usable) leaving.push_back(key);
    }
    for (const ExpertKey& key : leaving) Evict(key);
    RETURN_IF_ERROR(slots_.SetUsableSlots(usable));
    free_slots_.erase(std::remove_if(free_slots_.begin(), free_slots_.end(),
                                     [usable](int slot) { return slot >= usable; }),
                      free_slots_.end());
    // Hot experts that were in the slots given back come in again below.
    RETURN_IF_ERROR(FitWarmAndLoadHot());
  }
  counters_.lent_slots = static_cast<uint32_t>(slots_.num_slots() - slots_.usable_slots());
  counters_.warm_slots = static_cast<uint32_t>(warm_capacity());
  return options_.warm_start ? FillFreeSlots() : absl::OkStatus();
}

absl::Status ExpertTiers::LoadInto(ExpertKey key, bool hot,
                                   const absl::flat_hash_set<ExpertKey>& protect,
                                   bool spare_prefetched) {
  const FfnWeights* weights = store_.Find(key.layer, key.expert);
  if (weights == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("layer ", key.layer, " has no expert ", key.expert, " in the store"));
  }
  // A warm expert needs room in the warm share; any load needs a free slot.
  while (free_slots_.empty() || (!hot && warm_->size() >= warm_capacity())) {
    std::optional<ExpertKey> victim = warm_->Victim(
        [&](ExpertKey k) { return !protect.contains(k) && !prefetched_.contains(k); });
    if (!victim && !spare_prefetched) {
      victim = warm_->Victim([&](ExpertKey k) { return !protect.contains(k); });
    }
    if (!victim) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no expert slot to free for layer ", key.layer, " expert ", key.expert, " (",
                       slots_.num_slots(), " slots, ", hot_.size(), " hot)"));
    }
    Evict(*victim);
  }
  const int slot = free_slots_.back();
  RETURN_IF_ERROR(slots_.Load(slot, key.layer, key.expert, *weights));
  free_slots_.pop_back();
  slot_of_[key] = slot;
  counters_.bytes_copied += slots_.slot_bytes();
  if (!hot) RETURN_IF_ERROR(warm_->Admit(key));
  return absl::OkStatus();
}

void ExpertTiers::Evict(ExpertKey key) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return;
  slots_.Release(it->second);
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
  warm_->Erase(key);
  prefetched_.erase(key);
  ++counters_.evictions;
}

absl::Status ExpertTiers::Acquire(int layer, absl::Span<const int> experts,
                                  absl::Span<const int64_t> tokens, const ColdPathChooser& cpu_path,
                                  std::vector<int>* cpu) {
  // The layer's request has come: its predictions not used are ordinary warm experts now.
  absl::Cleanup expire = [this, layer] { ExpirePrefetched(layer); };
  cpu->clear();
  RETURN_IF_ERROR(RepickIfDue());
  total_uses_ += experts.size();
  std::vector<size_t> missing;
  for (size_t i = 0; i < experts.size(); ++i) {
    const ExpertKey key{layer, experts[i]};
    ++uses_[key];
    warm_->Touch(key);
    if (!slot_of_.contains(key)) {
      missing.push_back(i);
      continue;
    }
    if (hot_.contains(key)) {
      ++counters_.hot_hits;
    } else {
      ++counters_.warm_hits;
    }
    if (prefetched_.erase(key) > 0) ++counters_.prefetch_hits;
  }
  if (missing.empty()) return absl::OkStatus();  // the common case: no set to build
  absl::flat_hash_set<ExpertKey> protect;
  for (int e : experts) protect.insert({layer, e});
  bool first = true;  // the chooser has not been asked yet in this step
  for (size_t i : missing) {
    ++counters_.misses;
    const ExpertKey key{layer, experts[i]};
    const bool hot = hot_.contains(key);
    if (!hot && cpu_path && cpu_path(layer, experts[i], tokens[i], std::exchange(first, false))) {
      cpu->push_back(experts[i]);
      ++counters_.cpu_tier_experts;
      continue;
    }
    RETURN_IF_ERROR(LoadInto(key, hot, protect));
  }
  return absl::OkStatus();
}

void ExpertTiers::ExpirePrefetched(int layer) {
  absl::erase_if(prefetched_, [layer](const ExpertKey& key) { return key.layer == layer; });
}

absl::Status ExpertTiers::EnsureResident(int layer, absl::Span<const int> experts,
                                         absl::Span<const int> keep) {
  absl::flat_hash_set<ExpertKey> protect;
  for (int e : keep) protect.insert({layer, e});
  for (int e : experts) protect.insert({layer, e});
  for (int e : experts) {
    const ExpertKey key{layer, e};
    if (!slot_of_.contains(key)) RETURN_IF_ERROR(LoadInto(key, hot_.contains(key), protect));
  }
  return absl::OkStatus();
}

absl::Status ExpertTiers::BeforeLayer(int layer, absl::Span<const int> experts,
                                      absl::Span<const int64_t> tokens, std::vector<int>* host) {
  std::vector<int> cpu;
  if (host == nullptr) return Acquire(layer, experts, tokens, nullptr, &cpu);
  return Acquire(layer, experts, tokens, host_chooser_, host);
}

absl::Status ExpertTiers::AfterReplays(absl::Span<const ExpertUse> uses) {
  RETURN_IF_ERROR(RepickIfDue());
  std::vector<std::pair<int64_t, ExpertKey>> missed;  // by the policy's rank, best first
  for (const ExpertUse& use : uses) {
    const ExpertKey key{use.layer, use.expert};
    uses_[key] += use.count;
    total_uses_ += use.count;
    for (uint32_t i = 0; i < use.count; ++i) warm_->Touch(key);
    if (!slot_of_.contains(key)) {
      counters_.misses += use.count;
      missed.push_back({warm_->Rank(key), key});
    } else if (hot_.contains(key)) {
      counters_.hot_hits += use.count;
    } else {
      counters_.warm_hits += use.count;
    }
  }
  std::sort(missed.begin(), missed.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  int promoted = 0, into_free = 0;
  for (const auto& [rank, key] : missed) {
    const bool hot = hot_.contains(key);
    const bool free = !free_slots_.empty() && (hot || warm_->size() < warm_capacity());
    if (free ? into_free >= options_.max_free_promotions : promoted >= options_.max_promotions) {
      continue;
    }
    if (!hot && !free) {
      // Only over a warm expert the policy ranks lower: equals would swap places forever.
      const std::optional<ExpertKey> victim = warm_->Victim();
      if (!victim || warm_->Rank(*victim) >= rank) continue;
    }
    if (!LoadInto(key, hot, {}).ok()) continue;  // no slot to free: stays cold
    ++(free ? into_free : promoted);
  }
  return absl::OkStatus();
}

absl::Status ExpertTiers::Prefetch(int layer, absl::Span<const int32_t> experts) {
  absl::flat_hash_set<ExpertKey> protect;
  for (int e : experts) protect.insert({layer, e});
  int loaded = 0;
  for (int e : experts) {
    const ExpertKey key{layer, e};
    if (e < 0 || e >= config_.num_experts || slot_of_.contains(key)) continue;
    // Never let one prediction take more than the warm share.
    if (loaded + 1 > warm_capacity()) break;
    const absl::Status load = LoadInto(key, hot_.contains(key), protect, /*spare_prefetched=*/true);
    if (absl::IsResourceExhausted(load)) break;  // the slots hold other predictions
    RETURN_IF_ERROR(load);
    ++loaded;
    prefetched_.insert(key);
    ++counters_.prefetch_loads;
  }
  return loaded > 0 ? slots_.StartLoads() : absl::OkStatus();
}

}  // namespace strata
