// Contiguous and greedy placement, Gini and expected imbalance on synthetic count tables.
#include "common/placement/placement_plan.h"

#include <cmath>
#include <set>

#include "common/placement/placement_stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// counts[e] ~ scale / (rank + 1)^s, the popular experts spread over ids by a per-layer
// rotation so that layers differ.
ExpertCounts Zipf(int layers, int experts, double s, double scale = 1e6) {
  ExpertCounts counts(layers, std::vector<int64_t>(experts));
  for (int l = 0; l < layers; ++l) {
    for (int rank = 0; rank < experts; ++rank) {
      counts[l][(rank + 5 * l) % experts] = std::llround(scale / std::pow(rank + 1, s));
    }
  }
  return counts;
}

TEST(PlacementPlanTest, ContiguousMatchesTheRoutersSplit) {
  const PlacementPlan plan = PlacementPlan::Contiguous(2, 6, 4);
  EXPECT_EQ(plan.num_workers, 4);
  EXPECT_THAT(plan.owner[0], ElementsAre(0, 0, 1, 2, 2, 3));
  EXPECT_EQ(plan.owner[1], plan.owner[0]);
  EXPECT_THAT(plan.OwnedBy(0, 2), ElementsAre(3, 4));
  EXPECT_TRUE(plan.Validate(2, 6, 4).ok());
}

TEST(PlacementPlanTest, GreedyFollowsLongestProcessingTime) {
  // By count: e1 (10) -> w0; e3 (7) -> w1; e0 (5) -> w1, lighter (7 < 10); e2 (5) -> w0
  // (10 < 12); e4 (1) -> w1 (12 < 15).
  const ExpertCounts counts = {{5, 10, 5, 7, 1}};
  auto plan = PlacementPlan::Greedy(counts, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->owner[0], ElementsAre(1, 0, 0, 1, 1));
  auto report = ExpectedImbalance(counts, *plan);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(WorkerLoads(counts[0], *plan, 0), ElementsAre(15, 13));
  EXPECT_NEAR(report->per_layer[0], (15 - 14.0) / 14.0, 1e-12);
}

