// The worker's expert tiers over CPU slots: hot set by calibration counts, warm slots under a
// policy, misses copied from the store, never evicting what a request needs, prefetch hits,
// hot-ratio changes, and results equal to running every expert from the store.
#include "services/expert-worker/expert_tiers.h"

#include <random>

#include "common/backend/cpu/cpu_expert_slots.h"
#include "common/tensor/dtype.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kLayers = 2, kExperts = 8, kHidden = 16, kInter = 8, kTopK = 2;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.hidden_size = kHidden;
  c.num_layers = kLayers;
  c.num_experts = kExperts;
  c.top_k = kTopK;
  c.moe_intermediate_size = kInter;
  c.layer_is_moe.assign(kLayers, true);
  return c;
}

// Random bf16 experts in host memory: the "expert store".
class FakeStore : public ExpertWeightSource {
 public:
  FakeStore() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (int l = 0; l < kLayers; ++l) {
      for (int e = 0; e < kExperts; ++e) {
        auto& m = data_[l][e];
        for (auto* v : {&m.gate, &m.up, &m.down}) {
          v->resize(kHidden * kInter);
          for (auto& x : *v) x = FloatToBf16(normal(rng));
        }
        FfnWeights& w = weights_[l][e];
        w.gate = WeightMatrix{m.gate.data(), DType::kBF16, kInter, kHidden, kHidden, 1};
        w.up = WeightMatrix{m.up.data(), DType::kBF16, kInter, kHidden, kHidden, 1};
        w.down = WeightMatrix{m.down.data(), DType::kBF16, kHidden, kInter, kInter, 1};
      }
    }
  }
  const FfnWeights* Find(int layer, int expert) const override {
    if (layer < 0 || layer >= kLayers || expert < 0 || expert >= kExperts) return nullptr;
    return &weights_[layer][expert];
  }

 private:
  struct Matrices {
    std::vector<uint16_t> gate, up, down;
  };
  Matrices data_[kLayers][kExperts];
  FfnWeights weights_[kLayers][kExperts];
};

class ExpertTiersTest : public ::testing::Test {
 protected:
  void Make(int slots, WarmPolicy policy = WarmPolicy::kLru, int min_warm = 2) {
    Make(slots, {.policy = policy, .min_warm_slots = min_warm});
  }
  void Make(int slots, ExpertTierOptions options) {
    auto s = CpuExpertSlots::Create(config_, slots, DType::kBF16, false, pool_);
    ASSERT_TRUE(s.ok()) << s.status();
    slots_ = *std::move(s);
    auto t = ExpertTiers::Create(config_, *slots_, store_, options);
    ASSERT_TRUE(t.ok()) << t.status();
    tiers_ = *std::move(t);
  }
  // Every expert of both layers owned; expert e of layer l counted 100 - 10 * e + l.
  std::vector<OwnedExpert> Owned() {
    std::vector<OwnedExpert> owned;
    for (int l = 0; l < kLayers; ++l) {
      for (int e = 0; e < kExperts; ++e) owned.push_back({l, e, uint64_t(100 - 10 * e + l)});
    }
    return owned;
  }
  absl::Status Use(int layer, std::vector<int> experts) {
    std::vector<int64_t> tokens(experts.size(), 1);
    std::vector<int> cpu;
    return tiers_->Acquire(layer, experts, tokens, nullptr, &cpu);
  }

  ModelConfig config_ = TinyConfig();
  ThreadPool pool_{1};
  FakeStore store_;
  std::unique_ptr<CpuExpertSlots> slots_;
  std::unique_ptr<ExpertTiers> tiers_;
};

// A host tier the slots are handed and never use (CPU slots run every expert themselves).
class UnusedHostTier : public HostExpertTier {
 public:
  absl::Status Submit(int, int64_t, int, absl::Span<const float>, absl::Span<const int32_t>,
                      absl::Span<const float>) override {
    return absl::UnimplementedError("unused");
  }
  absl::Status Collect(Tensor&) override { return absl::UnimplementedError("unused"); }
  void Abandon() override {}
};

