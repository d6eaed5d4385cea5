// `strata plan`: counts expert activations on a calibration set and writes a placement plan
// that gives every worker the same expected load (docs/placement.md).
#ifndef STRATA_TOOLS_STRATA_PLAN_COMMAND_H_
#define STRATA_TOOLS_STRATA_PLAN_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/local_engine.h"
#include "common/placement/placement_stats.h"
#include "common/placement/plan_file.h"
#include "common/tokenizer/tokenizer.h"

namespace strata {

struct PlanOptions {
  LocalEngineOptions engine;     // model_dir is required; on_routing is the planner's own
  std::string calibration_file;  // JSON Lines (ReadCalibration)
  int workers = 0;
  std::string out;  // where plan.json goes; empty: RunPlanCommand only prints the summary
};

struct CalibrationPrompt {
  int line = 0;  // 1-based line of the calibration file
  std::vector<int32_t> ids;
};

// One prompt per non-blank line: {"text": "..."} (encoded with `tokenizer`, no special tokens;
// an error when `tokenizer` is null) or {"token_ids": [...]}; other keys are ignored. Errors:
// NotFound for a missing file, InvalidArgument naming the file and line of a bad line, or
// when the file holds no prompt.
absl::StatusOr<std::vector<CalibrationPrompt>> ReadCalibration(const std::string& path,
                                                               const Tokenizer* tokenizer);

struct PlanResult {
  PlanFile file;  // the greedy plan, the counts of every model layer, tokens counted
  int prompts = 0;
  int top_k = 0;  // the model's experts per token
  GiniReport gini;
  ImbalanceReport contiguous;  // expected imbalance of the even contiguous split
  ImbalanceReport planned;     // and of the plan
};

// Runs every prompt through the model on the CPU (a prompt longer than the context is cut
// into context-sized windows, each from position 0), counts which experts the gate picks on
// each MoE layer, and plans greedily. InvalidArgument for workers outside [1, experts].
absl::StatusOr<PlanResult> MakePlan(const PlanOptions& options);

// MakePlan, writes options.out, and prints a per-layer summary table to `out`.
absl::Status RunPlanCommand(const PlanOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_PLAN_COMMAND_H_
