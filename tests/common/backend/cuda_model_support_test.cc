#include "common/backend/cuda_model_support.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/oracles.h"

namespace strata {
namespace {

using ::strata::testing::OracleDir;
using ::testing::HasSubstr;

TEST(CudaModelSupportTest, RefusesInterleavedRopeAndScaledSoftmaxOutsideLatentAttention) {
  auto c = LoadModelConfig(OracleDir("deepseek_v3"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(CudaRouterSupports(*c).ok());
  c->kv_lora_rank = 0;  // the same settings on standard attention
  const absl::Status s = CudaRouterSupports(*c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  const std::string message(s.message());
  EXPECT_THAT(message, HasSubstr("deepseek_v3"));
  EXPECT_THAT(message, HasSubstr("interleaved RoPE"));
  EXPECT_THAT(message, HasSubstr("a YaRN mscale on the softmax scale"));
  EXPECT_THAT(message, HasSubstr("Use --device cpu"));
}

TEST(CudaModelSupportTest, TakesTheOtherArchitectures) {
  for (const char* name :
       {"qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss", "glm4_moe", "deepseek_v3"}) {
    auto c = LoadModelConfig(OracleDir(name));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(CudaRouterSupports(*c).ok()) << name;
    EXPECT_TRUE(CudaExpertsSupport(*c).ok()) << name;
  }
}

// Block-scaled FP8 (DeepSeek's weight_scale_inv) is refused by the router and the expert
// backends alike, naming the layout, rather than read with per-row scales.
TEST(CudaModelSupportTest, RefusesBlockScaledFp8) {
  auto c = LoadModelConfig(OracleDir("qwen3_moe"));
  ASSERT_TRUE(c.ok()) << c.status();
  c->fp8_block_rows = 128;
  c->fp8_block_cols = 128;
  for (const absl::Status& s : {CudaRouterSupports(*c), CudaExpertsSupport(*c)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("block-scaled FP8 weights (quantization_config weight_block_size "
                          "[128, 128]: each matrix's weight_scale_inv"));
  }
}

TEST(CudaModelSupportTest, RefusesMoreExpertsThanTheGateHolds) {
  auto c = LoadModelConfig(OracleDir("qwen3_moe"));
  ASSERT_TRUE(c.ok()) << c.status();
  c->num_experts = 512;
  const absl::Status s = CudaRouterSupports(*c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("a gate over 512 experts (384 at most)"));
}

}  // namespace
}  // namespace strata