// A host tier's chooser sees a step's misses in order, the first flagged; what it picks stays
// cold (counted as CPU-tier experts), the rest are loaded. Without a host the chooser is not
// asked.
TEST_F(ExpertTiersTest, BeforeLayerSendsTheChoosersPicksToTheHostTier) {
  Make(/*slots=*/6);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.25f).ok());  // experts 0 and 1 hot in each layer
  std::vector<std::pair<int, bool>> asked;
  UnusedHostTier host_tier;
  tiers_->AttachHostTier(&host_tier, [&](int layer, int expert, int64_t tokens, bool first) {
    asked.push_back({expert, first});
    return expert == 3;
  });
  const std::vector<int> experts = {0, 2, 3};
  const std::vector<int64_t> tokens = {1, 1, 1};
  std::vector<int> host;
  ASSERT_TRUE(tiers_->BeforeLayer(0, experts, tokens, &host).ok());
  EXPECT_EQ(host, std::vector<int>{3});
  EXPECT_EQ(asked, (std::vector<std::pair<int, bool>>{{2, true}, {3, false}}));
  EXPECT_TRUE(tiers_->resident(0, 2));
  EXPECT_FALSE(tiers_->resident(0, 3));
  EXPECT_EQ(tiers_->counters().cpu_tier_experts, 1u);
  asked.clear();
  ASSERT_TRUE(tiers_->BeforeLayer(0, std::vector<int>{3}, std::vector<int64_t>{1}, nullptr).ok());
  EXPECT_TRUE(asked.empty());
  EXPECT_TRUE(tiers_->resident(0, 3));
  // Detached, the chooser goes with the tier: a miss is loaded.
  tiers_->AttachHostTier(nullptr, nullptr);
  ASSERT_TRUE(tiers_->BeforeLayer(1, std::vector<int>{3}, std::vector<int64_t>{1}, &host).ok());
  EXPECT_TRUE(host.empty());
  EXPECT_TRUE(asked.empty());
  EXPECT_TRUE(tiers_->resident(1, 3));
}

TEST_F(ExpertTiersTest, TooFewSlotsIsAClearError) {
  auto s = CpuExpertSlots::Create(config_, 1, DType::kBF16, false, pool_);
  ASSERT_TRUE(s.ok());
  auto t = ExpertTiers::Create(config_, **s, store_, {.min_warm_slots = 2});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("at least 2"), std::string::npos) << t.status();
}

TEST_F(ExpertTiersTest, HotSetFollowsCalibrationAndIsNeverEvicted) {
  Make(/*slots=*/6);
  // 16 owned, ratio 0.25 -> 4 hot: experts 0 and 1 of both layers (the highest counts).
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.25f).ok());
  EXPECT_EQ(tiers_->counters().hot_slots, 4u);
  EXPECT_EQ(tiers_->counters().warm_slots, 2u);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(tiers_->resident(l, 0) && tiers_->resident(l, 1));
  }
  // Cold experts churn through the two warm slots; the hot ones stay.
  for (int round = 0; round < 3; ++round) {
    for (int e = 2; e < kExperts; e += 2) ASSERT_TRUE(Use(round % 2, {e, e + 1, 0}).ok());
  }
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(tiers_->resident(l, 0) && tiers_->resident(l, 1));
  }
  const TierCounters& c = tiers_->counters();
  EXPECT_EQ(c.hot_hits, 9u);
  EXPECT_EQ(c.misses, 18u);
  EXPECT_GT(c.evictions, 0u);
  EXPECT_EQ(c.bytes_copied, (4 + 18) * slots_->slot_bytes());
}

