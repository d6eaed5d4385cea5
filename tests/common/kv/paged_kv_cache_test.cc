#include "common/kv/paged_kv_cache.h"

#include <set>

#include "gtest/gtest.h"

namespace strata {
namespace {

KvPoolOptions SmallOptions() {
  return KvPoolOptions{.cache = {.block_size = 4, .prefix_caching = false},
                       .num_blocks = 5,
                       .num_layers = 2,
                       .num_kv_heads = 2,
                       .head_dim = 3};
}

TEST(PagedKvCacheTest, RejectsBadOptions) {
  KvPoolOptions options = SmallOptions();
  options.cache.block_size = 0;
  EXPECT_FALSE(PagedKvCache::Create(options).ok());
  options = SmallOptions();
  options.num_blocks = -1;
  EXPECT_FALSE(PagedKvCache::Create(options).ok());
}

TEST(PagedKvCacheTest, ReservesWholeBlocks) {
  auto kv = PagedKvCache::Create(SmallOptions());
  ASSERT_TRUE(kv.ok());
  const auto seq = kv->AddSequence();
  EXPECT_EQ(kv->capacity(seq), 0);
  ASSERT_TRUE(kv->Reserve(seq, 1).ok());
  EXPECT_EQ(kv->capacity(seq), 4);
  EXPECT_EQ(kv->free_blocks(), 4);
  ASSERT_TRUE(kv->Reserve(seq, 4).ok());
  EXPECT_EQ(kv->free_blocks(), 4);
  ASSERT_TRUE(kv->Reserve(seq, 9).ok());
  EXPECT_EQ(kv->capacity(seq), 12);
  EXPECT_EQ(kv->block_table(seq).size(), 3u);
}

TEST(PagedKvCacheTest, CountsBlocksAndBytes) {
  auto kv = PagedKvCache::Create(SmallOptions());
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->pool_tokens(), 20);
  EXPECT_EQ(kv->BlocksFor(0), 0);
  EXPECT_EQ(kv->BlocksFor(4), 1);
  EXPECT_EQ(kv->BlocksFor(5), 2);
  const auto seq = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(seq, 5).ok());
  EXPECT_EQ(kv->blocks_held(seq), 2);
  // 2 layers x keys and values x 4 slots x 2 heads x 3 dims, at the element size.
  KvPoolOptions bf16 = SmallOptions();
  bf16.element_bytes = 2;
  EXPECT_EQ(KvBlockBytes(SmallOptions()), 2 * 2 * 4 * 2 * 3 * 4);
  EXPECT_EQ(KvBlockBytes(bf16), 2 * 2 * 4 * 2 * 3 * 2);
}

TEST(PagedKvCacheTest, ExhaustionAllocatesNothing) {
  auto kv = PagedKvCache::Create(SmallOptions());
  ASSERT_TRUE(kv.ok());
  const auto a = kv->AddSequence();
  const auto b = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 12).ok());
  const absl::Status status = kv->Reserve(b, 12);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->capacity(b), 0);
  EXPECT_EQ(kv->free_blocks(), 2);
  kv->Release(a);
  EXPECT_EQ(kv->free_blocks(), 5);
  EXPECT_TRUE(kv->Reserve(b, 12).ok());
}

TEST(PagedKvCacheTest, SlotsAreDistinctAndStable) {
  auto kv = PagedKvCache::Create(SmallOptions());
  ASSERT_TRUE(kv.ok());
  const auto a = kv->AddSequence();
  const auto b = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 6).ok());
  ASSERT_TRUE(kv->Reserve(b, 6).ok());
  // Write a distinct value into every key and value slot, then read them all back.
  std::set<float*> slots;
  float value = 1.0f;
  for (int layer = 0; layer < 2; ++layer) {
    for (auto seq : {a, b}) {
      for (int pos = 0; pos < 6; ++pos) {
        for (float* slot : {kv->key(layer, seq, pos), kv->value(layer, seq, pos)}) {
          EXPECT_TRUE(slots.insert(slot).second);
          for (int i = 0; i < 6; ++i) slot[i] = value++;
        }
      }
    }
  }
  value = 1.0f;
  for (int layer = 0; layer < 2; ++layer) {
    for (auto seq : {a, b}) {
      for (int pos = 0; pos < 6; ++pos) {
        for (float* slot : {kv->key(layer, seq, pos), kv->value(layer, seq, pos)}) {
          for (int i = 0; i < 6; ++i) EXPECT_EQ(slot[i], value++);
        }
        // block_data addresses the same slot through the block table.
        const int block = kv->block_table(seq)[pos / 4];
        EXPECT_EQ(kv->block_data(layer, block, 0) + (pos % 4) * 6, kv->key(layer, seq, pos));
        EXPECT_EQ(kv->block_data(layer, block, 1) + (pos % 4) * 6, kv->value(layer, seq, pos));
      }
    }
  }
}

TEST(PagedKvCacheTest, UnknownSequence) {
  auto kv = PagedKvCache::Create(SmallOptions());
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->Reserve(42, 1).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata
