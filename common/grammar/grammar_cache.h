// Compiled grammars by key, at most a fixed number, the least recently used dropped first.
// Thread-safe; what it hands out stays valid after it is dropped (shared ownership).
#ifndef STRATA_COMMON_GRAMMAR_GRAMMAR_CACHE_H_
#define STRATA_COMMON_GRAMMAR_GRAMMAR_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/token_constraint.h"

namespace strata {

class GrammarCache {
 public:
  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    size_t entries = 0;
  };

  explicit GrammarCache(size_t capacity) : capacity_(capacity) {}

  // The grammar under `key` (counted as used now), or null (counted as a miss).
  std::shared_ptr<const CompiledConstraint> Find(const std::string& key);
  // Keeps `grammar` under `key`, dropping the least recently used beyond the capacity.
  void Insert(const std::string& key, std::shared_ptr<const CompiledConstraint> grammar);
  Stats stats() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledConstraint>>;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> order_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> by_key_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_GRAMMAR_GRAMMAR_CACHE_H_
