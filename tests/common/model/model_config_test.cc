#include "common/model/model_config.h"

#include <string>

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

TEST(ModelConfigTest, Qwen3Moe) {
  auto c = LoadModelConfig(OracleDir("qwen3_moe"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen3Moe);
  EXPECT_EQ(c->num_experts, 16);
  EXPECT_EQ(c->top_k, 4);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->layer_is_moe, std::vector<bool>(3, true));
}

// qwen3-30b-a3b's shape: 48 layers of q/k/v/o (2048 -> 4096 + 2 x 512, 4096 -> 2048), a
// 128-expert gate and 8 experts of 3 x 2048 x 768; attention 32 heads of 128.
TEST(ModelConfigTest, PrefillFlops) {
  ModelConfig c;
  c.hidden_size = 2048;
  c.num_layers = 48;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.num_experts = 128;
  c.top_k = 8;
  c.moe_intermediate_size = 768;
  c.layer_is_moe.assign(48, true);
  const double per_layer = 2048.0 * (4096 + 512 + 512 + 4096) + 2048.0 * 128 + 8 * 3 * 2048.0 * 768;
  EXPECT_DOUBLE_EQ(LinearFlopsPerToken(c), 2 * 48 * per_layer);  // 5.45 GFLOP
  EXPECT_DOUBLE_EQ(AttentionFlopsPerPair(c), 4.0 * 48 * 32 * 128);
  // A dense layer instead: its MLP, no gate.
  c.layer_is_moe[0] = false;
  c.dense_intermediate_size = 6144;
  EXPECT_DOUBLE_EQ(LinearFlopsPerToken(c),
                   2 * (47 * per_layer + 2048.0 * 9216 + 3 * 2048.0 * 6144));
}

TEST(ModelConfigTest, DenseLayersAndTiedEmbeddings) {
  auto c = LoadModelConfig(OracleDir("qwen3_moe_dense_tied"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(c->head_dim, 32);
}

TEST(ModelConfigTest, MixtralDefaultsHeadDimAndEos) {
  auto c = LoadModelConfig(OracleDir("mixtral"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c->sliding_window, std::vector<int>(3, 0));
}

TEST(ModelConfigTest, Qwen2MoeSharedExpert) {
  auto c = LoadModelConfig(OracleDir("qwen2_moe"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shared_expert_intermediate_size, 64);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->norm_topk_prob);
}

TEST(ModelConfigTest, GptOss) {
  auto c = LoadModelConfig(OracleDir("gpt_oss"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gate_scoring, GateScoring::kTopKThenSoftmax);
  EXPECT_EQ(c->activation, ExpertActivation::kClampedSwiGlu);
  EXPECT_EQ(c->sliding_window, (std::vector<int>{8, 0, 8}));
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kYarn);
  EXPECT_EQ(c->rope.factor, 32.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096.0);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_TRUE(c->qkv_bias && c->o_bias);
}

TEST(ModelConfigTest, Glm4Moe) {
  auto c = LoadModelConfig(OracleDir("glm4_moe"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kGlm4Moe);
  EXPECT_EQ(c->head_dim, 32);  // hidden_size / heads would be 16
  EXPECT_EQ(c->rotary_dim, 16);
  EXPECT_EQ(c->RopeDim(), 16);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_EQ(c->num_experts, 16);
  EXPECT_EQ(c->top_k, 4);
  EXPECT_EQ(c->gate_scoring, GateScoring::kSigmoidGrouped);
  EXPECT_TRUE(c->router_correction_bias);
  EXPECT_EQ(c->num_expert_groups, 4);
  EXPECT_EQ(c->top_k_groups, 2);
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->shared_expert_intermediate_size, 32);
  EXPECT_FALSE(c->shared_expert_gate);
  EXPECT_EQ(c->dense_intermediate_size, 128);
  EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, true, true}));
}

// GLM-4.5's own config.json (transformers 4.54): partial_rotary_factor and rope_theta at the
// top level, two shared experts here, a multi-token-prediction layer that is not run.
TEST(ModelConfigTest, Glm4MoeOlderSpelling) {
  const std::string text = R"({"model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "partial_rotary_factor": 0.5, "rope_theta": 1000000, "rope_scaling": null,
    "max_position_embeddings": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 8, "intermediate_size": 48, "n_shared_experts": 2,
    "first_k_dense_replace": 3, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
    "num_nextn_predict_layers": 1, "use_qk_norm": false, "attention_bias": true})";
  auto c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.theta, 1000000.0);
  EXPECT_EQ(c->rotary_dim, 8);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->shared_expert_intermediate_size, 16);
  EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(c->num_expert_groups, 1);
}

TEST(ModelConfigTest, RopeDimIsTheWholeHeadUnlessSet) {
  ModelConfig c;
  c.head_dim = 64;
  EXPECT_EQ(c.RopeDim(), 64);
  c.rotary_dim = 32;
  EXPECT_EQ(c.RopeDim(), 32);
}

