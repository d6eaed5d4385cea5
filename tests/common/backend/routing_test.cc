#include "common/backend/routing.h"

#include <cmath>
#include <vector>

#include "common/backend/rope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

ModelConfig SigmoidGrouped(int experts, int groups, int top_groups, int top_k) {
  ModelConfig c;
  c.num_experts = experts;
  c.top_k = top_k;
  c.gate_scoring = GateScoring::kSigmoidGrouped;
  c.router_correction_bias = true;
  c.num_expert_groups = groups;
  c.top_k_groups = top_groups;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  return c;
}

struct Choice {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Choice Select(const ModelConfig& c, std::vector<float> logits, const std::vector<float>& bias,
              float temperature = 1.0f) {
  Choice out{std::vector<int32_t>(c.top_k), std::vector<float>(c.top_k)};
  SelectExperts(c, logits.data(), temperature, bias.empty() ? nullptr : bias.data(),
                out.experts.data(), out.weights.data());
  return out;
}

// The bias decides which experts run; their weights are the unbiased scores, normalized and
// scaled.
TEST(RoutingTest, CorrectionBiasChoosesButDoesNotWeigh) {
  const ModelConfig c = SigmoidGrouped(4, 1, 1, 2);
  const Choice got = Select(c, {2.0f, 1.0f, 0.0f, -1.0f}, {0.0f, 0.0f, 5.0f, 0.0f});
  ASSERT_THAT(got.experts, ElementsAre(2, 0));
  const float sum = Sigmoid(0.0f) + Sigmoid(2.0f);
  EXPECT_FLOAT_EQ(got.weights[0], Sigmoid(0.0f) / sum * 2.5f);
  EXPECT_FLOAT_EQ(got.weights[1], Sigmoid(2.0f) / sum * 2.5f);
}

// A group's merit is the sum of its two best scores: the single best expert's group loses to
// two groups of good pairs.
TEST(RoutingTest, GroupsRankedByTheirTwoBestScores) {
  const ModelConfig c = SigmoidGrouped(8, 4, 2, 3);
  const Choice got =
      Select(c, {5.0f, -5.0f, 1.0f, 1.2f, 0.5f, 0.6f, -3.0f, -3.0f}, std::vector<float>(8, 0.0f));
  EXPECT_THAT(got.experts, UnorderedElementsAre(3, 2, 5));
  float sum = 0.0f;
  for (float w : got.weights) sum += w;
  EXPECT_FLOAT_EQ(sum, 2.5f);
}

// Experts of dropped groups never run, even where a kept expert's biased score is negative.
TEST(RoutingTest, DroppedGroupsNeverWin) {
  const ModelConfig c = SigmoidGrouped(4, 2, 1, 2);
  const Choice got = Select(c, {0.0f, 0.0f, 0.0f, 0.0f}, {-1.0f, -1.0f, -1.2f, -1.2f});
  EXPECT_THAT(got.experts, UnorderedElementsAre(0, 1));
  EXPECT_FLOAT_EQ(got.weights[0], 1.25f);
}

TEST(RoutingTest, UnnormalizedAndTemperature) {
  ModelConfig c = SigmoidGrouped(4, 1, 1, 1);
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.0;
  const Choice got = Select(c, {0.0f, 3.0f, 1.0f, 0.0f}, {}, /*temperature=*/2.0f);
  ASSERT_THAT(got.experts, ElementsAre(1));
  EXPECT_FLOAT_EQ(got.weights[0], Sigmoid(1.5f));
}

TEST(RoutingTest, SoftmaxScoringsUnchanged) {
  ModelConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  c.norm_topk_prob = true;
  Choice got = Select(c, {1.0f, 3.0f, 3.0f, 0.0f}, {});
  EXPECT_THAT(got.experts, ElementsAre(1, 2));  // a tie goes to the lower id
  EXPECT_FLOAT_EQ(got.weights[0], 0.5f);
  c.gate_scoring = GateScoring::kTopKThenSoftmax;
  got = Select(c, {0.0f, std::log(3.0f), -95.0f, -1.0f}, {});
  EXPECT_THAT(got.experts, ElementsAre(1, 0));
  EXPECT_FLOAT_EQ(got.weights[0], 0.75f);
}

// Partial rotary: the first rotary_dim dimensions turn as a head of that width would; the
// rest pass through.
TEST(RopeTest, PartialRotaryLeavesTheTailAlone) {
  RopeConfig rope;
  rope.theta = 10000.0;
  const RopeTable partial = BuildRopeTable(rope, 4);
  ASSERT_EQ(partial.inv_freq.size(), 2u);
  EXPECT_FLOAT_EQ(partial.inv_freq[1], 1.0f / 100.0f);  // 10000^(-2/4)
  std::vector<float> head = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> front = {1, 2, 3, 4};
  ApplyRope(partial, 7, head.data(), 4);
  ApplyRope(partial, 7, front.data(), 4);
  EXPECT_THAT(std::vector<float>(head.begin(), head.begin() + 4),
              ElementsAre(front[0], front[1], front[2], front[3]));
  EXPECT_THAT(std::vector<float>(head.begin() + 4, head.end()), ElementsAre(5, 6, 7, 8));
  EXPECT_NE(head[0], 1.0f);
}

}  // namespace
}  // namespace strata
