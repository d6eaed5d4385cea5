// `strata make-model`: writes a random-weight model in the Hugging Face format (config.json,
// generation_config.json, sharded safetensors with model.safetensors.index.json) in one of the
// benchmark shapes, fast (counter-based RNG, every core, pwrite into preallocated shards), with
// an optional Zipf skew of expert popularity built into the gates.
#ifndef STRATA_TOOLS_STRATA_MAKE_MODEL_H_
#define STRATA_TOOLS_STRATA_MAKE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/strata/model_shapes.h"
#include "tools/strata/quantize_rules.h"

namespace strata {

// The gate skew: expert popularity follows Zipf's law with this exponent (0: no skew).
// `spec` is "", "none" or "zipf:S" with 0 <= S <= 10.
absl::StatusOr<double> ParseSkew(absl::string_view spec);

// The construction (documented in make_model.cc): in every MoE layer a random order ranks the
// experts; the gate row of the expert ranked r is the usual random row times scale[r]. Given
// any gate input x, the logits are then independent N(0, (0.02 scale[r] |x|)^2), so the
// chance that rank r lands in the top k depends on the scales alone; the scales are solved for
// so that it equals target[r].
struct ZipfGateSkew {
  double exponent = 0.0;
  // Per rank: the probability that a token selects the expert (sums to top_k), which is Zipf's
  // c / (r + 1)^S clamped to what this construction can reach, [lower, upper].
  std::vector<double> target;
  std::vector<double> scale;     // per rank, root mean square 1
  std::vector<double> achieved;  // per rank, the selection probability the scales give
  double min_probability = 0.0;  // P(fewer than k of the other experts have a positive logit)
  double lower = 0.0;            // max(1.25 min_probability, 1e-4)
  double upper = 0.0;            // 0.45
};

absl::StatusOr<ZipfGateSkew> SolveZipfGateSkew(int experts, int top_k, double exponent);

// The chance, per token, that each expert is among the top k when its logit is scale[e] * z_e
// with z_e independent standard normals (by quadrature).
std::vector<double> TopKSelectionProbability(const std::vector<double>& scale, int top_k);

struct MakeModelOptions {
  std::string shape;    // a ModelShapeNames() entry
  std::string out_dir;  // created if missing; must be empty unless `force`
  // bf16, f16, f32, or fp8: FP8 E4M3 experts (DeepSeek shapes: every linear `strata quantize`
  // makes FP8) scaled as `fp8_scaling` says, the rest bf16.
  std::string dtype = "bf16";
  Fp8Scaling fp8_scaling = Fp8Scaling::kChannel;
  std::string skew;  // "", "none" or "zipf:S"
  uint64_t seed = 0;
  int layers = 0;       // 0: the shape's own count
  bool force = false;   // write into a non-empty directory (old shards are removed)
  int num_threads = 0;  // 0: every hardware thread
  uint64_t max_shard_bytes = 4'000'000'000;  // tensor bytes per shard, like "4GB" in HF
  bool write_tensors = true;                 // false: config, index and sidecar only (tests)
  bool progress = false;                     // status lines on stderr
};

struct MakeModelResult {
  int64_t params = 0;
  uint64_t bytes = 0;  // tensor bytes (the index's total_size)
  int shards = 0;
  double seconds = 0.0;
};

absl::StatusOr<MakeModelResult> MakeModel(const MakeModelOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_MAKE_MODEL_H_