TEST(ModelConfigTest, OlderRopeSpelling) {
  const std::string text = R"({"model_type": "mixtral", "vocab_size": 32, "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
    "intermediate_size": 32, "rope_theta": 500000.0, "rope_scaling": null})";
  auto c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kDefault);
}

// A small valid qwen3_moe config.json.
nlohmann::json SmallQwen3Config() {
  return {{"model_type", "qwen3_moe"},     {"vocab_size", 32},         {"hidden_size", 16},
          {"num_hidden_layers", 2},        {"num_attention_heads", 2}, {"num_key_value_heads", 1},
          {"max_position_embeddings", 64}, {"num_experts", 4},         {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 8},    {"intermediate_size", 32}};
}

// Each malformed config names the file and the key at fault.
class BadConfigTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(BadConfigTest, ClearError) {
  nlohmann::json base = SmallQwen3Config();
  ExpectRefused(base, GetParam().first, GetParam().second);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadConfigTest,
    ::testing::Values(
        std::make_pair(R"({"model_type": "llama"})", "\"llama\" is not a supported architecture"),
        std::make_pair(R"({"model_type": null})", "\"model_type\" is missing"),
        std::make_pair(R"({"hidden_size": "big"})", "\"hidden_size\" must be an integer"),
        std::make_pair(R"({"hidden_size": 0})", "\"hidden_size\" must be at least 1"),
        std::make_pair(R"({"num_hidden_layers": null})", "\"num_hidden_layers\" is missing"),
        std::make_pair(R"({"num_attention_heads": 4, "num_key_value_heads": 3})",
                       "must divide num_attention_heads"),
        std::make_pair(R"({"num_experts_per_tok": 5})", "exceeds the number of experts"),
        std::make_pair(R"({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1.0}})",
                       "\"dynamic\" is not supported"),
        std::make_pair(R"({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})",
                       "\"factor\" is missing"),
        std::make_pair(R"({"use_sliding_window": true, "sliding_window": 4})",
                       "\"use_sliding_window\" true is not supported"),
        std::make_pair(R"({"mlp_only_layers": [7]})", "outside [0, num_hidden_layers)"),
        std::make_pair(R"({"hidden_act": "gelu"})", "\"hidden_act\" other than"),
        std::make_pair(R"({"eos_token_id": "x"})", "eos_token_id"),
        std::make_pair(R"({"head_dim": 7})", "must be even"),
        // Values that would overflow the field they go to, or size absurd allocations, are
        // refused as 64-bit numbers before anything narrows or allocates them.
        std::make_pair(R"({"num_hidden_layers": 1000000000})",
                       "\"num_hidden_layers\" must be at most 1024, got 1000000000"),
        std::make_pair(R"({"num_hidden_layers": 1099511627776})",
                       "\"num_hidden_layers\" must be at most 1024"),
        std::make_pair(R"({"num_hidden_layers": 4294967304})",
                       "\"num_hidden_layers\" must be at most 1024, got 4294967304"),
        std::make_pair(R"({"num_hidden_layers": 18446744073709551615})",
                       "\"num_hidden_layers\" must be at most 1024"),
        std::make_pair(R"({"vocab_size": 100000000000})", "\"vocab_size\" must be at most"),
        std::make_pair(R"({"hidden_size": 4294967296})", "\"hidden_size\" must be at most"),
        std::make_pair(R"({"num_attention_heads": 4294967298})",
                       "\"num_attention_heads\" must be at most"),
        std::make_pair(R"({"num_key_value_heads": 4})",
                       "\"num_key_value_heads\" must be at most 2, got 4"),
        std::make_pair(R"({"num_experts": 4294967300})", "\"num_experts\" must be at most"),
        std::make_pair(R"({"moe_intermediate_size": -8})",
                       "\"moe_intermediate_size\" must be at least 1"),
        std::make_pair(R"({"max_position_embeddings": 1099511627776})",
                       "\"max_position_embeddings\" must be at most"),
        std::make_pair(R"({"head_dim": 1099511627776})", "\"head_dim\" must be at most"),
        std::make_pair(R"({"hidden_size": 65536, "num_attention_heads": 2})",
                       "gives heads of 32768 dimensions"),
        std::make_pair(R"({"rms_norm_eps": -1})", "\"rms_norm_eps\" must be greater than 0"),
        std::make_pair(R"({"rms_norm_eps": 0})", "\"rms_norm_eps\" must be greater than 0"),
        std::make_pair(R"({"rms_norm_eps": 2.5})", "\"rms_norm_eps\" must be less than 1"),
        std::make_pair(R"({"rope_theta": -10000})", "\"rope_theta\" must be greater than 0"),
        std::make_pair(R"({"eos_token_id": 4294967296})", "eos_token_id"),
        std::make_pair(R"({"eos_token_id": [1, -2]})", "eos_token_id"),
        // Block-scaled FP8's quantization_config.
        std::make_pair(R"({"quantization_config": 8})",
                       "\"quantization_config\" must be an object"),
        std::make_pair(R"({"quantization_config": {"quant_method": "fp8"}})",
                       "\"quantization_config.weight_block_size\" is missing"),
        std::make_pair(R"({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2",
                           "weight_block_size": [128, 128]}})",
                       "\"quantization_config.fmt\" \"e5m2\" is not supported (e4m3)"),
        std::make_pair(R"({"quantization_config": {"quant_method": "fp8",
                           "activation_scheme": "static", "weight_block_size": [128, 128]}})",
                       "\"quantization_config.activation_scheme\" \"static\" is not supported"),
        std::make_pair(R"({"quantization_config": {"quant_method": "fp8",
                           "weight_block_size": [128]}})",
                       "\"quantization_config.weight_block_size\" must be two positive integers"),
        std::make_pair(R"({"quantization_config": {"quant_method": "fp8",
                           "weight_block_size": [0, 128]}})",
                       "\"quantization_config.weight_block_size\" must be two positive integers")));

