#include "tools/strata/model_shapes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {
namespace {

// Hugging Face's initializer_range, recorded in config.json (make_model.cc draws with it).
constexpr double kInitializerRange = 0.02;

// deepseek-ai/DeepSeek-V3's config.json (R1's is the same): 671B without the
// multi-token-prediction layer, which is not made (num_nextn_predict_layers 0 here).
ModelShape DeepseekV3() {
  return {.name = "deepseek-v3",
          .model_type = "deepseek_v3",
          .layers = 61,
          .hidden = 7168,
          .vocab = 129280,
          .experts = 256,
          .top_k = 8,
          .expert_ffn = 2048,
          .dense_ffn = 18432,
          .heads = 128,
          .kv_heads = 128,
          .head_dim = 192,
          .rope_theta = 10000,
          .rms_norm_eps = 1e-6,
          .max_position_embeddings = 163840,
          .bos_token_id = 0,
          .eos_token_id = 1,
          .dense_layers = 3,
          .routed_scaling_factor = 2.5,
          .q_lora_rank = 1536,
          .kv_lora_rank = 512,
          .qk_nope_head_dim = 128,
          .qk_rope_head_dim = 64,
          .v_head_dim = 128,
          .n_group = 8,
          .topk_group = 4,
          .yarn = {.factor = 40, .original_max_position_embeddings = 4096}};
}

// moonshotai/Kimi-K2-Instruct's config.json (model_type kimi_k2, DeepseekV3ForCausalLM): 1.03T,
// DeepSeek-V3's architecture with these differences. Its rope_scaling has beta_fast 1 and
// beta_slow 1 (the released file's values, not DeepSeek-V3's 32 and 1).
ModelShape KimiK2() {
  ModelShape k = DeepseekV3();
  k.name = "kimi-k2";
  k.model_type = "kimi_k2";
  k.vocab = 163840;
  k.experts = 384;
  k.heads = k.kv_heads = 64;
  k.rope_theta = 50000;
  k.max_position_embeddings = 131072;
  k.bos_token_id = 163584;
  k.eos_token_id = 163585;
  k.dense_layers = 1;
  k.routed_scaling_factor = 2.827;
  k.n_group = k.topk_group = 1;
  k.yarn = {.factor = 32, .original_max_position_embeddings = 4096, .beta_fast = 1, .beta_slow = 1};
  return k;
}

// DeepSeek-V3 in small: every feature the CPU engine runs (q latent, YaRN with mscale, expert
// groups), a dense layer 192 wide so that 128 x 128 FP8 blocks end part-way.
ModelShape TinyDeepseek() {
  ModelShape t = DeepseekV3();
  t.name = "tiny-deepseek";
  t.layers = 3;
  t.hidden = 64;
  t.vocab = 256;
  t.experts = 8;
  t.top_k = 2;
  t.expert_ffn = 32;
  t.dense_ffn = 192;
  t.heads = t.kv_heads = 4;
  t.head_dim = 24;
  t.max_position_embeddings = 2048;
  t.bos_token_id = 1;
  t.eos_token_id = 2;
  t.dense_layers = 1;
  t.q_lora_rank = 32;
  t.kv_lora_rank = 16;
  t.qk_nope_head_dim = 16;
  t.qk_rope_head_dim = 8;
  t.v_head_dim = 16;
  t.n_group = 4;
  t.topk_group = 2;
  t.yarn = {.factor = 4, .original_max_position_embeddings = 512};
  return t;
}

const std::vector<ModelShape>& Shapes() {
  static const auto* shapes = new std::vector<ModelShape>{
      // name, type, layers, hidden, vocab, experts, top_k, expert_ffn, dense_ffn, heads,
      // kv_heads, head_dim, rope_theta, rms_norm_eps, max_position_embeddings, bos, eos
      {"qwen3-30b-a3b", "qwen3_moe", 48, 2048, 151936, 128, 8, 768, 6144, 32, 4, 128, 1e6, 1e-6,
       40960, 151643, 151645},
      {"mixtral-8x7b", "mixtral", 32, 4096, 32000, 8, 2, 14336, 0, 32, 8, 128, 1e6, 1e-5, 32768, 1,
       2},
      {"seed-125b", "qwen3_moe", 26, 4096, 151936, 64, 2, 6144, 12288, 32, 8, 128, 1e6, 1e-6, 40960,
       151643, 151645},
      {"tiny-qwen3", "qwen3_moe", 2, 64, 256, 8, 2, 32, 128, 4, 2, 16, 1e6, 1e-6, 2048, 1, 2},
      {"tiny-mixtral", "mixtral", 2, 64, 256, 8, 2, 32, 0, 4, 2, 16, 1e6, 1e-5, 2048, 1, 2},
      // GLM-4.5 (355B with its multi-token-prediction layer, which is not made) and GLM-4.5-Air;
      // then dense_layers, qk_norm, routed_scaling_factor.
      {"glm-4.5", "glm4_moe", 92,  5120, 151552, 160, 8,      1536, 12288, 96,
       8,         128,        1e6, 1e-5, 131072, -1,  151329, 3,    true,  2.5},
      {"glm-4.5-air", "glm4_moe", 46,   4096,   151552, 128,    8, 1408,  10944, 96, 8,
       128,           1e6,        1e-5, 131072, -1,     151329, 1, false, 1.0},
      {"tiny-glm4", "glm4_moe", 3,   64,   256,  8,  2, 32, 128,  4,
       2,           32,         1e6, 1e-5, 2048, -1, 2, 1,  true, 2.5},
      DeepseekV3(),
      KimiK2(),
      TinyDeepseek(),
  };
  return *shapes;
}

// DeepSeek-V3's keys: latent attention, the grouped sigmoid router, YaRN.
void AddDeepseekKeys(const ModelShape& s, int layers, nlohmann::json& c) {
  nlohmann::json rope_scaling = nullptr;
  if (s.yarn.factor > 0) {
    rope_scaling = {{"beta_fast", s.yarn.beta_fast},
                    {"beta_slow", s.yarn.beta_slow},
                    {"factor", s.yarn.factor},
                    {"mscale", s.yarn.mscale},
                    {"mscale_all_dim", s.yarn.mscale_all_dim},
                    {"original_max_position_embeddings", s.yarn.original_max_position_embeddings},
                    {"type", "yarn"}};
  }
  c.update({{"attention_bias", false},
            {"aux_loss_alpha", 0.001},
            {"ep_size", 1},
            {"first_k_dense_replace", DenseLayersOf(s, layers)},
            {"intermediate_size", s.dense_ffn},
            {"kv_lora_rank", s.kv_lora_rank},
            {"moe_intermediate_size", s.expert_ffn},
            {"moe_layer_freq", 1},
            {"n_group", s.n_group},
            {"n_routed_experts", s.experts},
            {"n_shared_experts", 1},
            {"norm_topk_prob", true},
            {"num_nextn_predict_layers", 0},
            {"pretraining_tp", 1},
            {"q_lora_rank", s.q_lora_rank > 0 ? nlohmann::json(s.q_lora_rank) : nullptr},
            {"qk_nope_head_dim", s.qk_nope_head_dim},
            {"qk_rope_head_dim", s.qk_rope_head_dim},
            // transformers' DeepseekV3Config default, written out: RoPE on adjacent pairs.
            {"rope_interleave", true},
            {"rope_scaling", std::move(rope_scaling)},
            {"routed_scaling_factor", s.routed_scaling_factor},
            {"scoring_func", "sigmoid"},
            {"seq_aux", true},
            {"topk_group", s.topk_group},
            {"topk_method", "noaux_tc"},
            {"v_head_dim", s.v_head_dim}});
  // The MLA dimensions set the heads; the released configs carry no head_dim.
  for (const char* key : {"head_dim", "output_router_logits", "sliding_window"}) c.erase(key);
}

}  // namespace

