#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(SamplerTest, GreedyTakesFirstMaximum) {
  Sampler sampler(SamplingParams{});
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sampler.Sample(logits.data(), 4), 1);
}

// The first index of the largest value, NaN never winning (max_element over the non-NaN values).
int64_t ReferenceArgMax(const std::vector<float>& v) {
  int64_t best = -1;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isnan(v[i]) && (best < 0 || v[i] > v[best])) best = static_cast<int64_t>(i);
  }
  return best < 0 ? 0 : best;
}

TEST(SamplerTest, ArgMaxIsFirstLargestIgnoringNaN) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  for (const int64_t n : {1, 2, 15, 16, 17, 31, 33, 1000, 151936}) {
    for (int round = 0; round < 4; ++round) {
      std::vector<float> v(n);
      for (float& x : v) x = static_cast<float>(small(rng));
      if (round == 1) v.assign(n, -2.0f);  // all equal
      if (round == 2 && n > 3) v[n / 2] = std::nanf("");
      if (round == 3) v[0] = std::nanf("");
      EXPECT_EQ(ArgMax(v.data(), n), ReferenceArgMax(v)) << "n=" << n << " round " << round;
    }
  }
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ArgMax(std::vector<float>{nan, nan}.data(), 2), 0);
  EXPECT_EQ(ArgMax(std::vector<float>{nan, -inf, -inf}.data(), 3), 1);
  EXPECT_EQ(ArgMax(std::vector<float>{nan, 1.0f, 2.0f, 2.0f}.data(), 4), 2);
}

TEST(SamplerTest, SameSeedSameTokens) {
  const std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  SamplingParams params{.temperature = 1.0f, .seed = 42};
  Sampler a(params), b(params);
  std::vector<int32_t> draws_a, draws_b;
  for (int i = 0; i < 50; ++i) {
    draws_a.push_back(a.Sample(logits.data(), 5));
    draws_b.push_back(b.Sample(logits.data(), 5));
    a.Accept(draws_a.back());
    b.Accept(draws_b.back());
  }
  EXPECT_EQ(draws_a, draws_b);
  // Fifty draws from a near-uniform distribution use more than one token.
  EXPECT_GT(std::set<int32_t>(draws_a.begin(), draws_a.end()).size(), 1u);
}

// A draw is a function of (seed, how many tokens came before), not of the sampler's history:
// the device picks the same token for that step (common/util/philox.h).
TEST(SamplerTest, DrawsDependOnSeedAndStepOnly) {
  const std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f, 0.7f, 1.2f};
  for (const SamplingParams& params :
       {SamplingParams{.temperature = 1.0f, .seed = 9},
        SamplingParams{.temperature = 0.9f, .top_k = 5, .top_p = 0.9f, .seed = 9},
        SamplingParams{.temperature = 1.1f, .seed = 9, .min_p = 0.5f}}) {
    Sampler a(params), b(params);
    for (int step = 0; step < 30; ++step) {
      a.Sample(logits.data(), 7);  // a draws at every step, b only now
      ASSERT_EQ(a.Sample(logits.data(), 7), b.Sample(logits.data(), 7)) << step;
      a.Accept(1);
      b.Accept(static_cast<int32_t>(step % 7));
    }
    const std::optional<RowSampling> row = a.device_row();
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->step, 30u);
    EXPECT_EQ(row->seed, 9u);
  }
}

