// A deepseek_v3 engine's KV pool: one latent row per token and layer, no value rows, and no
// FP8 (the oracle test checks what attention computes from it).
#include <string>

#include "common/engine/local_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

LocalEngineOptions DeepseekOptions() {
  LocalEngineOptions options;
  options.model_dir = std::string(STRATA_TEST_DATA_DIR) + "/oracles/deepseek_v3";
  options.num_threads = 1;
  options.kv.block_size = 8;
  return options;
}

TEST(LatentEngineTest, ThePoolHoldsTheLatentAndKpeOnce) {
  auto engine = LocalEngine::Create(DeepseekOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const KvPoolOptions& o = (*engine)->kv().options();
  EXPECT_EQ(o.num_kv_heads, 1);
  EXPECT_EQ(o.head_dim, 32 + 8);
  EXPECT_TRUE(o.values_in_keys);
  // float32 on the CPU: 3 layers of 40 values a token.
  EXPECT_EQ(KvBlockBytes(o), int64_t{3} * 8 * 40 * sizeof(float));
  // The pool still runs a prompt across several blocks.
  auto logits = (*engine)->Logits({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->rows(), 12);
}

TEST(LatentEngineTest, Fp8CacheIsRefused) {
  LocalEngineOptions options = DeepseekOptions();
  options.kv.dtype = KvDtype::kFp8;
  auto engine = LocalEngine::Create(options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(engine.status().message()), HasSubstr("multi-head latent attention"));
}

}  // namespace
}  // namespace strata
