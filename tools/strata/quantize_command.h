// The `strata quantize` command: Quantize, then, given calibration prompts, the perplexity of the
// original and the quantized model on them (the in-process engine), printed as JSON.
#ifndef STRATA_TOOLS_STRATA_QUANTIZE_COMMAND_H_
#define STRATA_TOOLS_STRATA_QUANTIZE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/local_engine.h"
#include "tools/strata/quantize.h"

namespace strata {

struct QuantizeCommandOptions {
  QuantizeOptions quantize;
  // Weight-only per-channel FP8 needs no calibration; prompts given here (JSON Lines, as
  // ReadCalibration reads them) only measure what quantization costs.
  std::string calibration_file;
  int samples = 512;          // the first this many prompts
  LocalEngineOptions engine;  // how both models run (model_dir is set per model)
};

struct CalibrationPerplexity {
  double original = 0.0;
  double quantized = 0.0;
  int64_t tokens = 0;  // scored tokens
  int prompts = 0;
};

// The perplexity of the models in `original_dir` and `quantized_dir` on the first `samples`
// prompts: each prompt is cut into windows of the engine's longest sequence, every window runs
// from position 0 and its positions 1..len-1 are scored (as `strata eval` scores text).
absl::StatusOr<CalibrationPerplexity> ComparePerplexity(const std::string& original_dir,
                                                        const std::string& quantized_dir,
                                                        const std::string& calibration_file,
                                                        int samples,
                                                        const LocalEngineOptions& engine);

// Prints {"quantized_tensors", "kept_tensors", "bytes_before", "bytes_after", "shards",
// "seconds"} and, with calibration prompts, "perplexity_original", "perplexity_quantized",
// "perplexity_delta" (relative) and "calibration_tokens".
absl::Status RunQuantizeCommand(const QuantizeCommandOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_QUANTIZE_COMMAND_H_