// The transforms go to the device as a sorted list of the tokens they touch, kept up to date as
// tokens are taken; a list too long for the device leaves the row to the host.
TEST(SamplerTest, DeviceRowCarriesTheTransformsTokens) {
  SamplingParams params{.temperature = 1.0f,
                        .seed = 3,
                        .repetition_penalty = 1.1f,
                        .frequency_penalty = 0.5f,
                        .logit_bias = {{9, 2.0f}},
                        .min_tokens = 2};
  const std::vector<int32_t> prompt = {5, 7, 5};
  const std::vector<int> eos = {1};
  Sampler sampler(params, prompt, eos);
  using T = TransformToken;
  auto list = [](const RowSampling& row) {
    std::vector<std::tuple<int32_t, int32_t, float, uint32_t>> out;
    for (const T& t : *row.tokens) out.emplace_back(t.token, t.output_count, t.bias, t.flags);
    return out;
  };
  std::optional<RowSampling> row = sampler.device_row();
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->repetition_penalty, 1.1f);
  EXPECT_EQ(row->frequency_penalty, 0.5f);
  EXPECT_EQ(row->min_tokens, 2);
  EXPECT_EQ(row->step, 0u);
  EXPECT_EQ(list(*row),
            (std::vector<std::tuple<int32_t, int32_t, float, uint32_t>>{{1, 0, 0.0f, T::kHeldBack},
                                                                        {5, 0, 0.0f, T::kSeen},
                                                                        {7, 0, 0.0f, T::kSeen},
                                                                        {9, 0, 2.0f, 0}}));
  sampler.Accept(7);
  // One token in flight: the draw is a step on, the list as of what was taken.
  row = sampler.device_row(/*in_flight=*/1);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->step, 2u);
  EXPECT_EQ(row->list_step, 1u);
  EXPECT_EQ(list(*row),
            (std::vector<std::tuple<int32_t, int32_t, float, uint32_t>>{{1, 0, 0.0f, T::kHeldBack},
                                                                        {5, 0, 0.0f, T::kSeen},
                                                                        {7, 1, 0.0f, T::kSeen},
                                                                        {9, 0, 2.0f, 0}}));
  sampler.Accept(3);  // min_tokens reached: the end token is no longer held back
  row = sampler.device_row();
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(list(*row),
            (std::vector<std::tuple<int32_t, int32_t, float, uint32_t>>{{3, 1, 0.0f, T::kSeen},
                                                                        {5, 0, 0.0f, T::kSeen},
                                                                        {7, 1, 0.0f, T::kSeen},
                                                                        {9, 0, 2.0f, 0}}));
  // Plain sampling has no list; too many tokens to transform stay on the host.
  EXPECT_EQ(Sampler(SamplingParams{.temperature = 1.0f}).device_row()->tokens, nullptr);
  std::vector<int32_t> long_prompt(kMaxDeviceTransformTokens + 1);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<int32_t>(i);
  Sampler wide(SamplingParams{.temperature = 1.0f, .repetition_penalty = 1.2f}, long_prompt);
  EXPECT_FALSE(wide.device_row().has_value());
}

