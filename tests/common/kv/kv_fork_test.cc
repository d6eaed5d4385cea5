// PagedKvCache::Fork: the samples of one prompt share its full blocks and copy the partial one.
#include <algorithm>

#include "common/kv/paged_kv_cache.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

KvPoolOptions Options(bool prefix_caching, bool host_storage = true) {
  return KvPoolOptions{.cache = {.block_size = 4, .prefix_caching = prefix_caching},
                       .num_blocks = 8,
                       .num_layers = 2,
                       .num_kv_heads = 1,
                       .head_dim = 2,
                       .host_storage = host_storage};
}

// Writes a value for every position and layer of `seq` in [from, to): its key the position's
// number (offset by `tag`), its value the negative.
void Write(PagedKvCache& kv, PagedKvCache::SequenceId seq, int64_t from, int64_t to, float tag) {
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = from; p < to; ++p) {
      float* k = kv.key(layer, seq, p);
      float* v = kv.value(layer, seq, p);
      k[0] = k[1] = tag + p + 100 * layer;
      v[0] = v[1] = -(tag + p + 100 * layer);
    }
  }
}

class KvForkTest : public ::testing::TestWithParam<bool> {};

TEST_P(KvForkTest, SharesFullBlocksAndCopiesThePartialOne) {
  auto kv = PagedKvCache::Create(Options(/*prefix_caching=*/GetParam()));
  ASSERT_TRUE(kv.ok());
  const auto parent = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(parent, 6).ok());  // one full block and a partial one
  Write(*kv, parent, 0, 6, 0);
  ASSERT_EQ(kv->free_blocks(), 6);

  absl::StatusOr<PagedKvCache::SequenceId> child = kv->Fork(parent, 6);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(kv->free_blocks(), 5);  // only the partial block was copied
  EXPECT_EQ(kv->capacity(*child), 8);
  EXPECT_EQ(kv->block_table(*child)[0], kv->block_table(parent)[0]);
  EXPECT_NE(kv->block_table(*child)[1], kv->block_table(parent)[1]);
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = 0; p < 6; ++p) {
      EXPECT_EQ(kv->key(layer, *child, p)[1], p + 100 * layer) << p;
      EXPECT_EQ(kv->value(layer, *child, p)[0], -(p + 100 * layer)) << p;
    }
  }
  // Each writes after the fork without touching the other.
  Write(*kv, parent, 6, 8, 1000);
  Write(*kv, *child, 6, 8, 2000);
  EXPECT_EQ(kv->key(1, parent, 6)[0], 1106);
  EXPECT_EQ(kv->key(1, *child, 6)[0], 2106);
  EXPECT_EQ(kv->key(0, *child, 5)[0], 5);
  EXPECT_EQ(kv->blocks_in_use(), 3);

  // The shared block is freed with the last sequence holding it.
  kv->Release(parent);
  EXPECT_EQ(kv->free_blocks(), 6);  // the child still holds the shared block and its own
  EXPECT_EQ(kv->key(0, *child, 1)[0], 1);
  kv->Release(*child);
  EXPECT_EQ(kv->free_blocks(), 8);
}

TEST_P(KvForkTest, AtABlockBoundaryNothingIsCopied) {
  auto kv = PagedKvCache::Create(Options(GetParam()));
  ASSERT_TRUE(kv.ok());
  const auto parent = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(parent, 8).ok());
  std::vector<PagedKvCache::SequenceId> children;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<PagedKvCache::SequenceId> child = kv->Fork(parent, 8);
    ASSERT_TRUE(child.ok());
    children.push_back(*child);
  }
  EXPECT_EQ(kv->free_blocks(), 6);
  EXPECT_EQ(kv->blocks_in_use(), 2);
  // Growing past the prompt takes a block each.
  for (auto child : children) ASSERT_TRUE(kv->Reserve(child, 9).ok());
  EXPECT_EQ(kv->free_blocks(), 3);
  for (auto child : children) kv->Release(child);
  kv->Release(parent);
  EXPECT_EQ(kv->free_blocks(), 8);
}

TEST_P(KvForkTest, ShortOfBlocksChangesNothing) {
  auto kv = PagedKvCache::Create(Options(GetParam()));
  ASSERT_TRUE(kv.ok());
  const auto parent = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(parent, 30).ok());  // every block
  const int sequences = kv->num_sequences();
  absl::StatusOr<PagedKvCache::SequenceId> child = kv->Fork(parent, 30);
  EXPECT_EQ(child.status().code(), absl::StatusCode::kResourceExhausted) << child.status();
  EXPECT_EQ(kv->num_sequences(), sequences);
  EXPECT_EQ(kv->free_blocks(), 0);
  // A fork at a block boundary needs none.
  EXPECT_TRUE(kv->Fork(parent, 28).ok());
  EXPECT_FALSE(kv->Fork(parent, 33).ok());  // past what the parent holds
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, KvForkTest, ::testing::Bool());

// A device backend keeps the blocks: the copy is a move for it to run.
TEST(KvForkDeviceTest, TheCopyIsAMove) {
  auto kv = PagedKvCache::Create(Options(/*prefix_caching=*/true, /*host_storage=*/false));
  ASSERT_TRUE(kv.ok());
  const auto parent = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(parent, 5).ok());
  absl::StatusOr<PagedKvCache::SequenceId> child = kv->Fork(parent, 5);
  ASSERT_TRUE(child.ok());
  const std::vector<KvBlockMove> moves = kv->TakeMoves();
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].src, kv->block_table(parent)[1]);
  EXPECT_EQ(moves[0].dst, kv->block_table(*child)[1]);
  EXPECT_EQ(moves[0].dst_v, -1);
}

// With prefix caching the shared blocks stay registered once, and a later prompt finds them.
TEST(KvForkPrefixTest, SharedBlocksStayCachedOnce) {
  auto kv = PagedKvCache::Create(Options(/*prefix_caching=*/true));
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  const auto parent = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(parent, 6).ok());
  kv->CommitPrefix(parent, prompt, 6);
  absl::StatusOr<PagedKvCache::SequenceId> child = kv->Fork(parent, 6);
  ASSERT_TRUE(child.ok());
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), {7, 8});
  ASSERT_TRUE(kv->Reserve(*child, 8).ok());
  kv->CommitPrefix(*child, longer, 8);
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 2);  // the shared one, the child's second
  kv->Release(parent);
  kv->Release(*child);
  const auto later = kv->AddSequence();
  EXPECT_EQ(kv->MatchPrefix(later, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}), 8);
}

}  // namespace
}  // namespace strata