TEST_F(ExpertTiersTest, WarmHitsAndNeverEvictingWhatTheRequestNeeds) {
  Make(/*slots=*/3, WarmPolicy::kLfu, /*min_warm=*/3);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  ASSERT_TRUE(Use(0, {1, 2, 3}).ok());  // fills every slot
  ASSERT_TRUE(Use(0, {1, 2}).ok());     // warm hits
  EXPECT_EQ(tiers_->counters().warm_hits, 2u);
  // 4 and 5 must evict two of {1, 2, 3} but not 1, which this request also needs.
  ASSERT_TRUE(Use(0, {1, 4, 5}).ok());
  EXPECT_TRUE(tiers_->resident(0, 1) && tiers_->resident(0, 4) && tiers_->resident(0, 5));
}

TEST_F(ExpertTiersTest, PrefetchedExpertsCountAsPrefetchHits) {
  Make(/*slots=*/4);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  ASSERT_TRUE(tiers_->Prefetch(1, std::vector<int32_t>{3, 6, -1, 99}).ok());
  EXPECT_EQ(tiers_->counters().prefetch_loads, 2u);  // bad ids are ignored
  ASSERT_TRUE(Use(1, {3, 5}).ok());
  const TierCounters& c = tiers_->counters();
  EXPECT_EQ(c.prefetch_hits, 1u);
  EXPECT_EQ(c.warm_hits, 1u);
  EXPECT_EQ(c.misses, 1u);
}

// Predictions for layers further ahead come before the nearer layers' requests: a later
// prediction never evicts an earlier one's experts that no request has used yet, and a
// request evicts them last. The predicted layer's request makes them ordinary warm experts.
TEST_F(ExpertTiersTest, PredictionsAheadSpareEachOther) {
  Make(/*slots=*/4);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  ASSERT_TRUE(tiers_->Prefetch(0, std::vector<int32_t>{5, 6}).ok());
  ASSERT_TRUE(tiers_->Prefetch(1, std::vector<int32_t>{5, 6, 7}).ok());  // room for two
  EXPECT_EQ(tiers_->counters().prefetch_loads, 4u);
  EXPECT_TRUE(tiers_->resident(0, 5) && tiers_->resident(0, 6));
  EXPECT_TRUE(tiers_->resident(1, 5) && tiers_->resident(1, 6));
  EXPECT_FALSE(tiers_->resident(1, 7));
  ASSERT_TRUE(Use(0, {5}).ok());  // layer 0's request: (0, 6) is no longer spared
  ASSERT_TRUE(Use(0, {2}).ok());  // evicts (0, 6), the least recent of the unspared
  EXPECT_FALSE(tiers_->resident(0, 6));
  ASSERT_TRUE(Use(0, {3, 4}).ok());  // evicts (0, 5) and (0, 2), not layer 1's predictions
  EXPECT_FALSE(tiers_->resident(0, 5) || tiers_->resident(0, 2));
  EXPECT_TRUE(tiers_->resident(1, 5) && tiers_->resident(1, 6));
  ASSERT_TRUE(Use(0, {1, 2, 3}).ok());  // nothing else left: a request evicts a prediction
  EXPECT_TRUE(tiers_->resident(0, 1) && tiers_->resident(0, 2) && tiers_->resident(0, 3));
  EXPECT_NE(tiers_->resident(1, 5), tiers_->resident(1, 6));
  EXPECT_EQ(tiers_->counters().prefetch_hits, 1u);
}

TEST_F(ExpertTiersTest, HotRatioChangesPinAndUnpin) {
  Make(/*slots=*/8);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  EXPECT_EQ(tiers_->counters().hot_slots, 0u);
  ASSERT_TRUE(tiers_->SetHotRatio(1.0f).ok());  // capped: 8 slots - 2 warm
  EXPECT_EQ(tiers_->counters().hot_slots, 6u);
  EXPECT_EQ(tiers_->counters().warm_slots, 2u);
  ASSERT_TRUE(tiers_->SetHotRatio(0.125f).ok());  // 2 hot
  EXPECT_EQ(tiers_->counters().hot_slots, 2u);
  EXPECT_TRUE(tiers_->resident(0, 0) && tiers_->resident(1, 0));
  EXPECT_FALSE(tiers_->SetHotRatio(1.5f).ok());
  // Formerly hot experts are warm now: evictable when others are needed. (0,2) is a hit; the
  // five misses fill the 2 free warm slots, then evict three formerly hot experts.
  for (int e = 2; e < kExperts; ++e) ASSERT_TRUE(Use(0, {e}).ok());
  EXPECT_TRUE(tiers_->resident(0, 0) && tiers_->resident(1, 0));
  EXPECT_EQ(tiers_->counters().evictions, 3u);
  EXPECT_FALSE(tiers_->resident(1, 1));
}

