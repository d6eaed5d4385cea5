// Which expert worker owns each (layer, expert): the even contiguous split, and a greedy plan
// that equalizes each worker's expected load from activation counts on a calibration set.
#ifndef STRATA_COMMON_PLACEMENT_PLACEMENT_PLAN_H_
#define STRATA_COMMON_PLACEMENT_PLACEMENT_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

// counts[layer][expert]: how often the gate picked the expert (one per token and top-k slot).
// Dense layers, and layers never run, have all-zero rows.
using ExpertCounts = std::vector<std::vector<int64_t>>;

// InvalidArgument unless `counts` is a non-empty rectangle of non-negative values with at
// least one expert per layer.
absl::Status ValidateCounts(const ExpertCounts& counts);

struct PlacementPlan {
  int num_workers = 0;
  std::vector<std::vector<int>> owner;  // owner[layer][expert] = worker index

  // Experts split into contiguous ranges of near-equal size, the same on every layer
  // (expert e goes to worker e * workers / experts, as the router has always done).
  // Needs num_workers >= 1; with more workers than experts, some own nothing.
  static PlacementPlan Contiguous(int num_layers, int num_experts, int num_workers);

  // Longest-processing-time greedy, per layer: experts by count descending (ties: lower id
  // first), each to the worker with the least load so far (ties: the one owning fewer experts,
  // then the lower index; the experts-owned tie-break spreads rarely used experts so that every
  // worker owns at least one). A layer keeps the contiguous split when that has the lower
  // maximum load (greedy is a heuristic; the plan is never worse than the default) and when it
  // has no counted activations. Deterministic. InvalidArgument for bad counts or workers
  // outside [1, experts].
  static absl::StatusOr<PlacementPlan> Greedy(const ExpertCounts& counts, int num_workers);

  int num_layers() const { return static_cast<int>(owner.size()); }
  int num_experts() const { return owner.empty() ? 0 : static_cast<int>(owner[0].size()); }

  // The experts of `layer` that `worker` owns, ascending.
  std::vector<int> OwnedBy(int layer, int worker) const;

  // InvalidArgument unless the table is rectangular, has this shape (a negative expected value
  // is not checked) and every owner is in [0, num_workers).
  absl::Status Validate(int expected_layers = -1, int expected_experts = -1,
                        int expected_workers = -1) const;
};

}  // namespace strata

#endif  // STRATA_COMMON_PLACEMENT_PLACEMENT_PLAN_H_
