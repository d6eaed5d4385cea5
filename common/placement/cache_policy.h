// Which expert to evict from a worker's fixed number of warm expert slots (GPU memory), and a
// trace simulator to compare policies by hit rate.
//
// A worker calls Touch on every use of an expert; on a miss it makes room (Victim, then Erase
// once the slot's weights are released) and Admit-s the expert it loaded.
#ifndef STRATA_COMMON_PLACEMENT_CACHE_POLICY_H_
#define STRATA_COMMON_PLACEMENT_CACHE_POLICY_H_

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace strata {

struct ExpertKey {
  int layer = 0;
  int expert = 0;

  friend bool operator==(const ExpertKey&, const ExpertKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ExpertKey& k) {
    return H::combine(std::move(h), k.layer, k.expert);
  }
};

class ExpertCachePolicy {
 public:
  virtual ~ExpertCachePolicy() = default;

  virtual int capacity() const = 0;  // slots, fixed at construction
  virtual int size() const = 0;      // resident experts
  virtual bool Contains(ExpertKey key) const = 0;
  // One use of `key`, resident or not.
  virtual void Touch(ExpertKey key) = 0;
  // Makes `key` resident; a no-op when it already is. FailedPrecondition when every slot is
  // taken: evict Victim() first.
  virtual absl::Status Admit(ExpertKey key) = 0;
  // The resident expert to evict next; nullopt when none is resident.
  std::optional<ExpertKey> Victim() const {
    return Victim([](ExpertKey) { return true; });
  }
  // The first in eviction order for which `evictable` holds (a worker never evicts an expert
  // the request at hand needs); nullopt when there is none.
  virtual std::optional<ExpertKey> Victim(absl::FunctionRef<bool(ExpertKey)> evictable) const = 0;
  // Drops `key` from the resident set (false when it was not resident); its use history stays.
  virtual bool Erase(ExpertKey key) = 0;
  // How much the policy wants `key` resident, to compare a candidate with the victim it would
  // replace (higher: keep): LFU its aged use count; LRU its last use (a key not resident ranks
  // as if just used).
  virtual int64_t Rank(ExpertKey key) const = 0;
};

namespace placement_internal {

// Resident keys ordered by (rank, last use, key): the first is the victim.
class RankedSet {
 public:
  struct Entry {
    int64_t rank = 0;
    int64_t last_use = 0;
  };
  bool Contains(ExpertKey key) const { return entries_.contains(key); }
  int size() const { return static_cast<int>(entries_.size()); }
  // The resident key's entry; nullopt when it is not resident.
  std::optional<Entry> Get(ExpertKey key) const {
    const auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }
  void Set(ExpertKey key, Entry entry);  // inserts or updates
  bool Erase(ExpertKey key);
  std::optional<ExpertKey> First(absl::FunctionRef<bool(ExpertKey)> accept) const;

 private:
  using Order = std::tuple<int64_t, int64_t, int, int>;
  absl::flat_hash_map<ExpertKey, Entry> entries_;
  std::set<Order> order_;
};

}  // namespace placement_internal

namespace placement_internal {

// The shared part of the policies: a fixed capacity and the resident experts in eviction
// order; the policies differ only in how Touch and Admit rank them.
class RankedPolicy : public ExpertCachePolicy {
 public:
  explicit RankedPolicy(int capacity) : capacity_(capacity < 0 ? 0 : capacity) {}

  int capacity() const override { return capacity_; }
  int size() const override { return resident_.size(); }
  bool Contains(ExpertKey key) const override { return resident_.Contains(key); }
  using ExpertCachePolicy::Victim;
  std::optional<ExpertKey> Victim(absl::FunctionRef<bool(ExpertKey)> evictable) const override {
    return resident_.First(evictable);
  }
  bool Erase(ExpertKey key) override { return resident_.Erase(key); }

 protected:
  const int capacity_;
  RankedSet resident_;
};

}  // namespace placement_internal

// Least recently used: evicts the resident expert whose last use is oldest.
class LruPolicy : public placement_internal::RankedPolicy {
 public:
  explicit LruPolicy(int capacity) : RankedPolicy(capacity) {}

  void Touch(ExpertKey key) override;
  absl::Status Admit(ExpertKey key) override;
  int64_t Rank(ExpertKey key) const override;

 private:
  int64_t clock_ = 0;  // resident_ ranks are 0: ordered by last use alone
};

// Least frequently used with aging: evicts the resident expert with the fewest uses (ties: the
// least recently used). Uses are counted for every expert touched, resident or not, so an
// expert that keeps missing earns its slot. Every `halve_every` touches all counts are halved:
// which experts are popular drifts with the context (topic, language, position in a long
// generation), and without aging an expert that was hot long ago would hold its slot forever.
// halve_every == 0 never ages. History holds one entry per expert ever touched (bounded by
// layers x experts).
class LfuAgingPolicy : public placement_internal::RankedPolicy {
 public:
  LfuAgingPolicy(int capacity, int64_t halve_every)
      : RankedPolicy(capacity), halve_every_(halve_every) {}

  void Touch(ExpertKey key) override;
  absl::Status Admit(ExpertKey key) override;

  // Current (aged) use count of `key`; 0 when never touched.
  int64_t count(ExpertKey key) const;
  int64_t Rank(ExpertKey key) const override { return count(key); }

 private:
  void Age();

  int64_t halve_every_;
  int64_t clock_ = 0;  // touches and admissions so far
  int64_t touches_ = 0;
  absl::flat_hash_map<ExpertKey, placement_internal::RankedSet::Entry> history_;
};

struct CacheSimResult {
  int64_t hits = 0;
  int64_t misses = 0;
  double hit_rate() const {
    return hits + misses == 0 ? 0.0 : static_cast<double>(hits) / (hits + misses);
  }
};

// Replays `trace` through `policy` as a worker would: Touch; a hit when resident; otherwise a
// miss, the victim evicted when every slot is taken, and the expert admitted. `policy` keeps
// its state (start from a fresh one to compare policies).
CacheSimResult SimulateHitRate(ExpertCachePolicy& policy, absl::Span<const ExpertKey> trace);

}  // namespace strata

#endif  // STRATA_COMMON_PLACEMENT_CACHE_POLICY_H_
