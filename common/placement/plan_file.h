// plan.json: a placement plan on disk, with the activation counts it came from and the figures
// derived from them (docs/placement.md describes the format).
#ifndef STRATA_COMMON_PLACEMENT_PLAN_FILE_H_
#define STRATA_COMMON_PLACEMENT_PLAN_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/placement/placement_plan.h"

namespace strata {

struct PlanFile {
  PlacementPlan plan;
  std::string model;    // the model directory it was made for (informational)
  int64_t tokens = 0;   // calibration tokens counted
  ExpertCounts counts;  // [layer][expert], the plan's shape; empty when not made from counts
};

// Writes `file` to `path`, with Gini and the expected imbalance of the plan and of the
// contiguous split when counts are present. InvalidArgument for a malformed plan or counts of
// another shape; Internal when the file cannot be written.
absl::Status SavePlan(const std::string& path, const PlanFile& file);

// Reads a plan file whatever its shape. NotFound when it cannot be opened, InvalidArgument
// (naming the file and the field) when it is not a valid plan. The derived figures are not
// read back: they follow from the counts.
absl::StatusOr<PlanFile> ReadPlan(const std::string& path);

// ReadPlan, and InvalidArgument unless the plan is for this model shape and worker count.
absl::StatusOr<PlanFile> LoadPlan(const std::string& path, int num_layers, int num_experts,
                                  int num_workers);

}  // namespace strata

#endif  // STRATA_COMMON_PLACEMENT_PLAN_FILE_H_
