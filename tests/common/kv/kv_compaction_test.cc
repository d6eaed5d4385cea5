// PagedKvCache::Resize: shrinking moves the blocks in use below the new end (shared and
// cached ones kept so), keeps their data, and leaves nothing past the end; growing gives the
// blocks back.
#include <vector>

#include "common/kv/paged_kv_cache.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

KvPoolOptions Options(bool prefix_caching, bool host_storage = true) {
  KvPoolOptions o;
  o.cache.block_size = 2;
  o.num_blocks = 12;
  o.num_layers = 2;
  o.num_kv_heads = 1;
  o.head_dim = 2;
  o.cache.prefix_caching = prefix_caching;
  o.host_storage = host_storage;
  return o;
}

// Marks every slot of a sequence's keys with a value naming (layer, position).
void Mark(PagedKvCache& kv, PagedKvCache::SequenceId seq, int64_t tokens, float salt) {
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = 0; p < tokens; ++p) {
      kv.key(layer, seq, p)[0] = salt + layer * 100 + p;
      kv.value(layer, seq, p)[1] = -(salt + layer * 100 + p);
    }
  }
}

void ExpectMarked(PagedKvCache& kv, PagedKvCache::SequenceId seq, int64_t tokens, float salt) {
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t p = 0; p < tokens; ++p) {
      EXPECT_EQ(kv.key(layer, seq, p)[0], salt + layer * 100 + p) << layer << " " << p;
      EXPECT_EQ(kv.value(layer, seq, p)[1], -(salt + layer * 100 + p)) << layer << " " << p;
    }
  }
}

TEST(KvCompactionTest, ShrinkMovesLiveBlocksBelowTheEndAndKeepsTheirData) {
  auto kv = PagedKvCache::Create(Options(false));
  ASSERT_TRUE(kv.ok());
  // a: blocks 0-2, b: 3-6, c: 7-9; releasing a and c leaves b's blocks in the middle and
  // frees low and high blocks.
  const auto a = kv->AddSequence();
  const auto b = kv->AddSequence();
  const auto c = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 6).ok());
  ASSERT_TRUE(kv->Reserve(b, 8).ok());
  ASSERT_TRUE(kv->Reserve(c, 6).ok());
  Mark(*kv, b, 8, 1000);
  kv->Release(a);
  const auto d = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(d, 2).ok());  // a low block
  Mark(*kv, d, 2, 5000);
  kv->Release(c);
  EXPECT_EQ(kv->blocks_in_use(), 5);

  auto moved = kv->Resize(5);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(kv->active_blocks(), 5);
  EXPECT_EQ(kv->pool_tokens(), 10);
  EXPECT_EQ(kv->free_blocks(), 0);
  for (auto seq : {b, d}) {
    for (int block : kv->block_table(seq)) EXPECT_LT(block, 5);
  }
  EXPECT_GT(*moved, 0);
  ExpectMarked(*kv, b, 8, 1000);
  ExpectMarked(*kv, d, 2, 5000);
  EXPECT_FALSE(kv->has_moves());  // host storage moved in place

  // Too small for what is in use: refused, nothing changed.
  const std::vector<int> table = kv->block_table(b);
  EXPECT_EQ(kv->Resize(4).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv->block_table(b), table);
  EXPECT_FALSE(kv->Resize(0).ok());
  EXPECT_FALSE(kv->Resize(13).ok());

  // Growing gives the blocks back.
  ASSERT_TRUE(kv->Resize(12).ok());
  EXPECT_EQ(kv->free_blocks(), 7);
  const auto e = kv->AddSequence();
  EXPECT_TRUE(kv->Reserve(e, 14).ok());
  ExpectMarked(*kv, b, 8, 1000);
}

// A pool that starts below its largest (initial_blocks): host storage holds the active blocks
// only, growing keeps what they hold, and the blocks past the start come free as it grows.
TEST(KvCompactionTest, APoolStartingSmallGrowsIntoItsRoom) {
  KvPoolOptions o = Options(false);
  o.initial_blocks = 4;
  auto kv = PagedKvCache::Create(o);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->active_blocks(), 4);
  EXPECT_EQ(kv->free_blocks(), 4);
  const auto a = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 8).ok());
  Mark(*kv, a, 8, 300);
  const auto b = kv->AddSequence();
  EXPECT_FALSE(kv->Reserve(b, 2).ok());  // the 4 blocks are a's
  ASSERT_TRUE(kv->Resize(12).ok());
  ASSERT_TRUE(kv->Reserve(b, 16).ok());
  Mark(*kv, b, 16, 700);
  ExpectMarked(*kv, a, 8, 300);
  kv->Release(a);
  ASSERT_TRUE(kv->Resize(8).ok());  // b's blocks move below 8
  ExpectMarked(*kv, b, 16, 700);
  o.initial_blocks = 13;
  EXPECT_FALSE(PagedKvCache::Create(o).ok());
}

TEST(KvCompactionTest, SharedAndCachedBlocksStaySharedAndFindable) {
  auto kv = PagedKvCache::Create(Options(true));
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> filler = {9, 9, 9, 9, 9, 9, 9, 9, 9};
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  const auto pad = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(pad, 16).ok());  // blocks 0-7: the prompt's blocks come after
  const auto a = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 7).ok());
  Mark(*kv, a, 7, 300);
  kv->CommitPrefix(a, prompt, 7);  // three full blocks registered
  const auto b = kv->AddSequence();
  EXPECT_EQ(kv->MatchPrefix(b, prompt), 6);  // shares them
  kv->Release(pad);

  ASSERT_TRUE(kv->Resize(5).ok());
  // Shared blocks moved once: both tables name the same new blocks.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(kv->block_table(a)[i], kv->block_table(b)[i]);
    EXPECT_LT(kv->block_table(a)[i], 5);
  }
  ExpectMarked(*kv, a, 7, 300);
  // Still found under their hashes at the new places.
  kv->Release(a);
  kv->Release(b);
  const auto c = kv->AddSequence();
  EXPECT_EQ(kv->MatchPrefix(c, prompt), 6);
  ExpectMarked(*kv, c, 6, 300);
  EXPECT_EQ(kv->HeldPrefixBlocks(filler), 0);
  EXPECT_EQ(kv->HeldPrefixBlocks(prompt), 3);  // c holds the moved blocks
}

TEST(KvCompactionTest, DeviceStorageHandsOutCopies) {
  auto kv = PagedKvCache::Create(Options(false, /*host_storage=*/false));
  ASSERT_TRUE(kv.ok());
  const auto a = kv->AddSequence();
  const auto b = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(a, 8).ok());  // blocks 0-3
  ASSERT_TRUE(kv->Reserve(b, 4).ok());  // blocks 4-5
  const std::vector<int> before = kv->block_table(b);
  kv->Release(a);
  auto moved = kv->Resize(3);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(*moved, 2);
  const std::vector<KvBlockMove> moves = kv->TakeMoves();
  ASSERT_EQ(moves.size(), 2u);
  for (size_t i = 0; i < moves.size(); ++i) {
    EXPECT_EQ(moves[i].src, before[i]);
    EXPECT_EQ(moves[i].dst, kv->block_table(b)[i]);
    EXPECT_LT(moves[i].dst, 3);
    EXPECT_EQ(moves[i].dst_v, -1);  // a copy
  }
}

}  // namespace
}  // namespace strata