// Slots lent to the KV pool go (their experts evicted, a hot one loaded again below them, the
// slots' memory released), never past the hot set and the warm floor; taken back, they fill
// again on demand.
TEST_F(ExpertTiersTest, LentSlotsGoAndComeBack) {
  Make(/*slots=*/10, WarmPolicy::kLfu, /*min_warm=*/2);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.25f).ok());  // 4 hot: experts 0, 1 of both layers
  for (int e = 2; e < 8; ++e) ASSERT_TRUE(Use(e % 2, {e}).ok());  // the 6 warm slots full
  ASSERT_EQ(slots_->usable_slots(), 10);

  // Lower the ratio first, as the worker does: 2 hot; then lend 5.
  ASSERT_TRUE(tiers_->SetHotRatio(0.125f).ok());
  ASSERT_TRUE(tiers_->SetLentSlots(5).ok());
  EXPECT_EQ(tiers_->lent_slots(), 5);
  EXPECT_EQ(slots_->usable_slots(), 5);
  EXPECT_EQ(tiers_->counters().lent_slots, 5u);
  EXPECT_EQ(tiers_->counters().warm_slots, 3u);
  EXPECT_TRUE(tiers_->resident(0, 0) && tiers_->resident(1, 0));  // the hot set stays
  // No slot past the usable ones holds anything: a load there would fail.
  EXPECT_TRUE(absl::IsFailedPrecondition(slots_->Load(7, 0, 5, *store_.Find(0, 5))));

  // Never below the hot set and the warm floor: 10 - 2 hot - 2 warm.
  ASSERT_TRUE(tiers_->SetLentSlots(9).ok());
  EXPECT_EQ(tiers_->lent_slots(), 6);
  // Serving goes on in the 4 slots left.
  for (int e = 0; e < kExperts; e += 2) ASSERT_TRUE(Use(1, {e, e + 1}).ok());

  ASSERT_TRUE(tiers_->SetLentSlots(0).ok());
  EXPECT_EQ(slots_->usable_slots(), 10);
  EXPECT_EQ(tiers_->counters().lent_slots, 0u);
  ASSERT_TRUE(tiers_->SetHotRatio(0.25f).ok());
  EXPECT_EQ(tiers_->counters().warm_slots, 6u);
  for (int e = 2; e < 8; ++e) ASSERT_TRUE(Use(e % 2, {e}).ok());
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(tiers_->resident(l, 0) && tiers_->resident(l, 1));
  }
}

// A hot expert sitting in a slot that is lent is loaded again into a lower one.
TEST_F(ExpertTiersTest, AHotExpertInALentSlotMovesBelow) {
  Make(/*slots=*/6, WarmPolicy::kLru, /*min_warm=*/2);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  for (int e = 5; e >= 0; --e) ASSERT_TRUE(Use(1, {e}).ok());  // (1, 0) lands in slot 5
  ASSERT_TRUE(tiers_->SetHotRatio(0.0625f).ok());              // 1 hot: (1, 0), pinned there
  ASSERT_TRUE(tiers_->SetLentSlots(3).ok());
  EXPECT_EQ(slots_->usable_slots(), 3);
  EXPECT_TRUE(tiers_->resident(1, 0));
  EXPECT_FALSE(tiers_->resident(1, 1));  // slot 4: lent
}