TEST(PlacementPlanTest, GreedyKeepsTheContiguousSplitWhenThatIsBetter) {
  // Greedy gives {3, 2, 2} and {3, 2}, 7 : 5; the contiguous split is 6 : 6.
  const ExpertCounts counts = {{2, 2, 2, 3, 3}, {2, 2, 3, 3, 2}};
  auto plan = PlacementPlan::Greedy(counts, 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->owner[0], ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THAT(plan->owner[1], ElementsAre(0, 1, 0, 1, 0));  // 7 : 5 both ways, greedy kept
}

TEST(PlacementPlanTest, GreedyBalancesZipfFarBetterThanContiguous) {
  const ExpertCounts counts = Zipf(/*layers=*/6, /*experts=*/64, /*s=*/1.0);
  auto plan = PlacementPlan::Greedy(counts, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto planned = ExpectedImbalance(counts, *plan);
  auto contiguous = ExpectedImbalance(counts, PlacementPlan::Contiguous(6, 64, 4));
  ASSERT_TRUE(planned.ok() && contiguous.ok());
  EXPECT_EQ(planned->layers.size(), 6u);
  EXPECT_LT(planned->max, 0.05);
  EXPECT_GT(contiguous->mean, 0.5);
  EXPECT_LE(planned->mean, planned->max + 1e-12);  // equal here: the layers are rotations

  // Every expert owned by exactly one valid worker; every worker owns some.
  ASSERT_TRUE(plan->Validate(6, 64, 4).ok());
  for (int l = 0; l < 6; ++l) {
    std::set<int> seen;
    for (int w = 0; w < 4; ++w) {
      const std::vector<int> owned = plan->OwnedBy(l, w);
      EXPECT_FALSE(owned.empty()) << "layer " << l << " worker " << w;
      for (int e : owned) EXPECT_TRUE(seen.insert(e).second);
    }
    EXPECT_EQ(seen.size(), 64u);
  }
  // Deterministic.
  auto again = PlacementPlan::Greedy(counts, 4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->owner, plan->owner);
}

TEST(PlacementPlanTest, GreedySpreadsUnusedExpertsAndKeepsSilentLayersContiguous) {
  // One hot expert and seven never used: the hot one alone on worker 0, the unused ones
  // spread over the others rather than piled on worker 1.
  ExpertCounts counts = {{0, 0, 100, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}};
  auto plan = PlacementPlan::Greedy(counts, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->OwnedBy(0, 0), ElementsAre(2));
  EXPECT_THAT(plan->OwnedBy(0, 1), ElementsAre(0, 4, 7));
  EXPECT_THAT(plan->OwnedBy(0, 2), ElementsAre(1, 5));
  EXPECT_THAT(plan->OwnedBy(0, 3), ElementsAre(3, 6));
  EXPECT_EQ(plan->owner[1], PlacementPlan::Contiguous(2, 8, 4).owner[1]);
  auto report = ExpectedImbalance(counts, *plan);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->layers, ElementsAre(0));  // the silent layer is not averaged in
  EXPECT_DOUBLE_EQ(report->per_layer[0], 3.0);  // one worker carries 4x the mean
}

TEST(PlacementPlanTest, GreedyRejectsBadInput) {
  const ExpertCounts counts = Zipf(2, 8, 1.0);
  EXPECT_THAT(PlacementPlan::Greedy(counts, 0).status().message(), HasSubstr("between 1 and"));
  EXPECT_THAT(PlacementPlan::Greedy(counts, 9).status().message(), HasSubstr("not 9"));
  EXPECT_FALSE(PlacementPlan::Greedy({}, 2).ok());
  EXPECT_THAT(PlacementPlan::Greedy({{1, 2}, {3}}, 1).status().message(),
              HasSubstr("layer 1 has 1 experts"));
  EXPECT_THAT(PlacementPlan::Greedy({{1, -2}}, 1).status().message(), HasSubstr("negative"));
  EXPECT_TRUE(PlacementPlan::Greedy(counts, 8).ok());
}

TEST(PlacementPlanTest, ValidateNamesTheMismatch) {
  const PlacementPlan plan = PlacementPlan::Contiguous(8, 16, 2);
  EXPECT_THAT(plan.Validate(48, 128, 2).message(),
              HasSubstr("8 layers x 16 experts; this model has 48 x 128"));
  EXPECT_THAT(plan.Validate(8, 16, 4).message(), HasSubstr("for 2 workers; this cluster has 4"));
  PlacementPlan bad = plan;
  bad.owner[3][7] = 2;
  EXPECT_THAT(bad.Validate().message(), HasSubstr("layer 3 expert 7 goes to worker 2"));
}

TEST(PlacementPlanTest, ImbalanceRejectsAPlanOfAnotherShape) {
  EXPECT_FALSE(ExpectedImbalance(Zipf(2, 8, 1.0), PlacementPlan::Contiguous(2, 16, 2)).ok());
}

TEST(PlacementStatsTest, GiniOfKnownVectors) {
  EXPECT_DOUBLE_EQ(Gini(std::vector<int64_t>{5, 5, 5, 5}), 0.0);
  EXPECT_NEAR(Gini(std::vector<int64_t>{0, 0, 0, 8}), 0.75, 1e-12);  // (n - 1) / n
  EXPECT_NEAR(Gini(std::vector<int64_t>{1, 2, 3, 4}), 0.25, 1e-12);
  EXPECT_NEAR(Gini(std::vector<int64_t>{3, 1, 2}), 2.0 / 9.0, 1e-12);  // order does not matter
  EXPECT_DOUBLE_EQ(Gini(std::vector<int64_t>{}), 0.0);
  EXPECT_DOUBLE_EQ(Gini(std::vector<int64_t>{0, 0}), 0.0);
}

TEST(PlacementStatsTest, GiniByLayerSkipsDenseLayers) {
  const ExpertCounts counts = {{0, 0, 0, 0}, {1, 2, 3, 4}, {0, 0, 0, 8}};
  const GiniReport report = GiniByLayer(counts);
  EXPECT_THAT(report.layers, ElementsAre(1, 2));
  ASSERT_EQ(report.per_layer.size(), 2u);
  EXPECT_NEAR(report.per_layer[0], 0.25, 1e-12);
  EXPECT_NEAR(report.per_layer[1], 0.75, 1e-12);
  EXPECT_NEAR(report.overall, Gini(std::vector<int64_t>{1, 2, 3, 4, 0, 0, 0, 8}), 1e-12);
}

}  // namespace
}  // namespace strata
