// The arithmetic the host's Sampler and the device's sampling kernel share to decide which
// tokens a draw may pick (common/util/token_cut.h).
#include "common/util/token_cut.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(TokenCutTest, KeysOrderFloatsAndComeBack) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {-inf,   -1e30f, -2.5f, -1e-30f, -0.0f, 0.0f,
                               1e-30f, 1.0f,   3.5f,  1e30f,   inf};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (int i = 0; i < 1000; ++i) values.push_back(normal(rng));
  for (float a : values) {
    EXPECT_NE(OrderedKey(a), 0u) << a;
    EXPECT_EQ(FromOrderedKey(OrderedKey(a)), a) << a;
    for (float b : {values[3], values[7], values[20], values[500]}) {
      if (a < b) EXPECT_LT(OrderedKey(a), OrderedKey(b)) << a << " " << b;
      if (a > b) EXPECT_GT(OrderedKey(a), OrderedKey(b)) << a << " " << b;
    }
  }
  // -0 and +0 are equal floats with neighbouring keys, +0 above.
  EXPECT_EQ(OrderedKey(0.0f), OrderedKey(-0.0f) + 1);
  // Every NaN is below everything, and only NaN maps to 0.
  EXPECT_EQ(OrderedKey(std::nanf("")), 0u);
  EXPECT_EQ(OrderedKey(-std::nanf("")), 0u);
  EXPECT_GT(OrderedKey(-inf), 0u);
}

TEST(TokenCutTest, MassesAreExactFixedPoint) {
  EXPECT_EQ(FixedMass(1.0f), uint64_t{1} << kMassFractionBits);
  EXPECT_EQ(FixedMass(0.5f), uint64_t{1} << (kMassFractionBits - 1));
  EXPECT_EQ(FixedMass(0.0f), 0u);
  EXPECT_EQ(FixedMass(std::ldexp(1.0f, -kMassFractionBits - 1)), 0u);  // below the last bit
  // 2^20 tokens of weight 1 fit in 64 bits.
  EXPECT_LT(FixedMass(1.0f), std::numeric_limits<uint64_t>::max() >> 20);
}

TEST(TokenCutTest, NucleusTargetIsTopPRoundedUpWithinTheTotal) {
  EXPECT_EQ(NucleusTarget(0.5f, 1000), 500u);
  EXPECT_EQ(NucleusTarget(0.25f, 1001), 251u);  // 250.25 rounds up
  EXPECT_EQ(NucleusTarget(1.0f, 1000), 1000u);
  EXPECT_EQ(NucleusTarget(1e-9f, 1000), 1u);  // at least one
  const uint64_t huge = uint64_t{1} << 62;
  EXPECT_LE(NucleusTarget(0.99999994f, huge + 1), huge + 1);  // double rounding stays inside
}

TEST(TokenCutTest, KeptIsTheCutsPrefixAndMinP) {
  TokenCut cut{.key = OrderedKey(1.0f), .last_index = 5, .x0 = 3.0f, .min_p = 0.0f};
  EXPECT_TRUE(Kept(2.0f, 100, cut));  // above the cut key: any index
  EXPECT_TRUE(Kept(1.0f, 5, cut));    // on it, up to last_index
  EXPECT_FALSE(Kept(1.0f, 6, cut));
  EXPECT_FALSE(Kept(0.5f, 0, cut));                  // below it
  EXPECT_FALSE(Kept(std::nanf(""), 0, TokenCut{}));  // NaN never
  EXPECT_TRUE(Kept(-std::numeric_limits<float>::infinity(), 0, TokenCut{}));
  // min_p: weight exp(x - x0) against it.
  cut.min_p = 0.2f;
  EXPECT_TRUE(Kept(3.0f - std::log(4.0f), 0, cut));   // weight 0.25
  EXPECT_FALSE(Kept(3.0f - std::log(6.0f), 0, cut));  // weight 0.17
}

TEST(TokenCutTest, GumbelScoresFollowTheUniform) {
  // A larger uniform, a larger score; the logit shifts it.
  EXPECT_LT(GumbelScore(0.0f, 0.2f), GumbelScore(0.0f, 0.8f));
  EXPECT_FLOAT_EQ(GumbelScore(1.5f, 0.5f) - GumbelScore(0.0f, 0.5f), 1.5f);
  EXPECT_TRUE(std::isfinite(GumbelScore(0.0f, 1e-7f)));
}

}  // namespace
}  // namespace strata