// The CPU slots refuse what would corrupt them: a second slot for an expert (releasing one of
// them would drop the other from the index) and weights of another shape (they would overrun
// the slot), with the expert still found where it was loaded.
TEST_F(ExpertTiersTest, CpuSlotsRefuseADuplicateExpertAndAnotherShape) {
  auto s = CpuExpertSlots::Create(config_, 2, DType::kBF16, false, pool_);
  ASSERT_TRUE(s.ok()) << s.status();
  CpuExpertSlots& slots = **s;
  const FfnWeights& w = *store_.Find(0, 3);
  ASSERT_TRUE(slots.Load(0, 0, 3, w).ok());
  EXPECT_EQ(slots.Load(1, 0, 3, w).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(slots.Load(0, 0, 3, w).ok());  // the same slot again is a reload
  FfnWeights wide = w;
  wide.gate.in = kHidden * 2;
  EXPECT_EQ(slots.Load(1, 0, 4, wide).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slots.Load(1, 0, kExperts, w).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slots.Load(1, kLayers, 0, w).code(), absl::StatusCode::kInvalidArgument);
  slots.Release(1);  // held nothing: expert 3 stays in slot 0
  Tensor x = Tensor::Host(1, kHidden), out;
  for (int i = 0; i < kHidden; ++i) x.data()[i] = 0.1f * i;
  RoutingTable routing;
  routing.tokens = 1;
  routing.top_k = 1;
  routing.expert = {3};
  routing.weight = {1.0f};
  EXPECT_TRUE(slots.backend().RunExperts(0, x, routing, out).ok());
  routing.expert = {4};  // never loaded
  EXPECT_FALSE(slots.backend().RunExperts(0, x, routing, out).ok());
}

TEST_F(ExpertTiersTest, TieredResultsEqualEveryExpertResident) {
  Make(/*slots=*/3, WarmPolicy::kLfu);
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.2f).ok());
  CpuExpertBackend reference(config_, store_, pool_);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> pick(0, kExperts - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < 20; ++step) {
    const int layer = step % kLayers;
    Tensor x;
    x.Resize(1, kHidden);
    for (int64_t i = 0; i < kHidden; ++i) x.data()[i] = normal(rng);
    RoutingTable routing;
    routing.Resize(1, kTopK);
    routing.expert = {pick(rng), 0};
    routing.expert[1] = (routing.expert[0] + 1 + pick(rng) % (kExperts - 1)) % kExperts;
    routing.weight = {0.6f, 0.4f};
    ASSERT_TRUE(Use(layer, {routing.expert[0], routing.expert[1]}).ok());
    Tensor want, got;
    ASSERT_TRUE(reference.RunExperts(layer, x, routing, want).ok());
    ASSERT_TRUE(slots_->backend().RunExperts(layer, x, routing, got).ok());
    for (int64_t i = 0; i < kHidden; ++i) ASSERT_EQ(got.data()[i], want.data()[i]);
  }
  EXPECT_GT(tiers_->counters().misses, 0u);
}

// Replayed steps report their uses afterwards: each counts as a hit or a miss (read in place),
// misses go into free slots, and over a warm expert only when the policy ranks them higher.
TEST_F(ExpertTiersTest, ReplayedUsesCountAndPromoteMissesTheWarmPolicyRanksHigher) {
  Make(/*slots=*/4, {.policy = WarmPolicy::kLfu, .min_warm_slots = 2});
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  ASSERT_TRUE(tiers_->AfterReplays({{0, 1, 3}, {0, 2, 1}}).ok());
  EXPECT_EQ(tiers_->counters().misses, 4u);
  EXPECT_TRUE(tiers_->resident(0, 1) && tiers_->resident(0, 2));  // free slots
  ASSERT_TRUE(tiers_->AfterReplays({{0, 1, 1}, {0, 3, 5}, {0, 4, 5}}).ok());
  EXPECT_EQ(tiers_->counters().warm_hits, 1u);
  EXPECT_TRUE(tiers_->resident(0, 3) && tiers_->resident(0, 4));  // every slot taken now
  // Expert 5, used once, ties with the least used warm one (2, once): it stays cold.
  ASSERT_TRUE(tiers_->AfterReplays({{0, 5, 1}}).ok());
  EXPECT_FALSE(tiers_->resident(0, 5));
  EXPECT_TRUE(tiers_->resident(0, 2));
  // Used again it outranks expert 2, which goes.
  ASSERT_TRUE(tiers_->AfterReplays({{0, 5, 1}}).ok());
  EXPECT_TRUE(tiers_->resident(0, 5));
  EXPECT_FALSE(tiers_->resident(0, 2));
  const TierCounters& c = tiers_->counters();
  EXPECT_EQ(c.misses, 4u + 10u + 2u);
  EXPECT_EQ(c.evictions, 1u);
  EXPECT_EQ(c.bytes_copied, 5 * slots_->slot_bytes());
}

