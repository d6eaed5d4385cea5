// deepseek_v3 configs: multi-head latent attention dimensions, YaRN's softmax scale, the
// grouped sigmoid router and the dense-then-MoE layout, and refusals of what is not supported.
#include <cmath>
#include <string>

#include "common/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/config_refusal.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::string OracleDir(const std::string& name) {
  return std::string(STRATA_TEST_DATA_DIR) + "/oracles/" + name;
}

TEST(DeepseekConfigTest, OracleModel) {
  auto c = LoadModelConfig(OracleDir("deepseek_v3"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kDeepseekV3);
  EXPECT_EQ(ArchitectureName(c->arch), "deepseek_v3");
  EXPECT_TRUE(c->mla());
  EXPECT_EQ(c->q_lora_rank, 48);
  EXPECT_EQ(c->kv_lora_rank, 32);
  EXPECT_EQ(c->qk_nope_head_dim, 16);
  EXPECT_EQ(c->RopeDim(), 8);
  EXPECT_EQ(c->head_dim, 24);  // config.json's head_dim (8) is the RoPE width
  EXPECT_EQ(c->v_head_dim, 16);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 1);  // one latent row per token
  EXPECT_EQ(c->KvHeadDim(), 40);
  EXPECT_TRUE(c->KvValuesInKeys());
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.factor, 4.0);
  EXPECT_DOUBLE_EQ(c->rope.original_max_position_embeddings, 128.0);
  const double m = 0.1 * std::log(4.0) + 1.0;
  EXPECT_NEAR(c->softmax_scale, m * m / std::sqrt(24.0), 1e-12);
  EXPECT_EQ(c->gate_scoring, GateScoring::kSigmoidGrouped);
  EXPECT_TRUE(c->router_correction_bias);
  EXPECT_EQ(c->num_experts, 16);
  EXPECT_EQ(c->top_k, 4);
  EXPECT_EQ(c->num_expert_groups, 4);
  EXPECT_EQ(c->top_k_groups, 2);
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->shared_expert_intermediate_size, 32);
  EXPECT_FALSE(c->shared_expert_gate);
  EXPECT_EQ(c->dense_intermediate_size, 128);
  EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c->sliding_window, (std::vector<int>{0, 0, 0}));
}

// The attention FLOPs count the absorbed form: per head and pair, [latent; k_pe] for the
// score and the latent for the value.
TEST(DeepseekConfigTest, AttentionFlopsOfTheLatentForm) {
  auto c = LoadModelConfig(OracleDir("deepseek_v3"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(AttentionFlopsPerPair(*c), 2.0 * 3 * 4 * (40 + 32));
  EXPECT_GT(LinearFlopsPerToken(*c), 0.0);
}

// DeepSeek-V3's own config.json spelling (transformers 4.x): rope_scaling, q_lora_rank null as
// DeepSeek-V2-Lite has it, defaults for rope_interleave and first_k_dense_replace, an MTP layer.
TEST(DeepseekConfigTest, NoQueryLatentAndOlderSpelling) {
  const std::string text = R"({"model_type": "deepseek_v3", "vocab_size": 64,
    "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "max_position_embeddings": 256, "q_lora_rank": null,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
    "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40,
    "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
    "mscale_all_dim": 0.5}, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 8, "intermediate_size": 48, "n_shared_experts": 2, "n_group": 2,
    "topk_group": 1, "routed_scaling_factor": 1.5, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "moe_layer_freq": 1, "num_nextn_predict_layers": 1})";
  auto c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->head_dim, 12);
  EXPECT_EQ(c->KvHeadDim(), 20);
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(c->shared_expert_intermediate_size, 16);
  const double m = 0.1 * 0.5 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->softmax_scale, m * m / std::sqrt(12.0), 1e-12);
}

TEST(DeepseekConfigTest, KimiK2ModelTypeAndPlainRope) {
  const std::string text = R"({"model_type": "kimi_k2", "vocab_size": 64, "hidden_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64,
    "q_lora_rank": 8, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
    "v_head_dim": 4, "rope_interleave": false, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 16,
    "first_k_dense_replace": 0})";
  auto c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kDeepseekV3);
  EXPECT_FALSE(c->rope_interleave);
  EXPECT_NEAR(c->softmax_scale, 1.0 / std::sqrt(6.0), 1e-12);  // no YaRN: no mscale
  EXPECT_EQ(c->layer_is_moe, std::vector<bool>{true});
}

class BadDeepseekConfigTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {
};

TEST_P(BadDeepseekConfigTest, ClearError) {
  // The oracle model's shape (tests/data/oracles/deepseek_v3).
  nlohmann::json base = nlohmann::json::parse(R"({"model_type": "deepseek_v3",
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 8, "max_position_embeddings": 512, "q_lora_rank": 48,
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
    "original_max_position_embeddings": 128, "mscale": 1.0, "mscale_all_dim": 1.0},
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "moe_intermediate_size": 32, "intermediate_size": 128, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true})");
  ExpectRefused(base, GetParam().first, GetParam().second);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadDeepseekConfigTest,
    ::testing::Values(
        std::make_pair(R"({"kv_lora_rank": null})", "\"kv_lora_rank\" is missing"),
        std::make_pair(R"({"kv_lora_rank": 0})", "\"kv_lora_rank\" must be at least 1"),
        std::make_pair(R"({"q_lora_rank": 0})", "\"q_lora_rank\" must be at least 1"),
        std::make_pair(R"({"qk_nope_head_dim": null})", "\"qk_nope_head_dim\" is missing"),
        std::make_pair(R"({"qk_rope_head_dim": 7})", "\"qk_rope_head_dim\" must be even"),
        std::make_pair(R"({"v_head_dim": 0})", "\"v_head_dim\" must be at least 1"),
        std::make_pair(R"({"qk_nope_head_dim": 1020})", "make the heads too wide"),
        std::make_pair(R"({"attention_bias": true})", "\"attention_bias\" true is not supported"),
        std::make_pair(R"({"moe_layer_freq": 2})", "\"moe_layer_freq\" other than 1"),
        std::make_pair(R"({"topk_method": "greedy"})", "\"topk_method\" \"greedy\""),
        std::make_pair(R"({"scoring_func": "softmax"})", "\"scoring_func\" \"softmax\""),
        std::make_pair(R"({"n_group": 3})", "\"n_group\" must divide the 16 experts"),
        std::make_pair(R"({"first_k_dense_replace": 4})",
                       "\"first_k_dense_replace\" must be at most 3"),
        std::make_pair(R"({"num_nextn_predict_layers": -1})",
                       "\"num_nextn_predict_layers\" must be at least 0"),
        std::make_pair(R"({"rope_parameters": {"rope_type": "linear"}})",
                       "\"rope_type\" \"linear\" is not supported"),
        std::make_pair(R"({"rope_interleave": 1})", "\"rope_interleave\" must be true or false")));

}  // namespace
}  // namespace strata
