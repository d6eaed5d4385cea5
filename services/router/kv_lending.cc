#include "services/router/kv_lending.h"

#include <algorithm>
#include <cmath>

namespace strata {

int KvLending::PoolFor(absl::Span<const LendingWorker> workers,
                       const std::vector<uint32_t>& lent) const {
  uint64_t bytes = 0;
  for (size_t w = 0; w < workers.size(); ++w) bytes += uint64_t{lent[w]} * workers[w].slot_bytes;
  const uint64_t blocks = options_.block_bytes == 0 ? 0 : bytes / options_.block_bytes;
  return static_cast<int>(
      std::min<uint64_t>(uint64_t(options_.base_blocks) + blocks,
                         uint64_t(std::max(options_.max_blocks, options_.base_blocks))));
}

std::optional<int> KvLending::Step(float ratio, absl::Span<const LendingWorker> workers,
                                   int active_blocks) {
  asks_.resize(workers.size(), 0);
  std::vector<uint32_t> wanted(workers.size(), 0), landed(workers.size(), 0);
  for (size_t w = 0; w < workers.size(); ++w) {
    const LendingWorker& worker = workers[w];
    if (!worker.shares || worker.slot_bytes == 0) continue;
    wanted[w] = static_cast<uint32_t>(
        std::lround(std::max(0.0f, options_.top_ratio - ratio) * worker.owned));
    // The pool counts only what was freed and is still wanted.
    landed[w] = std::min(worker.lent, wanted[w]);
  }
  const int target = PoolFor(workers, landed);
  // More lent: asked at once; the pool grows once the worker reports the memory freed. Less:
  // asked once the pool no longer holds it.
  for (size_t w = 0; w < workers.size(); ++w) {
    if (wanted[w] >= asks_[w] || active_blocks <= target) asks_[w] = wanted[w];
  }
  borrowed_ = active_blocks - options_.base_blocks;
  if (resizing_ || target == active_blocks) return std::nullopt;
  if (target < active_blocks && wait_steps_ > 0) {
    --wait_steps_;
    return std::nullopt;
  }
  resizing_ = true;
  shrinking_ = target < active_blocks;
  return target;
}

void KvLending::ResizeDone(bool ok) {
  resizing_ = false;
  if (!ok && shrinking_) wait_steps_ = options_.retry_steps;
}

}  // namespace strata
