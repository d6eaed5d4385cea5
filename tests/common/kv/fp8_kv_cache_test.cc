// The FP8 side of PagedKvCache: calibration of the scales, wide (16-bit) sequences sharing the
// pool, and the conversion of a sequence that grows past fp16_above_tokens.
#include <cstring>
#include <vector>

#include "common/kv/paged_kv_cache.h"
#include "common/tensor/dtype.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kLayers = 2, kHeads = 2, kDim = 4, kBlock = 4;

KvPoolOptions Fp8Options(int blocks = 16) {
  KvPoolOptions o;
  o.cache.block_size = kBlock;
  o.cache.dtype = KvDtype::kFp8;
  o.cache.prefix_caching = false;
  o.num_blocks = blocks;
  o.num_layers = kLayers;
  o.num_kv_heads = kHeads;
  o.head_dim = kDim;
  o.element_bytes = 1;
  o.cache.fp16_above_tokens = 8;
  o.cache.calibration_tokens = 6;
  return o;
}

KvScales Scales(float k, float v) {
  KvScales s;
  s.k.assign(kLayers * kHeads, k);
  s.v.assign(kLayers * kHeads, v);
  return s;
}

TEST(KvDtypeTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseKvDtype("auto"), KvDtype::kAuto);
  EXPECT_EQ(*ParseKvDtype("BF16"), KvDtype::kBf16);
  EXPECT_EQ(*ParseKvDtype("fp8"), KvDtype::kFp8);
  EXPECT_EQ(*ParseKvDtype("fp8_e4m3"), KvDtype::kFp8);
  const auto bad = ParseKvDtype("int4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto, bf16, fp8"), std::string::npos);
  EXPECT_STREQ(KvDtypeName(KvDtype::kFp8), "fp8");
}

TEST(Fp8KvCacheTest, RejectsBadOptionsAndScales) {
  KvPoolOptions o = Fp8Options();
  o.cache.fp16_above_tokens = -1;
  EXPECT_FALSE(PagedKvCache::Create(o).ok());
  o = Fp8Options();
  o.cache.calibration_tokens = 0;
  EXPECT_FALSE(PagedKvCache::Create(o).ok());
  auto kv = PagedKvCache::Create(Fp8Options());
  ASSERT_TRUE(kv.ok());
  EXPECT_FALSE(kv->SetScales(KvScales{}).ok());
  EXPECT_FALSE(kv->SetScales(Scales(0.0f, 1.0f)).ok());
  EXPECT_FALSE(kv->SetScales(Scales(1.0f, -2.0f)).ok());
  EXPECT_FALSE(kv->scales_ready());
}

TEST(Fp8KvCacheTest, SequencesStayWideUntilCalibrated) {
  auto kv = PagedKvCache::Create(Fp8Options());
  ASSERT_TRUE(kv.ok());
  EXPECT_TRUE(kv->calibrating());
  EXPECT_TRUE(kv->WantsWide(1));
  // Even a caller asking for a narrow sequence gets a wide one: no scales to code with.
  const auto early = kv->AddSequence(false);
  EXPECT_TRUE(kv->wide(early));
  ASSERT_TRUE(kv->Reserve(early, 5).ok());
  EXPECT_EQ(kv->blocks_held(early), 4);  // 2 blocks of positions, keys and values apart
  EXPECT_EQ(kv->capacity(early), 8);

  std::vector<float> k_amax(kLayers * kHeads, 1.0f), v_amax(kLayers * kHeads, 2.0f);
  k_amax[3] = 8.96f;
  kv->ObserveKvRange(k_amax, v_amax, 4);
  EXPECT_TRUE(kv->calibrating());  // 4 of 6 tokens
  v_amax[0] = 0.0f;                // a smaller maximum later changes nothing
  kv->ObserveKvRange(k_amax, v_amax, 2);
  ASSERT_FALSE(kv->calibrating());
  EXPECT_EQ(kv->observed_tokens(), 6);
  EXPECT_FLOAT_EQ(kv->scales().k[0], 1.0f * kKvScaleHeadroom / kFp8E4M3MaxValue);
  EXPECT_FLOAT_EQ(kv->scales().k[3], 8.96f * kKvScaleHeadroom / kFp8E4M3MaxValue);
  EXPECT_FLOAT_EQ(kv->scales().v[0], 2.0f * kKvScaleHeadroom / kFp8E4M3MaxValue);

  EXPECT_FALSE(kv->WantsWide(8));
  EXPECT_TRUE(kv->WantsWide(9));  // past fp16_above_tokens
  const auto narrow = kv->AddSequence(kv->WantsWide(5));
  EXPECT_FALSE(kv->wide(narrow));
  ASSERT_TRUE(kv->Reserve(narrow, 5).ok());
  EXPECT_EQ(kv->blocks_held(narrow), 2);
  EXPECT_TRUE(kv->wide(early));  // sequences begun wide stay so
}

