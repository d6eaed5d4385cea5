// Each logit transform on hand-made logits, with the values vLLM's definitions give, and the
// Sampler applying them (greedy too: a penalty or bias moves the argmax).
#include "common/engine/logits_transforms.h"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "common/engine/sampler.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(LogitsTransformsTest, LogitBiasAddsByTokenId) {
  std::vector<float> x = {1.0f, 2.0f, -3.0f, 0.5f};
  ApplyLogitBias(x.data(), 4, {{0, 100.0f}, {2, -1.5f}, {7, 5.0f}});  // 7: outside, skipped
  EXPECT_EQ(x, (std::vector<float>{101.0f, 2.0f, -4.5f, 0.5f}));
}

TEST(LogitsTransformsTest, SuppressedTokensCannotWin) {
  std::vector<float> x = {1.0f, 2.0f, -3.0f};
  SuppressTokens(x.data(), 3, {1, 9});
  EXPECT_EQ(x, (std::vector<float>{1.0f, -kInf, -3.0f}));
}

TEST(LogitsTransformsTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  TokenCounts counts;
  counts.AddPrompt({0, 2});
  counts.AddOutput(3);
  counts.AddOutput(3);
  std::vector<float> x = {4.0f, 4.0f, -1.0f, 3.0f, 0.0f};
  ApplyRepetitionPenalty(x.data(), 5, counts.seen(), 2.0f);
  // Seen: 0 and 2 (prompt), 3 (output, once however often).
  EXPECT_EQ(x, (std::vector<float>{2.0f, 4.0f, -2.0f, 1.5f, 0.0f}));
  std::vector<float> y = {4.0f, -1.0f};
  TokenCounts both;
  both.AddPrompt({0, 1});
  ApplyRepetitionPenalty(y.data(), 2, both.seen(), 0.5f);  // below 1: encourages repeats
  EXPECT_EQ(y, (std::vector<float>{8.0f, -0.5f}));
}

TEST(LogitsTransformsTest, FrequencyAndPresenceCountTheOutputOnly) {
  TokenCounts counts;
  counts.AddPrompt({0});  // the prompt does not count
  counts.AddOutput(1);
  counts.AddOutput(2);
  counts.AddOutput(2);
  counts.AddOutput(2);
  std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
  ApplyFrequencyPresencePenalties(x.data(), 4, counts.output(), 0.5f, 0.25f);
  // 1: once (0.5 + 0.25); 2: three times (1.5 + 0.25).
  EXPECT_EQ(x, (std::vector<float>{1.0f, 0.25f, -0.75f, 1.0f}));
  EXPECT_EQ(counts.output().at(2), 3);
}

