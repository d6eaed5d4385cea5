// Which tensors of a Hugging Face MoE checkpoint `strata quantize` turns into FP8 E4M3, and the
// compressed-tensors quantization_config that describes the result to loaders.
#ifndef STRATA_TOOLS_STRATA_QUANTIZE_RULES_H_
#define STRATA_TOOLS_STRATA_QUANTIZE_RULES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace strata {

// config.json model types whose checkpoints quantize: qwen3_moe, qwen2_moe, mixtral, gpt_oss,
// glm4_moe, deepseek_v3 (kimi_k2 too: the same architecture).
bool IsQuantizableModelType(absl::string_view model_type);
std::vector<std::string> QuantizableModelTypes();

// True for the weight of a decoder layer's linear layer that becomes FP8: the attention q/k/v/o
// projections (DeepSeek-V3's q_a/q_b/kv_a_proj_with_mqa and o_proj) and the gate/up/down
// (w1/w3/w2) projections of every expert, shared expert and dense MLP. gpt-oss stores its
// experts fused in 3-D tensors, which are not nn.Linear weights and stay 16-bit. DeepSeek-V3's
// kv_b_proj stays 16-bit too: attention reads it transposed, which per-row scales do not follow
// (block scales would, and the loader takes an FP8 kv_b_proj with them, as DeepSeek ships it;
// it is 0.3% of the model and both layouts here keep it alike).
bool IsFp8Linear(absl::string_view name, absl::Span<const int64_t> shape);

// The nn.Linear modules that keep their 16-bit weights and so go in the config's `ignore`
// list: the MoE gates (their top-k choice flips on small errors), the shared-expert gate and
// DeepSeek-V3's kv_b_proj. `lm_head` is added by the config's JSON whether or not the head is
// tied.
bool IsIgnoredLinear(absl::string_view name);

// The module name of a weight: "model.layers.0.mlp.gate.weight" -> "model.layers.0.mlp.gate".
std::string ModuleOf(absl::string_view weight_name);

// compressed-tensors' quantization_config for FP8 E4M3 per-output-channel symmetric static
// weights (weight-only: no activation quantization), "float-quantized" format, every Linear but
// `ignore` (module names).
nlohmann::ordered_json QuantizationConfigJson(std::vector<std::string> ignore);

// How FP8 weights are scaled: one scale per output row (compressed-tensors' channel strategy),
// or one per 128 x 128 block (DeepSeek-V3's layout, `weight_scale_inv`).
enum class Fp8Scaling { kChannel, kBlock };
// "channel" or "block".
absl::StatusOr<Fp8Scaling> ParseFp8Scaling(absl::string_view name);

// The block of kBlock scaling, rows x columns, as DeepSeek-V3 and Kimi-K2 ship it.
inline constexpr int64_t kFp8Block = 128;

// quantization_config of block-scaled FP8 as DeepSeek-V3 writes it (quant_method "fp8", fmt
// e4m3, weight_block_size [128, 128], dynamic activations), with transformers' list of the
// modules left 16-bit (`modules_to_not_convert`: `ignore`, lm_head first).
nlohmann::ordered_json BlockQuantizationConfigJson(std::vector<std::string> ignore);

// The scale of FP8 E4M3 weights over a row or block: max |x| / 448, 1 for all zeros (as
// QuantizeBf16RowsToFp8E4M3 does, so codes are never divided by zero).
inline float Fp8RowScale(float absmax) { return absmax > 0.0f ? absmax / 448.0f : 1.0f; }

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_QUANTIZE_RULES_H_