// Writes recognizable codes into a narrow sequence's slots, widens it, and reads them back
// as bf16 times the scales.
TEST(Fp8KvCacheTest, WidenConvertsCodesToBf16AndFreesTheOldBlocks) {
  auto kv = PagedKvCache::Create(Fp8Options(6));
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE(kv->SetScales(Scales(0.5f, 0.25f)).ok());
  const auto seq = kv->AddSequence();
  ASSERT_FALSE(kv->wide(seq));
  ASSERT_TRUE(kv->Reserve(seq, 8).ok());
  EXPECT_EQ(kv->free_blocks(), 4);
  std::vector<float> expect_k, expect_v;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int64_t pos = 0; pos < 8; ++pos) {
      const auto slot = kv->fp8_slot(layer, kv->block_table(seq), false, pos);
      for (int i = 0; i < kHeads * kDim; ++i) {
        const float k = 0.125f * static_cast<float>(layer * 100 + pos * 10 + i);
        slot.key[i] = FloatToFp8E4M3(k / 0.5f);
        slot.value[i] = FloatToFp8E4M3(-k / 0.25f);
        expect_k.push_back(Fp8E4M3ToFloat(slot.key[i]) * 0.5f);
        expect_v.push_back(Fp8E4M3ToFloat(slot.value[i]) * 0.25f);
      }
    }
  }
  EXPECT_FALSE(kv->NeedsWiden(seq, 8));
  ASSERT_TRUE(kv->NeedsWiden(seq, 9));
  ASSERT_TRUE(kv->Widen(seq).ok());
  EXPECT_TRUE(kv->wide(seq));
  EXPECT_FALSE(kv->NeedsWiden(seq, 9));
  EXPECT_EQ(kv->blocks_held(seq), 4);
  EXPECT_EQ(kv->capacity(seq), 8);
  EXPECT_EQ(kv->free_blocks(), 2);  // 6 - 4: the two FP8 blocks went back
  EXPECT_FALSE(kv->has_moves());    // host storage converts in place
  size_t at = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int64_t pos = 0; pos < 8; ++pos) {
      const auto slot = kv->fp8_slot(layer, kv->block_table(seq), true, pos);
      const uint16_t* k = reinterpret_cast<const uint16_t*>(slot.key);
      const uint16_t* v = reinterpret_cast<const uint16_t*>(slot.value);
      for (int i = 0; i < kHeads * kDim; ++i, ++at) {
        EXPECT_FLOAT_EQ(Bf16ToFloat(k[i]), Bf16ToFloat(FloatToBf16(expect_k[at])));
        EXPECT_FLOAT_EQ(Bf16ToFloat(v[i]), Bf16ToFloat(FloatToBf16(expect_v[at])));
      }
    }
  }
  // Growing on takes two blocks a block.
  ASSERT_TRUE(kv->Reserve(seq, 9).ok());
  EXPECT_EQ(kv->free_blocks(), 0);
  EXPECT_FALSE(kv->Reserve(seq, 13).ok());
  kv->Release(seq);
  EXPECT_EQ(kv->free_blocks(), 6);
}