TEST(SamplerTest, TopKOneIsGreedy) {
  const std::vector<float> logits = {0.5f, 0.4f, 3.0f, 0.1f};
  Sampler sampler(SamplingParams{.temperature = 2.0f, .top_k = 1, .seed = 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.Sample(logits.data(), 4), 2);
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  // Probabilities about 0.84, 0.11, 0.04, 0.01: top_p 0.8 keeps only the first.
  const std::vector<float> logits = {4.0f, 2.0f, 1.0f, -0.5f};
  Sampler sampler(SamplingParams{.temperature = 1.0f, .top_p = 0.8f, .seed = 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sampler.Sample(logits.data(), 4), 0);
}

// The kept tokens by the definition, with a full sort: ranked by (logit / T, then index), the
// top k, those of weight >= min_p, then the smallest prefix whose mass reaches top_p.
std::set<int32_t> ReferenceKept(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> ranked;
  for (size_t i = 0; i < logits.size(); ++i) {
    ranked.push_back({logits[i] / p.temperature, static_cast<int32_t>(i)});
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (p.top_k > 0 && p.top_k < std::ssize(ranked)) ranked.resize(p.top_k);
  const float x0 = ranked[0].first;
  std::erase_if(ranked, [&](const auto& c) { return std::exp(c.first - x0) < p.min_p; });
  double total = 0.0;
  for (const auto& c : ranked) total += std::exp(double{c.first} - x0);
  std::set<int32_t> kept;
  double mass = 0.0;
  for (const auto& c : ranked) {
    kept.insert(c.second);
    mass += std::exp(double{c.first} - x0) / total;
    if (mass >= p.top_p) break;
  }
  return kept;
}

// Top-k, min_p and top-p over a large vocabulary, found by radix passes instead of a sort:
// every draw is in the set a full sort defines, and the draws spread over it.
TEST(SamplerTest, DrawsStayInTheSortedDefinitionsSet) {
  const int64_t vocab = 151936;
  std::vector<float> logits(vocab);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& l : logits) l = normal(rng);
  for (int i = 0; i < 40; ++i) logits[1000 + 37 * i] = 11.0f;  // a group of ties at the top
  for (const SamplingParams& params :
       {SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .seed = 5},
        SamplingParams{.temperature = 1.0f, .top_k = 3000, .top_p = 0.95f, .seed = 5},
        SamplingParams{.temperature = 1.2f, .top_p = 0.99f, .seed = 5, .min_p = 0.01f},
        SamplingParams{.temperature = 0.7f, .top_k = 50, .seed = 5},
        SamplingParams{.temperature = 1.0f, .top_k = 20, .seed = 5}}) {
    const std::set<int32_t> kept = ReferenceKept(logits, params);
    Sampler sampler(params);
    std::set<int32_t> drawn;
    for (int step = 0; step < 200; ++step) {
      const int32_t token = sampler.Sample(logits.data(), vocab);
      ASSERT_TRUE(kept.contains(token)) << "token " << token << " step " << step;
      drawn.insert(token);
      sampler.Accept(token);
    }
    EXPECT_GT(drawn.size(), std::min<size_t>(kept.size() / 2, 20)) << kept.size() << " kept";
  }
}

// A nucleus that ends inside a run of equal logits keeps the lowest indices of the run: over a
// flat vocabulary, top_p 0.5 keeps exactly the first half, however large.
TEST(SamplerTest, ANucleusEndingInTiesKeepsTheLowestIndices) {
  const int64_t vocab = 151936;
  const std::vector<float> flat(vocab, 0.25f);
  Sampler sampler(SamplingParams{.temperature = 0.7f, .top_p = 0.5f, .seed = 8});
  int32_t highest = 0;
  for (int step = 0; step < 300; ++step) {
    const int32_t token = sampler.Sample(flat.data(), vocab);
    ASSERT_LT(token, vocab / 2);
    highest = std::max(highest, token);
    sampler.Accept(token);
  }
  EXPECT_GT(highest, vocab / 2 - vocab / 20);  // the whole half, not a prefix of a thousand
}

TEST(SamplerTest, FrequenciesFollowTheDistribution) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  Sampler sampler(SamplingParams{.temperature = 1.0f, .seed = 11});
  int ones = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    const int32_t token = sampler.Sample(logits.data(), 2);
    sampler.Accept(token);
    ones += token;
  }
  EXPECT_NEAR(static_cast<double>(ones) / draws, 0.75, 0.02);
}

