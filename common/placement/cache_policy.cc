#include "common/placement/cache_policy.h"

#include "absl/strings/str_cat.h"

namespace strata {
namespace placement_internal {

void RankedSet::Set(ExpertKey key, Entry entry) {
  auto [it, inserted] = entries_.try_emplace(key, entry);
  if (!inserted) {
    order_.erase({it->second.rank, it->second.last_use, key.layer, key.expert});
    it->second = entry;
  }
  order_.insert({entry.rank, entry.last_use, key.layer, key.expert});
}

bool RankedSet::Erase(ExpertKey key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  order_.erase({it->second.rank, it->second.last_use, key.layer, key.expert});
  entries_.erase(it);
  return true;
}

std::optional<ExpertKey> RankedSet::First(absl::FunctionRef<bool(ExpertKey)> accept) const {
  for (const auto& [rank, last_use, layer, expert] : order_) {
    if (accept(ExpertKey{layer, expert})) return ExpertKey{layer, expert};
  }
  return std::nullopt;
}

}  // namespace placement_internal

namespace {

absl::Status FullError(const ExpertCachePolicy& policy, ExpertKey key) {
  return absl::FailedPreconditionError(absl::StrCat("cannot admit layer ", key.layer, " expert ",
                                                    key.expert, ": all ", policy.capacity(),
                                                    " slots are taken"));
}

}  // namespace

void LruPolicy::Touch(ExpertKey key) {
  ++clock_;
  if (resident_.Contains(key)) resident_.Set(key, {0, clock_});
}

absl::Status LruPolicy::Admit(ExpertKey key) {
  if (resident_.Contains(key)) return absl::OkStatus();
  if (resident_.size() >= capacity_) return FullError(*this, key);
  resident_.Set(key, {0, ++clock_});
  return absl::OkStatus();
}

int64_t LruPolicy::Rank(ExpertKey key) const {
  const std::optional<placement_internal::RankedSet::Entry> entry = resident_.Get(key);
  return entry ? entry->last_use : clock_;
}

void LfuAgingPolicy::Touch(ExpertKey key) {
  if (halve_every_ > 0 && ++touches_ % halve_every_ == 0) Age();
  auto& entry = history_[key];
  ++entry.rank;
  entry.last_use = ++clock_;
  if (resident_.Contains(key)) resident_.Set(key, entry);
}

absl::Status LfuAgingPolicy::Admit(ExpertKey key) {
  if (resident_.Contains(key)) return absl::OkStatus();
  if (resident_.size() >= capacity_) return FullError(*this, key);
  auto& entry = history_[key];
  if (entry.last_use == 0) entry.last_use = ++clock_;  // admitted without a touch
  resident_.Set(key, entry);
  return absl::OkStatus();
}

int64_t LfuAgingPolicy::count(ExpertKey key) const {
  const auto it = history_.find(key);
  return it == history_.end() ? 0 : it->second.rank;
}

void LfuAgingPolicy::Age() {
  for (auto& [key, entry] : history_) {
    entry.rank /= 2;
    if (resident_.Contains(key)) resident_.Set(key, entry);
  }
}

CacheSimResult SimulateHitRate(ExpertCachePolicy& policy, absl::Span<const ExpertKey> trace) {
  CacheSimResult result;
  for (const ExpertKey& key : trace) {
    policy.Touch(key);
    if (policy.Contains(key)) {
      ++result.hits;
      continue;
    }
    ++result.misses;
    if (policy.capacity() == 0) continue;
    if (policy.size() >= policy.capacity()) policy.Erase(*policy.Victim());
    // Cannot fail: a slot was just freed.
    policy.Admit(key).IgnoreError();
  }
  return result;
}

}  // namespace strata