// DeepSeek's quantization_config gives the FP8 block size; compressed-tensors' does not concern
// the config (its per-row scales are read from the tensors).
TEST(ModelConfigTest, Fp8BlockSizeFromTheQuantizationConfig) {
  nlohmann::json base = SmallQwen3Config();
  auto plain = ParseModelConfig(base.dump(), "config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->fp8_block_scaled());
  base["quantization_config"] = {{"activation_scheme", "dynamic"},
                                 {"fmt", "e4m3"},
                                 {"quant_method", "fp8"},
                                 {"weight_block_size", {128, 64}}};
  auto blocks = ParseModelConfig(base.dump(), "config.json");
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_TRUE(blocks->fp8_block_scaled());
  EXPECT_EQ(blocks->fp8_block_rows, 128);
  EXPECT_EQ(blocks->fp8_block_cols, 64);
  base["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                 {"format", "float-quantized"}};
  auto channel = ParseModelConfig(base.dump(), "config.json");
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_FALSE(channel->fp8_block_scaled());
}

// The same for GLM-4.5's keys: unsupported router, rope and group settings are refused.
class BadGlmConfigTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(BadGlmConfigTest, ClearError) {
  nlohmann::json base = {{"model_type", "glm4_moe"},
                         {"vocab_size", 32},
                         {"hidden_size", 16},
                         {"num_hidden_layers", 2},
                         {"num_attention_heads", 2},
                         {"num_key_value_heads", 1},
                         {"max_position_embeddings", 64},
                         {"n_routed_experts", 8},
                         {"num_experts_per_tok", 2},
                         {"moe_intermediate_size", 8},
                         {"intermediate_size", 32},
                         {"head_dim", 16},
                         {"n_group", 4},
                         {"topk_group", 2}};
  ExpectRefused(base, GetParam().first, GetParam().second);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadGlmConfigTest,
    ::testing::Values(
        std::make_pair(R"({"head_dim": null})", "\"head_dim\" is missing"),
        std::make_pair(R"({"n_routed_experts": null})", "\"n_routed_experts\" is missing"),
        std::make_pair(R"({"n_group": 3})", "\"n_group\" must divide the 8 experts"),
        std::make_pair(R"({"n_group": 16})", "\"n_group\" must be at most 8"),
        std::make_pair(R"({"topk_group": 5})", "\"topk_group\" must be at most 4"),
        std::make_pair(R"({"topk_group": 1, "num_experts_per_tok": 3})",
                       "exceeds the experts of the topk_group groups kept"),
        std::make_pair(R"({"scoring_func": "softmax"})", "\"scoring_func\" \"softmax\""),
        std::make_pair(R"({"topk_method": "greedy"})", "\"topk_method\" \"greedy\""),
        std::make_pair(R"({"routed_scaling_factor": 0})",
                       "\"routed_scaling_factor\" must be greater than 0"),
        std::make_pair(R"({"first_k_dense_replace": 3})",
                       "\"first_k_dense_replace\" must be at most 2"),
        std::make_pair(R"({"partial_rotary_factor": 0.05})", "gives 0 rotary dimensions"),
        std::make_pair(R"({"rope_parameters": {"partial_rotary_factor": 1.5}})",
                       "\"partial_rotary_factor\" must be at most 1"),
        std::make_pair(R"({"hidden_act": "gelu"})", "\"hidden_act\" other than")));

TEST(ModelConfigTest, PartialRotaryOnlyForGlm) {
  const std::string text = R"({"model_type": "mixtral", "vocab_size": 32, "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64,
    "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}})";
  auto c = ParseModelConfig(text, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("\"partial_rotary_factor\" other than 1.0 is not supported for mixtral"));
}

TEST(ModelConfigTest, NotJson) {
  auto c = ParseModelConfig("{oops", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("config.json: not a JSON object"));
}

TEST(ModelConfigTest, MissingFile) {
  auto c = LoadModelConfig("/nonexistent/model");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/model/config.json"));
}

}  // namespace
}  // namespace strata