TEST_F(ExpertTiersTest, ReplayedMissesArePromotedAFewAtATime) {
  Make(/*slots=*/8, {.policy = WarmPolicy::kLfu,
                     .min_warm_slots = 2,
                     .max_promotions = 1,
                     .max_free_promotions = 2});
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.0f).ok());
  // Five misses, two free slots' worth of copies: the two used most.
  ASSERT_TRUE(tiers_->AfterReplays({{1, 0, 1}, {1, 1, 4}, {1, 2, 2}, {1, 3, 3}, {1, 4, 1}}).ok());
  EXPECT_TRUE(tiers_->resident(1, 1) && tiers_->resident(1, 3));
  EXPECT_FALSE(tiers_->resident(1, 0) || tiers_->resident(1, 2) || tiers_->resident(1, 4));
}

TEST_F(ExpertTiersTest, AWarmStartFillsTheFreeSlotsWithTheNextRanked) {
  Make(/*slots=*/6, {.policy = WarmPolicy::kLfu, .min_warm_slots = 2, .warm_start = true});
  // 16 owned, ratio 0.125: 2 hot (expert 0 of both layers), then the next 4 by calibration.
  ASSERT_TRUE(tiers_->SetOwned(Owned(), 0.125f).ok());
  EXPECT_EQ(tiers_->counters().hot_slots, 2u);
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < 3; ++e) EXPECT_TRUE(tiers_->resident(l, e)) << l << " " << e;
    EXPECT_FALSE(tiers_->resident(l, 3));
  }
  // The warm ones are evictable as usual.
  ASSERT_TRUE(Use(0, {6, 7}).ok());
  EXPECT_TRUE(tiers_->resident(0, 0) && tiers_->resident(1, 0));
  EXPECT_EQ(tiers_->counters().evictions, 2u);
}

TEST_F(ExpertTiersTest, WithoutCalibrationTheHotSetIsPickedAgainFromTheUses) {
  Make(/*slots=*/8, {.policy = WarmPolicy::kLfu, .min_warm_slots = 2});
  std::vector<OwnedExpert> owned = Owned();
  for (OwnedExpert& o : owned) o.count = 0;
  // 16 owned, ratio 0.25: 4 hot, in owned order before any use (layer 0's experts 0-3).
  ASSERT_TRUE(tiers_->SetOwned(owned, 0.25f).ok());
  EXPECT_TRUE(tiers_->resident(0, 0) && tiers_->resident(0, 3));
  // 64 uses (4 x owned) of layer 1's experts 4-7, then the next report picks them.
  ASSERT_TRUE(tiers_->AfterReplays({{1, 4, 16}, {1, 5, 16}, {1, 6, 16}, {1, 7, 16}}).ok());
  ASSERT_TRUE(tiers_->AfterReplays({{1, 4, 1}}).ok());
  const uint64_t hot_before = tiers_->counters().hot_hits;
  ASSERT_TRUE(tiers_->AfterReplays({{1, 5, 1}, {1, 6, 1}, {1, 7, 1}}).ok());
  EXPECT_EQ(tiers_->counters().hot_hits - hot_before, 3u);
}

}  // namespace
}  // namespace strata
