// The architectures `strata make-model` writes: the benchmark shapes (real models' sizes) and
// tiny ones for tests, and the config.json of each as transformers writes it.
#ifndef STRATA_TOOLS_STRATA_MODEL_SHAPES_H_
#define STRATA_TOOLS_STRATA_MODEL_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata {

// YaRN as DeepSeek-V3's rope_scaling spells it; factor 0 means plain RoPE.
struct YarnShape {
  double factor = 0.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
};

// The architecture of one shape, as config.json spells it.
struct ModelShape {
  std::string name;
  std::string model_type;  // "qwen3_moe", "mixtral", "glm4_moe", "deepseek_v3" or "kimi_k2"
  int layers = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  int experts = 0;
  int top_k = 0;
  int64_t expert_ffn = 0;  // moe_intermediate_size (qwen3_moe) / intermediate_size (mixtral)
  int64_t dense_ffn = 0;   // intermediate_size of dense layers (qwen3_moe: none here)
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // not written for latent attention (the MLA dimensions below set it)
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  int bos_token_id = 0;  // negative: none (GLM)
  int eos_token_id = 0;
  // glm4_moe and the DeepSeek types: first_k_dense_replace, use_qk_norm (GLM),
  // routed_scaling_factor. One ungated shared expert of expert_ffn (n_shared_experts 1); GLM:
  // one expert group, partial_rotary_factor 0.5.
  int dense_layers = 0;
  bool qk_norm = false;
  double routed_scaling_factor = 1.0;
  // deepseek_v3 / kimi_k2: multi-head latent attention (q_lora_rank 0: q_proj from the hidden
  // state), the router's expert groups, YaRN.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int n_group = 1;
  int topk_group = 1;
  YarnShape yarn;

  bool latent_attention() const { return kv_lora_rank > 0; }
  // A correction-biased sigmoid router and plural shared experts (GLM-4.5, DeepSeek-V3).
  bool grouped_router() const { return model_type == "glm4_moe" || latent_attention(); }
};

// qwen3-30b-a3b, mixtral-8x7b, seed-125b, glm-4.5, glm-4.5-air, deepseek-v3, kimi-k2, and
// tiny-qwen3 / tiny-mixtral / tiny-glm4 / tiny-deepseek for tests.
std::vector<std::string> ModelShapeNames();
absl::StatusOr<ModelShape> FindModelShape(absl::string_view name);

// The dense layers of a cut to `layers` layers: the shape's first_k_dense_replace, but at most
// layers - 1, so that every cut keeps at least one MoE layer (a 1-layer cut of deepseek-v3 is
// one MoE layer; a 4-layer cut is its 3 dense layers and one MoE layer).
int DenseLayersOf(const ModelShape& shape, int layers);

// config.json as transformers writes it (keys sorted) for the shape cut to `layers` layers.
nlohmann::json ShapeConfigJson(const ModelShape& shape, int layers, absl::string_view torch_dtype);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_MODEL_SHAPES_H_
