// Prefix caching in PagedKvCache: sharing, registration, eviction order and accounting.
#include <numeric>
#include <vector>

#include "common/kv/paged_kv_cache.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kBlock = 4;

PagedKvCache MakeCache(int blocks) {
  auto kv =
      PagedKvCache::Create(KvPoolOptions{.cache = {.block_size = kBlock, .prefix_caching = true},
                                         .num_blocks = blocks,
                                         .num_layers = 1,
                                         .num_kv_heads = 1,
                                         .head_dim = 2});
  EXPECT_TRUE(kv.ok());
  return std::move(*kv);
}

std::vector<int32_t> Tokens(int n, int first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence that computed all of `tokens` and stays held.
PagedKvCache::SequenceId Computed(PagedKvCache& kv, const std::vector<int32_t>& tokens) {
  const auto seq = kv.AddSequence();
  EXPECT_TRUE(kv.Reserve(seq, std::ssize(tokens)).ok());
  kv.CommitPrefix(seq, tokens, std::ssize(tokens));
  return seq;
}

TEST(PrefixCacheTest, SharesFullBlocksAndLeavesTheLastTokenToCompute) {
  PagedKvCache kv = MakeCache(8);
  const std::vector<int32_t> prompt = Tokens(10);  // 2 full blocks, 2 tokens over
  const auto first = Computed(kv, prompt);
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 2);

  const auto second = kv.AddSequence();
  EXPECT_EQ(kv.HeldPrefixBlocks(prompt), 2);
  EXPECT_EQ(kv.MatchPrefix(second, prompt), 8);
  EXPECT_EQ(kv.block_table(second)[0], kv.block_table(first)[0]);
  EXPECT_EQ(kv.block_table(second)[1], kv.block_table(first)[1]);

  // A prompt of exactly 2 blocks matches only the first: its last token must be computed.
  const auto third = kv.AddSequence();
  EXPECT_EQ(kv.MatchPrefix(third, Tokens(8)), 4);
  EXPECT_EQ(kv.prefix_stats().queried_tokens, 18);
  EXPECT_EQ(kv.prefix_stats().hit_tokens, 12);
}

TEST(PrefixCacheTest, MatchesOnlyTheSamePrefix) {
  PagedKvCache kv = MakeCache(8);
  Computed(kv, Tokens(9));
  // Same second block, different first block: the chain breaks at block 0.
  std::vector<int32_t> other = Tokens(9);
  other[0] = 7;
  EXPECT_EQ(kv.MatchPrefix(kv.AddSequence(), other), 0);
  // Diverging in the second block keeps the first.
  std::vector<int32_t> diverging = Tokens(9);
  diverging[5] = 7;
  EXPECT_EQ(kv.MatchPrefix(kv.AddSequence(), diverging), 4);
}

TEST(PrefixCacheTest, UncomputedBlocksAreNotShared) {
  PagedKvCache kv = MakeCache(8);
  const std::vector<int32_t> prompt = Tokens(12);
  const auto seq = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(seq, 12).ok());
  kv.CommitPrefix(seq, prompt, 6);  // a prefill chunk of 6: one block computed
  EXPECT_EQ(kv.MatchPrefix(kv.AddSequence(), prompt), 4);
}

TEST(PrefixCacheTest, ReleasedBlocksStayCachedUntilThePoolNeedsThem) {
  PagedKvCache kv = MakeCache(4);
  const auto a = Computed(kv, Tokens(8, 100));  // blocks registered: A0 A1
  kv.Release(a);
  EXPECT_EQ(kv.free_blocks(), 4);  // cached but unheld blocks count as free
  const auto b = Computed(kv, Tokens(8, 200));  // takes the 2 unused blocks first
  kv.Release(b);
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 4);
  EXPECT_EQ(kv.prefix_stats().evictions, 0);

  // A's prompt hits again; taking its blocks makes B's the idle ones.
  const auto a_again = kv.AddSequence();
  EXPECT_EQ(kv.MatchPrefix(a_again, Tokens(9, 100)), 8);
  EXPECT_EQ(kv.free_blocks(), 2);
  kv.Release(a_again);

  // Two new blocks evict the least recently released: B's (released before A's second use).
  const auto c = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(c, 8).ok());
  EXPECT_EQ(kv.prefix_stats().evictions, 2);
  EXPECT_EQ(kv.MatchPrefix(kv.AddSequence(), Tokens(9, 200)), 0);
  EXPECT_EQ(kv.MatchPrefix(kv.AddSequence(), Tokens(9, 100)), 8);
}

TEST(PrefixCacheTest, SharedBlocksReturnOnlyWhenTheLastHolderLeaves) {
  PagedKvCache kv = MakeCache(4);
  const std::vector<int32_t> prompt = Tokens(9);
  const auto a = Computed(kv, prompt);  // 3 blocks: 2 registered, 1 partial
  const auto b = kv.AddSequence();
  ASSERT_EQ(kv.MatchPrefix(b, prompt), 8);
  ASSERT_TRUE(kv.Reserve(b, 9).ok());  // its own third block
  EXPECT_EQ(kv.free_blocks(), 0);
  kv.Release(a);
  EXPECT_EQ(kv.free_blocks(), 1);  // A's partial block; the shared two are still B's
  EXPECT_FALSE(kv.Reserve(kv.AddSequence(), 5).ok());
  kv.Release(b);
  EXPECT_EQ(kv.free_blocks(), 4);
}

TEST(PrefixCacheTest, DuplicateContentRegistersOnce) {
  PagedKvCache kv = MakeCache(8);
  const std::vector<int32_t> prompt = Tokens(8);
  const auto a = Computed(kv, prompt);
  const auto b = Computed(kv, prompt);  // computed again without matching
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 2);
  kv.Release(b);  // its duplicates go back to the unused blocks
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.MatchPrefix(kv.AddSequence(), Tokens(9)), 8);
  kv.Release(a);
}

TEST(PrefixCacheTest, OffMatchesNothing) {
  auto kv =
      PagedKvCache::Create(KvPoolOptions{.cache = {.block_size = kBlock, .prefix_caching = false},
                                         .num_blocks = 4,
                                         .num_layers = 1,
                                         .num_kv_heads = 1,
                                         .head_dim = 2});
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> prompt = Tokens(9);
  const auto a = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 9).ok());
  kv->CommitPrefix(a, prompt, 9);
  kv->Release(a);
  EXPECT_EQ(kv->MatchPrefix(kv->AddSequence(), prompt), 0);
  EXPECT_EQ(kv->free_blocks(), 4);
}

}  // namespace
}  // namespace strata
