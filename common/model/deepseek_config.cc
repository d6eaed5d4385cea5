#include "common/model/deepseek_config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata::config_internal {
namespace {

// The sigmoid router of DeepSeek-V3 and GLM-4.5: the "noaux_tc" choice within expert groups.
absl::Status ParseGroupedRouter(const ConfigReader& config, ModelConfig& model) {
  model.gate_scoring = GateScoring::kSigmoidGrouped;
  model.router_correction_bias = true;
  if (config.Has("scoring_func")) {
    ASSIGN_OR_RETURN(std::string scoring, config.String("scoring_func"));
    if (scoring != "sigmoid") {
      return config.Error("scoring_func",
                          absl::StrCat("\"", scoring, "\" is not supported (sigmoid)"));
    }
  }
  if (config.Has("topk_method")) {
    ASSIGN_OR_RETURN(std::string method, config.String("topk_method"));
    if (method != "noaux_tc") {
      return config.Error("topk_method",
                          absl::StrCat("\"", method, "\" is not supported (noaux_tc)"));
    }
  }
  ASSIGN_OR_RETURN(int64_t groups, config.Int("n_group", 1, 1, model.num_experts));
  if (model.num_experts % groups != 0) {
    return config.Error("n_group", absl::StrCat("must divide the ", model.num_experts, " experts"));
  }
  ASSIGN_OR_RETURN(int64_t top_groups, config.Int("topk_group", 1, 1, groups));
  model.num_expert_groups = static_cast<int>(groups);
  model.top_k_groups = static_cast<int>(top_groups);
  ASSIGN_OR_RETURN(model.routed_scaling_factor,
                   config.NumberAbove("routed_scaling_factor", 0.0, 1.0));
  return absl::OkStatus();
}

}  // namespace

// GLM-4.5 and DeepSeek-V3: layers below first_k_dense_replace are dense; the MoE layers carry
// n_shared_experts ungated shared experts, as one SwiGLU of n_shared_experts times the width.
absl::Status ParseDenseThenMoe(const ConfigReader& config, int64_t default_dense_layers,
                               ModelConfig& model) {
  ASSIGN_OR_RETURN(int64_t experts, config.Int("n_routed_experts", {}, 1, kMaxExperts));
  model.num_experts = static_cast<int>(experts);
  ASSIGN_OR_RETURN(model.moe_intermediate_size,
                   config.Int("moe_intermediate_size", {}, 1, kMaxIntermediate));
  ASSIGN_OR_RETURN(model.dense_intermediate_size,
                   config.Int("intermediate_size", {}, 1, kMaxIntermediate));
  ASSIGN_OR_RETURN(model.norm_topk_prob, config.Bool("norm_topk_prob", true));
  ASSIGN_OR_RETURN(int64_t shared, config.Int("n_shared_experts", 1, 0, 64));
  model.shared_expert_intermediate_size = shared * model.moe_intermediate_size;
  if (model.shared_expert_intermediate_size > kMaxIntermediate) {
    return config.Error("n_shared_experts", "makes the shared experts too wide");
  }
  ASSIGN_OR_RETURN(int64_t dense_layers,
                   config.Int("first_k_dense_replace", default_dense_layers, 0, model.num_layers));
  model.layer_is_moe.assign(model.num_layers, false);
  for (int i = static_cast<int>(dense_layers); i < model.num_layers; ++i) {
    model.layer_is_moe[i] = true;
  }
  // Multi-token-prediction layers (stored past num_hidden_layers) serve speculative decoding
  // only and are not run, as in transformers; the count is only checked.
  RETURN_IF_ERROR(config.Int("num_nextn_predict_layers", 0, 0, kMaxLayers).status());
  return ParseGroupedRouter(config, model);
}

absl::Status ParseGlm4Moe(const ConfigReader& config, ModelConfig& model) {
  ASSIGN_OR_RETURN(model.qk_norm, config.Bool("use_qk_norm", false));
  ASSIGN_OR_RETURN(model.qkv_bias, config.Bool("attention_bias", false));
  model.o_bias = false;  // attention_bias covers q, k and v only
  return ParseDenseThenMoe(config, 1, model);
}

// DeepSeek-V3 (and Kimi-K2): multi-head latent attention, then GLM-4.5's MoE layout. Called
// before the RoPE is parsed: it sets head_dim and rotary_dim from the MLA dimensions.
absl::Status ParseDeepseekV3Attention(const ConfigReader& config, ModelConfig& model) {
  ASSIGN_OR_RETURN(int64_t nope, config.Int("qk_nope_head_dim", {}, 1, kMaxHeadDim));
  ASSIGN_OR_RETURN(int64_t rope, config.Int("qk_rope_head_dim", {}, 2, kMaxHeadDim));
  ASSIGN_OR_RETURN(int64_t v_dim, config.Int("v_head_dim", {}, 1, kMaxHeadDim));
  ASSIGN_OR_RETURN(int64_t kv_rank, config.Int("kv_lora_rank", {}, 1, kMaxHidden));
  if (rope % 2 != 0) return config.Error("qk_rope_head_dim", "must be even for RoPE");
  if (nope + rope > kMaxHeadDim) {
    return config.Error("qk_nope_head_dim", "and qk_rope_head_dim make the heads too wide");
  }
  // null (DeepSeek-V2-Lite's style) projects queries straight from the hidden state.
  if (config.Has("q_lora_rank")) {
    ASSIGN_OR_RETURN(int64_t q_rank, config.Int("q_lora_rank", {}, 1, kMaxHidden));
    model.q_lora_rank = static_cast<int>(q_rank);
  }
  ASSIGN_OR_RETURN(bool bias, config.Bool("attention_bias", false));
  if (bias) return config.Error("attention_bias", "true is not supported for deepseek_v3");
  ASSIGN_OR_RETURN(int64_t freq, config.Int("moe_layer_freq", 1, 1, kMaxLayers));
  if (freq != 1) return config.Error("moe_layer_freq", "other than 1 is not supported");
  ASSIGN_OR_RETURN(model.rope_interleave, config.Bool("rope_interleave", true));
  model.qk_nope_head_dim = static_cast<int>(nope);
  model.v_head_dim = static_cast<int>(v_dim);
  model.kv_lora_rank = static_cast<int>(kv_rank);
  model.head_dim = static_cast<int>(nope + rope);
  model.rotary_dim = static_cast<int>(rope);
  model.num_kv_heads = 1;  // the cache keeps one latent row per token
  return absl::OkStatus();
}

// transformers' DeepseekV3Attention: head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
// when the RoPE is scaled and mscale_all_dim is set and nonzero.
void SetDeepseekSoftmaxScale(ModelConfig& model) {
  double scale = 1.0 / std::sqrt(static_cast<double>(model.head_dim));
  if (model.rope.type != RopeConfig::Type::kDefault && model.rope.mscale_all_dim &&
      *model.rope.mscale_all_dim != 0.0 && model.rope.factor > 1.0) {
    const double m = 0.1 * *model.rope.mscale_all_dim * std::log(model.rope.factor) + 1.0;
    scale *= m * m;
  }
  model.softmax_scale = scale;
}

}  // namespace strata::config_internal
