// The latent KV cache of multi-head latent attention: one row per token and layer holding the
// normalized latent and k_pe, which serves as both key and value.
#include <string>

#include "common/kv/paged_kv_cache.h"
#include "common/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// DeepSeek-V3's attention shape (61 layers, 128 heads, latent 512, k_pe 64), MoE kept small.
constexpr char kDeepseekV3Shape[] = R"({"model_type": "deepseek_v3", "vocab_size": 129280,
  "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
  "num_key_value_heads": 128, "max_position_embeddings": 163840, "q_lora_rank": 1536,
  "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
  "moe_intermediate_size": 16, "intermediate_size": 16})";

// The pool's shape as ModelStack derives it from a config.
KvPoolOptions PoolFor(const ModelConfig& c, int element_bytes) {
  KvPoolOptions o;
  o.cache.block_size = 16;
  o.num_blocks = 4;
  o.num_layers = c.num_layers;
  o.num_kv_heads = c.num_kv_heads;
  o.head_dim = c.KvHeadDim();
  o.values_in_keys = c.KvValuesInKeys();
  o.element_bytes = element_bytes;
  return o;
}

TEST(LatentKvCacheTest, BytesPerTokenAreTheLatentAndKpeOnce) {
  auto c = ParseModelConfig(kDeepseekV3Shape, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  for (int element_bytes : {2, 4}) {
    const KvPoolOptions o = PoolFor(*c, element_bytes);
    const int64_t per_token_layer = KvBlockBytes(o) / (int64_t{o.cache.block_size} * c->num_layers);
    EXPECT_EQ(per_token_layer, (512 + 64) * element_bytes);
  }
  // Against full per-head keys (192 wide) and values (128): 128 x 320 = 40960 values.
  const KvPoolOptions o = PoolFor(*c, 2);
  EXPECT_EQ(int64_t{128} * (192 + 128) * 2 * o.cache.block_size * c->num_layers / KvBlockBytes(o),
            71);
}

TEST(LatentKvCacheTest, ValuesAreTheKeys) {
  KvPoolOptions o;
  o.cache = {.block_size = 4, .prefix_caching = false};
  o.num_blocks = 3;
  o.num_layers = 2;
  o.num_kv_heads = 1;
  o.head_dim = 5;
  o.values_in_keys = true;
  auto kv = PagedKvCache::Create(o);
  ASSERT_TRUE(kv.ok()) << kv.status();
  const auto a = kv->AddSequence();
  const auto b = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 6).ok());
  ASSERT_TRUE(kv->Reserve(b, 4).ok());
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = 0; p < 6; ++p) {
      EXPECT_EQ(kv->key(layer, a, p), kv->value(layer, a, p));
      for (int i = 0; i < 5; ++i) kv->key(layer, a, p)[i] = layer * 100 + p * 10 + i;
    }
    for (int64_t p = 0; p < 4; ++p) {
      for (int i = 0; i < 5; ++i) kv->key(layer, b, p)[i] = -1.0f;
    }
  }
  // Rows are packed one after another: no layer, slot or sequence overwrote another.
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = 0; p < 6; ++p) {
      for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(kv->key(layer, a, p)[i], layer * 100 + p * 10 + i);
      }
    }
  }
  const int block = kv->block_table(a)[1];
  EXPECT_EQ(kv->block_data(1, block, 0), kv->block_data(1, block, 1));
  EXPECT_EQ(kv->block_data(1, block, 0) + 5, kv->key(1, a, 5));
}

TEST(LatentKvCacheTest, Fp8IsRefused) {
  auto c = ParseModelConfig(kDeepseekV3Shape, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  KvPoolOptions o = PoolFor(*c, 1);
  o.cache.dtype = KvDtype::kFp8;
  auto kv = PagedKvCache::Create(o);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(kv.status().message()), HasSubstr("multi-head latent attention"));
}

}  // namespace
}  // namespace strata
