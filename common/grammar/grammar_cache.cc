#include "common/grammar/grammar_cache.h"

namespace strata {

std::shared_ptr<const CompiledConstraint> GrammarCache::Find(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

void GrammarCache::Insert(const std::string& key,
                          std::shared_ptr<const CompiledConstraint> grammar) {
  if (capacity_ == 0) return;
  absl::MutexLock lock(&mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    // Compiled twice at once by two requests: keep the one already cached.
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.emplace_front(key, std::move(grammar));
  by_key_[key] = order_.begin();
  while (order_.size() > capacity_) {
    by_key_.erase(order_.back().first);
    order_.pop_back();
  }
}

GrammarCache::Stats GrammarCache::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{.hits = hits_, .misses = misses_, .entries = order_.size()};
}

}  // namespace strata