std::vector<std::string> ModelShapeNames() {
  std::vector<std::string> names;
  for (const ModelShape& s : Shapes()) names.push_back(s.name);
  return names;
}

absl::StatusOr<ModelShape> FindModelShape(absl::string_view name) {
  for (const ModelShape& s : Shapes()) {
    if (s.name == name) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown shape \"", name, "\" (", absl::StrJoin(ModelShapeNames(), ", "), ")"));
}

int DenseLayersOf(const ModelShape& shape, int layers) {
  return std::max(0, std::min(shape.dense_layers, layers - 1));
}

nlohmann::json ShapeConfigJson(const ModelShape& s, int layers, absl::string_view torch_dtype) {
  const bool qwen = s.model_type == "qwen3_moe";
  const bool glm = s.model_type == "glm4_moe";
  const bool deepseek = s.latent_attention();
  nlohmann::json c = {
      {"architectures",
       {qwen       ? "Qwen3MoeForCausalLM"
        : glm      ? "Glm4MoeForCausalLM"
        : deepseek ? "DeepseekV3ForCausalLM"
                   : "MixtralForCausalLM"}},
      {"attention_dropout", 0.0},
      {"bos_token_id", s.bos_token_id >= 0 ? nlohmann::json(s.bos_token_id) : nullptr},
      {"eos_token_id", s.eos_token_id},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", s.hidden},
      {"initializer_range", kInitializerRange},
      {"max_position_embeddings", s.max_position_embeddings},
      {"model_type", s.model_type},
      {"num_attention_heads", s.heads},
      {"num_experts_per_tok", s.top_k},
      {"num_hidden_layers", layers},
      {"num_key_value_heads", s.kv_heads},
      {"output_router_logits", false},
      {"rms_norm_eps", s.rms_norm_eps},
      {"rope_theta", s.rope_theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", false},
      {"torch_dtype", torch_dtype},
      {"transformers_version", "4.51.0"},
      {"use_cache", true},
      {"vocab_size", s.vocab},
  };
  if (qwen) {
    c.update({{"attention_bias", false},
              {"decoder_sparse_step", 1},
              {"intermediate_size", s.dense_ffn},
              {"max_window_layers", layers},
              {"mlp_only_layers", nlohmann::json::array()},
              {"moe_intermediate_size", s.expert_ffn},
              {"norm_topk_prob", true},
              {"num_experts", s.experts},
              {"rope_scaling", nullptr},
              {"router_aux_loss_coef", 0.001},
              {"use_sliding_window", false}});
  } else if (glm) {
    c.update({{"attention_bias", true},
              {"first_k_dense_replace", DenseLayersOf(s, layers)},
              {"intermediate_size", s.dense_ffn},
              {"moe_intermediate_size", s.expert_ffn},
              {"n_group", 1},
              {"n_routed_experts", s.experts},
              {"n_shared_experts", 1},
              {"norm_topk_prob", true},
              {"num_nextn_predict_layers", 0},
              {"partial_rotary_factor", 0.5},
              {"rope_scaling", nullptr},
              {"routed_scaling_factor", s.routed_scaling_factor},
              {"topk_group", 1},
              {"use_qk_norm", s.qk_norm}});
    c.erase("sliding_window");
  } else if (deepseek) {
    AddDeepseekKeys(s, layers, c);
  } else {
    c.update({{"intermediate_size", s.expert_ffn},
              {"num_local_experts", s.experts},
              {"router_aux_loss_coef", 0.02},
              {"router_jitter_noise", 0.0}});
  }
  return c;
}

}  // namespace strata