TEST(Fp8KvCacheTest, WidenNeedsRoomAndChangesNothingWithout) {
  auto kv = PagedKvCache::Create(Fp8Options(3));
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE(kv->SetScales(Scales(1.0f, 1.0f)).ok());
  const auto seq = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(seq, 8).ok());
  const std::vector<int> before = kv->block_table(seq);
  const absl::Status widened = kv->Widen(seq);
  EXPECT_EQ(widened.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(kv->wide(seq));
  EXPECT_EQ(kv->block_table(seq), before);
  EXPECT_EQ(kv->free_blocks(), 1);
}

TEST(Fp8KvCacheTest, DeviceStorageHandsOutTheMoves) {
  KvPoolOptions o = Fp8Options(8);
  o.host_storage = false;
  auto kv = PagedKvCache::Create(o);
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE(kv->SetScales(Scales(1.0f, 1.0f)).ok());
  const auto seq = kv->AddSequence();
  ASSERT_TRUE(kv->Reserve(seq, 6).ok());
  const std::vector<int> old = kv->block_table(seq);
  ASSERT_TRUE(kv->Widen(seq).ok());
  ASSERT_TRUE(kv->has_moves());
  const std::vector<KvBlockMove> moves = kv->TakeMoves();
  EXPECT_FALSE(kv->has_moves());
  ASSERT_EQ(moves.size(), 2u);
  const std::vector<int>& table = kv->block_table(seq);
  ASSERT_EQ(table.size(), 4u);
  for (size_t i = 0; i < moves.size(); ++i) {
    EXPECT_EQ(moves[i].src, old[i]);
    EXPECT_EQ(moves[i].dst, table[2 * i]);
    EXPECT_EQ(moves[i].dst_v, table[2 * i + 1]);
    // A destination is never a block still to be read.
    for (int src : old) {
      EXPECT_NE(moves[i].dst, src);
      EXPECT_NE(moves[i].dst_v, src);
    }
  }
}

TEST(Fp8KvCacheTest, PrefixCachingKeepsWideAndNarrowBlocksApart) {
  KvPoolOptions o = Fp8Options(32);
  o.cache.prefix_caching = true;
  o.cache.fp16_above_tokens = 12;
  auto kv = PagedKvCache::Create(o);
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE(kv->SetScales(Scales(1.0f, 1.0f)).ok());
  std::vector<int32_t> long_prompt(14), short_prompt(9);
  for (int i = 0; i < 14; ++i) long_prompt[i] = 100 + i;
  for (int i = 0; i < 9; ++i) short_prompt[i] = 100 + i;

  // A wide sequence's three full blocks are registered as key and value blocks.
  const auto a = kv->AddSequence(kv->WantsWide(std::ssize(long_prompt)));
  ASSERT_TRUE(kv->wide(a));
  ASSERT_TRUE(kv->Reserve(a, 14).ok());
  kv->CommitPrefix(a, long_prompt, 14);
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 6);
  EXPECT_EQ(kv->HeldPrefixBlocks(long_prompt), 6);

  // Another wide one takes them; a narrow one with the same leading tokens does not.
  const auto b = kv->AddSequence(true);
  EXPECT_EQ(kv->MatchPrefix(b, long_prompt), 12);
  EXPECT_EQ(kv->blocks_held(b), 6);
  EXPECT_EQ(kv->capacity(b), 12);
  const auto c = kv->AddSequence(kv->WantsWide(std::ssize(short_prompt)));
  ASSERT_FALSE(kv->wide(c));
  EXPECT_EQ(kv->HeldPrefixBlocks(short_prompt), 0);
  EXPECT_EQ(kv->MatchPrefix(c, short_prompt), 0);

  // Released, the wide blocks stay cached for the next one.
  kv->Release(a);
  kv->Release(b);
  const auto d = kv->AddSequence(true);
  EXPECT_EQ(kv->MatchPrefix(d, long_prompt), 12);
}

}  // namespace
}  // namespace strata
