// The `strata quantize` command: Quantize, then, given calibration prompts, the perplexity of the
// original and the quantized model on them (the in-process engine), printed as JSON.
#ifndef STRATA_TOOLS_STRATA_QUANTIZE_COMMAND_H_
#define STRATA_TOOLS_STRATA_QUANTIZE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/local_engine.h"
#include "tools/strata/quantize.h"

namespace strata {

struct QuantizeCommandOptions {
  QuantizeOptions quantize;
  // Weight-only per-channel FP8 needs no calibration; prompts given here (JSON Lines, as
  // ReadCalibration reads them) only measure what quantization costs.
  std::string calibration_file;
  int samples = 512;  // the first this many prompts
  // With calibration prompts: FP8 KV-cache scales from them, written into the quantized model
  // (AddKvScales).
  bool kv_scales = false;
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

// The FP8 KV-cache scales of the model in `dir` on `prompts`: the largest key and value
// magnitude of each layer (over its KV heads) over every prompt token, with the headroom the
// runtime calibration leaves (PagedKvCache::ObserveKvRange), [num_layers] each.
absl::StatusOr<KvScales> CalibrateKvScales(const std::string& dir,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           LocalEngineOptions engine);

// Writes `scales` ([num_layers] each) as model.layers.L.self_attn.k_scale / v_scale (float32
// scalars) into kv_scales.safetensors in the model directory `dir`, lists them in its
// model.safetensors.index.json (made from model.safetensors when there was none), and sets
// the quantization_config's kv_cache_scheme (FP8, one scale a tensor), the layout vLLM and
// llm-compressor use.
absl::Status AddKvScales(const std::string& dir, const KvScales& scales);

// Prints {"quantized_tensors", "kept_tensors", "bytes_before", "bytes_after", "shards",
// "seconds"} and, with calibration prompts, "perplexity_original", "perplexity_quantized",
// "perplexity_delta" (relative) and "calibration_tokens"; with kv_scales, "kv_scales_tokens".
absl::Status RunQuantizeCommand(const QuantizeCommandOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_QUANTIZE_COMMAND_H_
