// The configs of DeepSeek-V3 and GLM-4.5: the grouped sigmoid router, dense first layers
// then MoE layers with ungated shared experts, and DeepSeek-V3's multi-head latent attention.
// Internal to common/model (ParseModelConfig calls them).
#ifndef STRATA_COMMON_MODEL_DEEPSEEK_CONFIG_H_
#define STRATA_COMMON_MODEL_DEEPSEEK_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/config_reader.h"
#include "common/model/model_config.h"

namespace strata::config_internal {

// GLM-4.5 and DeepSeek-V3: layers below first_k_dense_replace (default_dense_layers when
// unset) are dense; the rest are MoE layers with the grouped router and shared experts.
absl::Status ParseDenseThenMoe(const ConfigReader& config, int64_t default_dense_layers,
                               ModelConfig& model);

// GLM-4.5's attention flags, then ParseDenseThenMoe.
absl::Status ParseGlm4Moe(const ConfigReader& config, ModelConfig& model);

// DeepSeek-V3's latent attention dimensions; sets head_dim, rotary_dim and num_kv_heads, so it
// runs before the RoPE is parsed.
absl::Status ParseDeepseekV3Attention(const ConfigReader& config, ModelConfig& model);

// DeepSeek-V3's softmax scale, from head_dim and the parsed RoPE.
void SetDeepseekSoftmaxScale(ModelConfig& model);

}  // namespace strata::config_internal

#endif  // STRATA_COMMON_MODEL_DEEPSEEK_CONFIG_H_