TEST(SamplerTransformsTest, GreedyWithLogitBiasPicksTheBiasedToken) {
  const std::vector<float> logits = {5.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.logit_bias = {{2, 10.0f}};
  Sampler sampler(p);
  EXPECT_FALSE(sampler.greedy());  // the device's argmax of the raw logits would be wrong
  EXPECT_EQ(sampler.Sample(logits.data(), 3), 2);
  Sampler plain{SamplingParams{}};
  EXPECT_TRUE(plain.greedy());
  EXPECT_EQ(plain.Sample(logits.data(), 3), 0);
}

TEST(SamplerTransformsTest, GreedyRepetitionPenaltyMovesTheArgmax) {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;  // 3 / 2 = 1.5 < 2
  const std::vector<int32_t> prompt = {0};
  Sampler sampler(p, prompt);
  EXPECT_EQ(sampler.Sample(logits.data(), 3), 1);
  sampler.Accept(1);  // now 1 is seen too: 1.5, 1, 1
  EXPECT_EQ(sampler.Sample(logits.data(), 3), 0);
  p.repetition_penalty = 1.0f;
  Sampler off(p, prompt);
  EXPECT_TRUE(off.greedy());
  EXPECT_EQ(off.Sample(logits.data(), 3), 0);
}

TEST(SamplerTransformsTest, FrequencyPenaltyGrowsWithEachRepeat) {
  const std::vector<float> logits = {3.0f, 2.0f};
  SamplingParams p;
  p.frequency_penalty = 0.6f;
  Sampler sampler(p);
  EXPECT_EQ(sampler.Sample(logits.data(), 2), 0);  // 3 vs 2
  sampler.Accept(0);
  EXPECT_EQ(sampler.Sample(logits.data(), 2), 0);  // 2.4 vs 2
  sampler.Accept(0);
  EXPECT_EQ(sampler.Sample(logits.data(), 2), 1);  // 1.8 vs 2
  SamplingParams q;
  q.presence_penalty = 1.5f;  // once: 1.5 vs 2 at once
  Sampler presence(q);
  presence.Accept(0);
  EXPECT_EQ(presence.Sample(logits.data(), 2), 1);
}

TEST(SamplerTransformsTest, MinTokensHoldsBackEosAndStopTokensUntilReached) {
  const std::vector<float> logits = {0.0f, 9.0f, 8.0f, 1.0f};  // 1: EOS, 2: a stop token
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {2};
  const std::vector<int> eos = {1};
  Sampler sampler(p, {}, eos);
  EXPECT_FALSE(sampler.greedy());
  EXPECT_EQ(sampler.Sample(logits.data(), 4), 3);
  sampler.Accept(3);
  EXPECT_EQ(sampler.Sample(logits.data(), 4), 3);
  sampler.Accept(3);
  EXPECT_TRUE(sampler.greedy());  // reached: the device's argmax serves again
  EXPECT_EQ(sampler.Sample(logits.data(), 4), 1);
  // Ignoring EOS (no eos given): only the stop token is held back.
  Sampler no_eos(p);
  EXPECT_EQ(no_eos.Sample(logits.data(), 4), 1);
}

TEST(SamplerTransformsTest, MinPDropsTokensBelowItsShareOfTheLargest) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (logits log 4, log 2, 0, 0). min_p 0.3 keeps
  // p >= 0.15: tokens 0 and 1.
  const std::vector<float> logits = {std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.3f;
  p.seed = 11;
  Sampler sampler(p);
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 3000; ++i) {
    const int32_t token = sampler.Sample(logits.data(), 4);
    sampler.Accept(token);
    ++counts[token];
  }
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[0] / 3000.0, 2.0 / 3.0, 0.04);  // renormalized: 0.5 / 0.75
  // min_p 0 draws all four.
  p.min_p = 0.0f;
  Sampler all(p);
  std::set<int> drawn;
  for (int i = 0; i < 3000; ++i) {
    drawn.insert(all.Sample(logits.data(), 4));
    all.Accept(0);  // the next step's draw
  }
  EXPECT_EQ(drawn.size(), 4u);
  // min_p 1 keeps the largest only.
  p.min_p = 1.0f;
  Sampler top(p);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(top.Sample(logits.data(), 4), 0);
    top.Accept(0);
  }
}

TEST(SamplerTransformsTest, SampledDrawsSeeTheBias) {
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.logit_bias = {{1, -100.0f}, {2, 100.0f}};
  Sampler sampler(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.Sample(logits.data(), 3), 2);
}

TEST(SamplerTransformsTest, DraftVerificationSeesTheTransforms) {
  const std::vector<float> logits = {5.0f, 1.0f};
  SamplingParams p;
  p.logit_bias = {{1, 10.0f}};
  Sampler sampler(p);
  int32_t replacement = -1;
  EXPECT_FALSE(sampler.AcceptDraft(logits.data(), 2, 0, replacement));
  EXPECT_EQ(replacement, 1);
  EXPECT_TRUE(sampler.AcceptDraft(logits.data(), 2, 1, replacement));
}

TEST(SamplerTransformsTest, ValidateRefusesOutOfRangeValues) {
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = SamplingParams{};
  p.repetition_penalty = 0.0f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = SamplingParams{};
  p.min_tokens = -1;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
}

}  // namespace
}  // namespace strata
