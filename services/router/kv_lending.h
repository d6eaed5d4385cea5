// One memory budget for the KV pool and the expert slots of the workers on the router's device:
// as the hot ratio falls (long contexts), each such worker lends the slots of the experts that
// leave its hot set to the pool, which grows by their bytes; as it rises, the pool gives the
// memory back (compacted first) before the workers take it again. The worker frees the memory
// before the pool grows, and the pool shrinks before the worker grows, so the two together
// never hold more than they started with.
//
// Driven from the engine thread, once per step: no locking.
#ifndef STRATA_SERVICES_ROUTER_KV_LENDING_H_
#define STRATA_SERVICES_ROUTER_KV_LENDING_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace strata {

struct KvLendingOptions {
  // The hot ratio at which nothing is lent (the policy's highest): a worker lends
  // (top_ratio - ratio) x the experts it owns.
  float top_ratio = 0.35f;
  int base_blocks = 0;       // the pool's blocks with nothing lent
  int max_blocks = 0;        // the most it can grow to (its reserved addresses)
  uint64_t block_bytes = 0;  // device bytes of one block, every layer
  // After a shrink failed (its blocks in use), steps before it is tried again.
  int retry_steps = 32;
};

// A worker as the router sees it this step.
struct LendingWorker {
  bool shares = false;      // on the router's device (or host, for CPU processes)
  int owned = 0;            // (layer, expert) pairs it owns
  uint64_t slot_bytes = 0;  // 0 until it has answered once
  uint32_t lent = 0;        // slots it reports lent (its last response)
};

class KvLending {
 public:
  explicit KvLending(KvLendingOptions options) : options_(options) {}

  // This step's decision for the hot ratio `ratio`, the pool at `active_blocks`: asks() holds
  // what each worker is asked to lend (carried by its next requests), and the pool size to
  // resize to is returned, if any. Call ResizeDone with a resize's outcome before the next.
  std::optional<int> Step(float ratio, absl::Span<const LendingWorker> workers, int active_blocks);
  void ResizeDone(bool ok);

  const std::vector<uint32_t>& asks() const { return asks_; }
  // Blocks the pool has beyond base_blocks as of the last Step.
  int borrowed_blocks() const { return borrowed_; }

 private:
  // The pool for `lent[w]` slots lent by each worker.
  int PoolFor(absl::Span<const LendingWorker> workers, const std::vector<uint32_t>& lent) const;

  KvLendingOptions options_;
  std::vector<uint32_t> asks_;
  bool resizing_ = false;
  bool shrinking_ = false;
  int wait_steps_ = 0;  // before a failed shrink is tried again
  int borrowed_ = 0;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_KV_LENDING_H_