TEST(SamplerTest, RejectsBadParameters) {
  EXPECT_FALSE(ValidateSamplingParams({.temperature = -1.0f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_k = -2}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_p = 0.0f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({.top_p = 1.5f}).ok());
  EXPECT_TRUE(ValidateSamplingParams({.temperature = 0.7f, .top_k = 40, .top_p = 0.9f}).ok());
}

// Speculative decoding's rejection sampling with a certain draft: whatever the draft, the token
// that results (the draft if accepted, else the replacement) is distributed as Sample's.
TEST(SamplerTest, DraftAcceptanceKeepsTheDistribution) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 1.5f};
  const SamplingParams params{.temperature = 0.8f, .top_k = 4, .top_p = 0.95f, .seed = 7};
  constexpr int kDraws = 200000;
  std::vector<double> want(logits.size(), 0.0);
  {
    Sampler sampler(params);
    for (int i = 0; i < kDraws; ++i) {
      const int32_t token = sampler.Sample(logits.data(), 5);
      sampler.Accept(token);
      ++want[token];
    }
  }
  for (int32_t draft : {0, 1, 3, 4}) {  // likely, less likely, cut by top-k, in between
    Sampler sampler({.temperature = 0.8f, .top_k = 4, .top_p = 0.95f, .seed = 100u + draft});
    std::vector<double> got(logits.size(), 0.0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      int32_t replacement = -1;
      if (sampler.AcceptDraft(logits.data(), 5, draft, replacement)) {
        ++got[draft];
        ++accepted;
        sampler.Accept(draft);
      } else {
        ASSERT_NE(replacement, draft);
        ++got[replacement];
        sampler.Accept(replacement);
      }
    }
    for (size_t t = 0; t < logits.size(); ++t) {
      EXPECT_NEAR(got[t] / kDraws, want[t] / kDraws, 0.006) << "draft " << draft << " token " << t;
    }
    // Accepted as often as the draft would have been drawn.
    EXPECT_NEAR(static_cast<double>(accepted) / kDraws, want[draft] / kDraws, 0.006);
  }
  // Greedy: accepted exactly when it is the argmax, else replaced by it.
  Sampler greedy({});
  int32_t replacement = -1;
  EXPECT_TRUE(greedy.AcceptDraft(logits.data(), 5, 0, replacement));
  EXPECT_FALSE(greedy.AcceptDraft(logits.data(), 5, 4, replacement));
  EXPECT_EQ(replacement, 0);
}

// A grammar that allows the even tokens only, counting what it was given.
class EvenTokens : public TokenConstraint {
 public:
  void MaskLogits(float* logits, int64_t vocab) override {
    for (int64_t i = 1; i < vocab; i += 2) logits[i] = -std::numeric_limits<float>::infinity();
  }
  bool Accept(int32_t token) override {
    ++accepted;
    return token % 2 == 0;
  }
  bool terminated() const override { return accepted >= 3; }
  int accepted = 0;
};

TEST(SamplerTest, AConstraintMasksBeforeTheDraw) {
  // Greedy: the best allowed token, not the best one.
  Sampler greedy(SamplingParams{}, {}, {}, std::make_unique<EvenTokens>());
  const std::vector<float> logits = {0.5f, 9.0f, 1.0f, 8.0f};
  EXPECT_EQ(greedy.Sample(logits.data(), 4), 2);
  EXPECT_FALSE(greedy.greedy());  // the device's arg-max would ignore the mask
  EXPECT_FALSE(greedy.device_row().has_value());
  EXPECT_TRUE(greedy.constrained());
  // Sampled: never a masked token, whatever the seed.
  std::set<int32_t> drawn;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.seed = seed;
    Sampler sampler(params, {}, {}, std::make_unique<EvenTokens>());
    drawn.insert(sampler.Sample(logits.data(), 4));
  }
  EXPECT_EQ(drawn, (std::set<int32_t>{0, 2}));
}

TEST(SamplerTest, AcceptReportsWhatTheConstraintRefuses) {
  Sampler sampler(SamplingParams{}, {}, {}, std::make_unique<EvenTokens>());
  EXPECT_TRUE(sampler.Accept(4));
  EXPECT_FALSE(sampler.Accept(3));
  EXPECT_FALSE(sampler.constraint_terminated());
  EXPECT_TRUE(sampler.Accept(0));
  EXPECT_TRUE(sampler.constraint_terminated());
  Sampler free(SamplingParams{});
  EXPECT_TRUE(free.Accept(3));
  EXPECT_FALSE(free.constraint_terminated());
}

}  // namespace
}  // namespace strata
