#include "common/placement/placement_plan.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status ValidateCounts(const ExpertCounts& counts) {
  if (counts.empty()) return absl::InvalidArgumentError("the count table has no layers");
  const size_t experts = counts[0].size();
  if (experts == 0) return absl::InvalidArgumentError("the count table has no experts");
  for (size_t layer = 0; layer < counts.size(); ++layer) {
    if (counts[layer].size() != experts) {
      return absl::InvalidArgumentError(absl::StrCat("count table layer ", layer, " has ",
                                                     counts[layer].size(), " experts, layer 0 has ",
                                                     experts));
    }
    for (size_t e = 0; e < experts; ++e) {
      if (counts[layer][e] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("count of layer ", layer, " expert ", e, " is negative"));
      }
    }
  }
  return absl::OkStatus();
}

PlacementPlan PlacementPlan::Contiguous(int num_layers, int num_experts, int num_workers) {
  PlacementPlan plan;
  plan.num_workers = num_workers;
  plan.owner.assign(num_layers, std::vector<int>(num_experts, 0));
  for (auto& row : plan.owner) {
    for (int e = 0; e < num_experts; ++e) {
      row[e] = static_cast<int>(int64_t{e} * num_workers / num_experts);
    }
  }
  return plan;
}

absl::StatusOr<PlacementPlan> PlacementPlan::Greedy(const ExpertCounts& counts, int num_workers) {
  if (absl::Status s = ValidateCounts(counts); !s.ok()) return s;
  const int num_layers = static_cast<int>(counts.size());
  const int num_experts = static_cast<int>(counts[0].size());
  if (num_workers < 1 || num_workers > num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be between 1 and the ",
                                                   num_experts, " experts per layer, not ",
                                                   num_workers));
  }
  PlacementPlan plan = Contiguous(num_layers, num_experts, num_workers);
  std::vector<int> order(num_experts);
  std::vector<int> row(num_experts);
  std::vector<int64_t> load(num_workers);
  std::vector<int> owned(num_workers);
  for (int layer = 0; layer < num_layers; ++layer) {
    const std::vector<int64_t>& c = counts[layer];
    if (std::all_of(c.begin(), c.end(), [](int64_t v) { return v == 0; })) continue;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&c](int a, int b) { return c[a] > c[b]; });
    std::fill(load.begin(), load.end(), 0);
    std::fill(owned.begin(), owned.end(), 0);
    for (int e : order) {
      int best = 0;
      for (int w = 1; w < num_workers; ++w) {
        if (std::tie(load[w], owned[w]) < std::tie(load[best], owned[best])) best = w;
      }
      row[e] = best;
      load[best] += c[e];
      ++owned[best];
    }
    const int64_t greedy_max = *std::max_element(load.begin(), load.end());
    std::fill(load.begin(), load.end(), 0);
    for (int e = 0; e < num_experts; ++e) load[plan.owner[layer][e]] += c[e];
    if (greedy_max <= *std::max_element(load.begin(), load.end())) plan.owner[layer] = row;
  }
  return plan;
}

std::vector<int> PlacementPlan::OwnedBy(int layer, int worker) const {
  std::vector<int> experts;
  for (int e = 0; e < static_cast<int>(owner[layer].size()); ++e) {
    if (owner[layer][e] == worker) experts.push_back(e);
  }
  return experts;
}

absl::Status PlacementPlan::Validate(int expected_layers, int expected_experts,
                                     int expected_workers) const {
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the plan has ", num_workers, " workers"));
  }
  const int experts = num_experts();
  for (int layer = 0; layer < num_layers(); ++layer) {
    if (static_cast<int>(owner[layer].size()) != experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan layer ", layer, " has ", owner[layer].size(), " experts, layer 0 has ", experts));
    }
  }
  if ((expected_layers >= 0 && expected_layers != num_layers()) ||
      (expected_experts >= 0 && expected_experts != experts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan is for a model of ", num_layers(), " layers x ", experts,
        " experts; this model has ", expected_layers >= 0 ? expected_layers : num_layers(), " x ",
        expected_experts >= 0 ? expected_experts : experts));
  }
  if (expected_workers >= 0 && expected_workers != num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan is for ", num_workers, " workers; this cluster has ", expected_workers));
  }
  for (int layer = 0; layer < num_layers(); ++layer) {
    for (int e = 0; e < experts; ++e) {
      const int w = owner[layer][e];
      if (w < 0 || w >= num_workers) {
        return absl::InvalidArgumentError(absl::StrCat("plan layer ", layer, " expert ", e,
                                                       " goes to worker ", w, ", outside [0, ",
                                                       num_workers, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
