#include "common/placement/placement_stats.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

int64_t Total(absl::Span<const int64_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

}  // namespace

double Gini(absl::Span<const int64_t> counts) {
  std::vector<int64_t> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  const double n = static_cast<double>(sorted.size());
  double total = 0.0, weighted = 0.0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    total += static_cast<double>(sorted[i]);
    weighted += static_cast<double>(i + 1) * static_cast<double>(sorted[i]);
  }
  if (total == 0.0 || n == 0.0) return 0.0;
  return 2.0 * weighted / (n * total) - (n + 1.0) / n;
}

GiniReport GiniByLayer(const ExpertCounts& counts) {
  GiniReport report;
  std::vector<int64_t> all;
  for (int layer = 0; layer < static_cast<int>(counts.size()); ++layer) {
    if (Total(counts[layer]) == 0) continue;
    report.layers.push_back(layer);
    report.per_layer.push_back(Gini(counts[layer]));
    all.insert(all.end(), counts[layer].begin(), counts[layer].end());
  }
  report.overall = Gini(all);
  return report;
}

std::vector<int64_t> WorkerLoads(absl::Span<const int64_t> layer_counts, const PlacementPlan& plan,
                                 int layer) {
  std::vector<int64_t> load(plan.num_workers, 0);
  for (size_t e = 0; e < layer_counts.size(); ++e) load[plan.owner[layer][e]] += layer_counts[e];
  return load;
}

absl::StatusOr<ImbalanceReport> ExpectedImbalance(const ExpertCounts& counts,
                                                  const PlacementPlan& plan) {
  if (absl::Status s = ValidateCounts(counts); !s.ok()) return s;
  if (absl::Status s =
          plan.Validate(static_cast<int>(counts.size()), static_cast<int>(counts[0].size()));
      !s.ok()) {
    return s;
  }
  ImbalanceReport report;
  double sum = 0.0;
  for (int layer = 0; layer < static_cast<int>(counts.size()); ++layer) {
    const int64_t total = Total(counts[layer]);
    if (total == 0) continue;
    const std::vector<int64_t> load = WorkerLoads(counts[layer], plan, layer);
    const double mean = static_cast<double>(total) / plan.num_workers;
    const double imbalance =
        (static_cast<double>(*std::max_element(load.begin(), load.end())) - mean) / mean;
    report.layers.push_back(layer);
    report.per_layer.push_back(imbalance);
    sum += imbalance;
    report.max = std::max(report.max, imbalance);
  }
  if (!report.layers.empty()) report.mean = sum / static_cast<double>(report.layers.size());
  return report;
}

}  // namespace strata
