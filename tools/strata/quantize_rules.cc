#include "tools/strata/quantize_rules.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace strata {

std::vector<std::string> QuantizableModelTypes() {
  return {"qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "glm4_moe", "deepseek_v3", "kimi_k2"};
}

bool IsQuantizableModelType(absl::string_view model_type) {
  const std::vector<std::string> types = QuantizableModelTypes();
  return std::find(types.begin(), types.end(), model_type) != types.end();
}

std::string ModuleOf(absl::string_view weight_name) {
  return std::string(absl::StripSuffix(weight_name, ".weight"));
}

bool IsFp8Linear(absl::string_view name, absl::Span<const int64_t> shape) {
  if (shape.size() != 2 || !absl::StartsWith(name, "model.layers.") ||
      !absl::EndsWith(name, ".weight")) {
    return false;
  }
  const std::string module = ModuleOf(name);
  const absl::string_view last = absl::string_view(module).substr(module.rfind('.') + 1);
  for (absl::string_view linear :
       {"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
        "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"}) {
    if (last == linear) return true;
  }
  return false;
}

bool IsIgnoredLinear(absl::string_view name) {
  return absl::EndsWith(name, ".mlp.gate.weight") ||
         absl::EndsWith(name, ".block_sparse_moe.gate.weight") ||
         absl::EndsWith(name, ".shared_expert_gate.weight") ||
         absl::EndsWith(name, ".self_attn.kv_b_proj.weight");
}

absl::StatusOr<Fp8Scaling> ParseFp8Scaling(absl::string_view name) {
  if (name == "channel") return Fp8Scaling::kChannel;
  if (name == "block") return Fp8Scaling::kBlock;
  return absl::InvalidArgumentError(
      absl::StrCat("--fp8-scaling must be channel or block, not \"", name, "\""));
}

namespace {

// lm_head first, once.
std::vector<std::string> WithLmHead(std::vector<std::string> ignore) {
  if (std::find(ignore.begin(), ignore.end(), "lm_head") == ignore.end()) {
    ignore.insert(ignore.begin(), "lm_head");
  }
  return ignore;
}

}  // namespace

nlohmann::ordered_json BlockQuantizationConfigJson(std::vector<std::string> ignore) {
  nlohmann::ordered_json config;
  config["activation_scheme"] = "dynamic";
  config["fmt"] = "e4m3";
  config["quant_method"] = "fp8";
  config["weight_block_size"] = {kFp8Block, kFp8Block};
  config["modules_to_not_convert"] = WithLmHead(std::move(ignore));
  return config;
}

nlohmann::ordered_json QuantizationConfigJson(std::vector<std::string> ignore) {
  ignore = WithLmHead(std::move(ignore));
  nlohmann::ordered_json weights = {{"num_bits", 8},
                                    {"type", "float"},
                                    {"symmetric", true},
                                    {"strategy", "channel"},
                                    {"dynamic", false},
                                    {"group_size", nullptr},
                                    {"block_structure", nullptr},
                                    {"actorder", nullptr},
                                    {"observer", "minmax"},
                                    {"observer_kwargs", nlohmann::ordered_json::object()}};
  nlohmann::ordered_json group = {{"targets", {"Linear"}},
                                  {"weights", std::move(weights)},
                                  {"input_activations", nullptr},
                                  {"output_activations", nullptr}};
  nlohmann::ordered_json config;
  config["quant_method"] = "compressed-tensors";
  config["format"] = "float-quantized";
  config["quantization_status"] = "compressed";
  config["config_groups"] = {{"group_0", std::move(group)}};
  config["ignore"] = std::move(ignore);
  config["kv_cache_scheme"] = nullptr;
  config["global_compression_ratio"] = nullptr;
  return config;
}

}  // namespace strata
