// Which tensors of a Hugging Face MoE checkpoint `strata quantize` turns into FP8 E4M3, and the
// compressed-tensors quantization_config that describes the result to loaders.
#ifndef STRATA_TOOLS_STRATA_QUANTIZE_RULES_H_
#define STRATA_TOOLS_STRATA_QUANTIZE_RULES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace strata {

// config.json model types whose checkpoints quantize: qwen3_moe, qwen2_moe, mixtral, gpt_oss,
// glm4_moe.
bool IsQuantizableModelType(absl::string_view model_type);
std::vector<std::string> QuantizableModelTypes();

// True for the weight of a decoder layer's linear layer that becomes FP8: the attention q/k/v/o
// projections and the gate/up/down (w1/w3/w2) projections of every expert, shared expert and
// dense MLP. gpt-oss stores its experts fused in 3-D tensors, which are not nn.Linear weights
// and stay 16-bit.
bool IsFp8Linear(absl::string_view name, absl::Span<const int64_t> shape);

// The nn.Linear modules that keep their 16-bit weights and so go in the config's `ignore`
// list: the MoE gates (their top-k choice flips on small errors) and the shared-expert gate.
// `lm_head` is added by QuantizationConfigJson whether or not the head is tied.
bool IsIgnoredLinear(absl::string_view name);

// The module name of a weight: "model.layers.0.mlp.gate.weight" -> "model.layers.0.mlp.gate".
std::string ModuleOf(absl::string_view weight_name);

// compressed-tensors' quantization_config for FP8 E4M3 per-output-channel symmetric static
// weights (weight-only: no activation quantization), "float-quantized" format, every Linear but
// `ignore` (module names).
nlohmann::ordered_json QuantizationConfigJson(std::vector<std::string> ignore);

// The per-row scale of FP8 E4M3 weights: max |row| / 448, 1 for an all-zero row (as
// QuantizeBf16RowsToFp8E4M3 does, so codes are never divided by zero).
inline float Fp8RowScale(float absmax) { return absmax > 0.0f ? absmax / 448.0f : 1.0f; }

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_QUANTIZE_RULES_H_
