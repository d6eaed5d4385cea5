// Warm-slot replacement policies: victim order, aging, and hit rates on Zipf traces.
#include "common/placement/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr ExpertKey kA{0, 1}, kB{0, 2}, kC{1, 1}, kD{1, 2}, kE{2, 0};

// A worker's way of using a policy: touch, and on a miss evict if full and admit.
void Use(ExpertCachePolicy& policy, ExpertKey key) {
  SimulateHitRate(policy, std::vector<ExpertKey>{key});
}

TEST(LruPolicyTest, EvictsTheLeastRecentlyUsed) {
  LruPolicy lru(3);
  EXPECT_EQ(lru.capacity(), 3);
  EXPECT_EQ(lru.Victim(), std::nullopt);
  for (ExpertKey k : {kA, kB, kC}) Use(lru, k);
  EXPECT_EQ(lru.size(), 3);
  EXPECT_EQ(lru.Victim(), kA);
  lru.Touch(kA);
  EXPECT_EQ(lru.Victim(), kB);
  EXPECT_EQ(lru.Admit(kD).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(lru.Admit(kA).ok());  // already resident: no-op
  EXPECT_TRUE(lru.Erase(kB));
  EXPECT_FALSE(lru.Erase(kB));
  EXPECT_FALSE(lru.Contains(kB));
  ASSERT_TRUE(lru.Admit(kD).ok());
  EXPECT_EQ(lru.Victim(), kC);
  Use(lru, kE);  // evicts C
  EXPECT_FALSE(lru.Contains(kC));
  EXPECT_TRUE(lru.Contains(kA) && lru.Contains(kD) && lru.Contains(kE));
  EXPECT_EQ(lru.Victim(), kA);
}

TEST(CachePolicyTest, VictimSkipsWhatTheCallerProtects) {
  LruPolicy lru(3);
  LfuAgingPolicy lfu(3, 0);
  for (ExpertCachePolicy* policy : {static_cast<ExpertCachePolicy*>(&lru),
                                    static_cast<ExpertCachePolicy*>(&lfu)}) {
    for (ExpertKey k : {kA, kB, kC}) Use(*policy, k);
    EXPECT_EQ(policy->Victim(), kA);
    EXPECT_EQ(policy->Victim([](ExpertKey k) { return !(k == kA); }), kB);
    EXPECT_EQ(policy->Victim([](ExpertKey k) { return k == kC; }), kC);
    EXPECT_EQ(policy->Victim([](ExpertKey) { return false; }), std::nullopt);
  }
}

TEST(LfuAgingPolicyTest, EvictsTheLeastFrequentlyUsedTiesByRecency) {
  LfuAgingPolicy lfu(3, /*halve_every=*/0);
  for (ExpertKey k : {kA, kA, kA, kB, kC, kC}) Use(lfu, k);
  EXPECT_EQ(lfu.count(kA), 3);
  EXPECT_EQ(lfu.Victim(), kB);
  lfu.Touch(kB);
  lfu.Touch(kB);  // B: 3, C: 2
  EXPECT_EQ(lfu.Victim(), kC);
  lfu.Touch(kC);  // all 3: A was used longest ago
  EXPECT_EQ(lfu.Victim(), kA);
  // A non-resident expert's uses count before it is admitted.
  for (int i = 0; i < 5; ++i) lfu.Touch(kD);
  EXPECT_EQ(lfu.count(kD), 5);
  ASSERT_TRUE(lfu.Erase(*lfu.Victim()));
  ASSERT_TRUE(lfu.Admit(kD).ok());
  EXPECT_EQ(lfu.Victim(), kB);
  EXPECT_EQ(lfu.Admit(kE).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LfuAgingPolicyTest, HalvesCountsEveryNTouches) {
  LfuAgingPolicy lfu(2, /*halve_every=*/4);
  for (int i = 0; i < 3; ++i) Use(lfu, kA);
  EXPECT_EQ(lfu.count(kA), 3);
  Use(lfu, kB);  // the 4th touch ages first: A 3 -> 1, then B 1
  EXPECT_EQ(lfu.count(kA), 1);
  EXPECT_EQ(lfu.count(kB), 1);
  EXPECT_EQ(lfu.Victim(), kA);  // a tie now, and A is older
}

TEST(CachePolicyTest, ZeroCapacityMissesEverything) {
  LruPolicy lru(0);
  const CacheSimResult r = SimulateHitRate(lru, std::vector<ExpertKey>{kA, kA, kA});
  EXPECT_EQ(r.hits, 0);
  EXPECT_EQ(r.misses, 3);
  EXPECT_EQ(lru.size(), 0);
}

// `n` accesses over layers x experts keys, Zipf(s) popularity in the order of `ranking`.
std::vector<ExpertKey> ZipfTrace(const std::vector<ExpertKey>& ranking, double s, int n,
                                 std::mt19937& rng) {
  std::vector<double> cdf(ranking.size());
  double sum = 0;
  for (size_t r = 0; r < ranking.size(); ++r) cdf[r] = sum += 1.0 / std::pow(r + 1.0, s);
  std::vector<ExpertKey> trace;
  for (int i = 0; i < n; ++i) {
    const double u = static_cast<double>(rng()) / 4294967296.0 * sum;  // mt19937: 32 bits
    const size_t r = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
    trace.push_back(ranking[std::min(r, ranking.size() - 1)]);
  }
  return trace;
}

std::vector<ExpertKey> Shuffled(std::mt19937& rng) {
  std::vector<ExpertKey> keys;
  for (int l = 0; l < 8; ++l) {
    for (int e = 0; e < 16; ++e) keys.push_back({l, e});
  }
  for (size_t i = keys.size() - 1; i > 0; --i) std::swap(keys[i], keys[rng() % (i + 1)]);
  return keys;
}

TEST(CachePolicyTest, LfuBeatsLruOnAStationaryZipfTrace) {
  std::mt19937 rng(7);
  const std::vector<ExpertKey> trace = ZipfTrace(Shuffled(rng), 1.0, 20000, rng);
  LruPolicy lru(32);
  LfuAgingPolicy lfu(32, /*halve_every=*/4096);
  const double lru_rate = SimulateHitRate(lru, trace).hit_rate();
  const double lfu_rate = SimulateHitRate(lfu, trace).hit_rate();
  std::printf("stationary Zipf(1.0), 128 experts, 32 slots: LRU %.3f, LFU %.3f\n", lru_rate,
              lfu_rate);
  EXPECT_GE(lfu_rate, lru_rate + 0.03);
}

TEST(CachePolicyTest, LruAdaptsFasterWhenThePopularExpertsChange) {
  std::mt19937 rng(11);
  const std::vector<ExpertKey> before = ZipfTrace(Shuffled(rng), 1.0, 20000, rng);
  const std::vector<ExpertKey> after = ZipfTrace(Shuffled(rng), 1.0, 20000, rng);
  const std::vector<ExpertKey> right_after(after.begin(), after.begin() + 1000);
  const std::vector<ExpertKey> later(after.begin() + 1000, after.end());
  LruPolicy lru(32);
  LfuAgingPolicy aging(32, /*halve_every=*/4096);
  LfuAgingPolicy no_aging(32, /*halve_every=*/0);
  double first[3], rest[3];
  ExpertCachePolicy* policies[3] = {&lru, &aging, &no_aging};
  for (int p = 0; p < 3; ++p) {
    SimulateHitRate(*policies[p], before);
    first[p] = SimulateHitRate(*policies[p], right_after).hit_rate();
    rest[p] = SimulateHitRate(*policies[p], later).hit_rate();
  }
  std::printf(
      "after the shift, first 1000 / next 19000: LRU %.3f / %.3f, LFU aging %.3f / %.3f, "
      "LFU without aging %.3f / %.3f\n",
      first[0], rest[0], first[1], rest[1], first[2], rest[2]);
  EXPECT_GT(first[0], first[1] + 0.05);  // LRU recovers within a few dozen accesses
  EXPECT_GT(rest[1], rest[2] + 0.05);    // aging lets LFU forget the old hot set
}

}  // namespace
}  // namespace strata
