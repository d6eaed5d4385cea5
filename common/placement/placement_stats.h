// How uneven expert use is (Gini), and how uneven a placement makes the workers' load.
#ifndef STRATA_COMMON_PLACEMENT_PLACEMENT_STATS_H_
#define STRATA_COMMON_PLACEMENT_PLACEMENT_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/placement/placement_plan.h"

namespace strata {

// Gini coefficient of a count vector: 0 for perfectly even use, towards 1 for concentration
// ((n - 1) / n when one entry holds everything). 0 for an empty or all-zero vector.
double Gini(absl::Span<const int64_t> counts);

// Per-layer figures cover only the layers with counted activations: a dense layer routes
// nothing and would read as perfectly even (imbalance) or maximally skewed (Gini).
struct GiniReport {
  std::vector<int> layers;        // model layer indices with any activation, ascending
  std::vector<double> per_layer;  // Gini of each of `layers`
  double overall = 0.0;           // Gini of those layers' counts taken together
};
GiniReport GiniByLayer(const ExpertCounts& counts);

// A worker's expected load on a layer: the summed counts of the experts it owns.
// imbalance = (max worker load - mean worker load) / mean worker load; 0 is perfect.
struct ImbalanceReport {
  std::vector<int> layers;        // as in GiniReport
  std::vector<double> per_layer;  // imbalance of each of `layers`
  double mean = 0.0;              // over `layers`
  double max = 0.0;
};

// load[worker] of one layer under `plan`.
std::vector<int64_t> WorkerLoads(absl::Span<const int64_t> layer_counts, const PlacementPlan& plan,
                                 int layer);

// InvalidArgument when counts and plan differ in shape or either is malformed.
absl::StatusOr<ImbalanceReport> ExpectedImbalance(const ExpertCounts& counts,
                                                  const PlacementPlan& plan);

}  // namespace strata

#endif  // STRATA_COMMON_PLACEMENT_PLACEMENT_STATS_H_
