// The hot ratio by context length, its text form, and operator overrides.
#include "common/placement/hot_ratio.h"

#include <utility>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(HotRatioPolicyTest, DefaultIsTheDesignTable) {
  const HotRatioPolicy policy;
  EXPECT_FLOAT_EQ(policy.For(1), 0.35f);
  EXPECT_FLOAT_EQ(policy.For(511), 0.35f);
  EXPECT_FLOAT_EQ(policy.For(512), 0.28f);
  EXPECT_FLOAT_EQ(policy.For(2047), 0.28f);
  EXPECT_FLOAT_EQ(policy.For(2048), 0.20f);
  EXPECT_FLOAT_EQ(policy.For(1 << 20), 0.20f);
  EXPECT_EQ(policy.ToString(), "512:0.35,2048:0.28,0.2");
}

TEST(HotRatioTest, ParsesAutoOrAFraction) {
  const auto automatic = ParseHotRatio("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_FALSE(automatic->has_value());
  for (const auto& [text, value] : {std::pair{"0", 0.0f}, {"0.35", 0.35f}, {"1", 1.0f}}) {
    const auto r = ParseHotRatio(text);
    ASSERT_TRUE(r.ok() && r->has_value()) << text;
    EXPECT_FLOAT_EQ(**r, value);
  }
  for (const char* bad : {"", "Auto", "-0.1", "1.01", "nan", "0.3x", "lots"}) {
    const auto r = ParseHotRatio(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(HotRatioPolicyTest, ParsesAndRejects) {
  auto p = HotRatioPolicy::Parse("100:0.9, 1000:0.5, 0.1");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->For(99), 0.9f);
  EXPECT_FLOAT_EQ(p->For(100), 0.5f);
  EXPECT_FLOAT_EQ(p->For(5000), 0.1f);
  auto constant = HotRatioPolicy::Parse("0.4");
  ASSERT_TRUE(constant.ok());
  EXPECT_FLOAT_EQ(constant->For(10), 0.4f);
  for (const char* bad : {"", "512:0.35", "512:1.5,0.2", "2048:0.3,512:0.2,0.1", "x:0.3,0.2",
                          "512:0.3,0.2:0.1", "-5:0.3,0.2"}) {
    const auto r = HotRatioPolicy::Parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Before any step the ratio is the policy's own for short contexts, not the default table's.
TEST(HotRatioControlTest, StartsAtThePolicysFirstRatio) {
  auto policy = HotRatioPolicy::Parse("1024:0.5,0.3");
  ASSERT_TRUE(policy.ok());
  HotRatioControl control{*policy};
  EXPECT_FLOAT_EQ(control.current(), 0.5f);
  EXPECT_FLOAT_EQ(control.Update(1000), 0.5f);
  EXPECT_FLOAT_EQ(HotRatioControl{HotRatioPolicy()}.current(), 0.35f);
}

TEST(HotRatioControlTest, FixedOverridesThePolicyUntilAutomatic) {
  HotRatioControl control{HotRatioPolicy()};
  EXPECT_TRUE(control.automatic());
  EXPECT_FLOAT_EQ(control.Update(3000), 0.20f);
  ASSERT_TRUE(control.SetFixed(0.6f).ok());
  EXPECT_FALSE(control.automatic());
  EXPECT_FLOAT_EQ(control.current(), 0.6f);
  EXPECT_FLOAT_EQ(control.Update(10), 0.6f);
  EXPECT_FALSE(control.SetFixed(-0.1f).ok());
  EXPECT_FALSE(control.SetFixed(1.01f).ok());
  EXPECT_FLOAT_EQ(control.current(), 0.6f);
  control.SetAutomatic();
  EXPECT_FLOAT_EQ(control.Update(10), 0.35f);
}

TEST(HotRatioControlTest, ShorterContextsRaiseTheRatioOnlyClearlyBelowALimit) {
  HotRatioControl control{HotRatioPolicy()};  // 512:0.35, 2048:0.28, 0.20
  EXPECT_FLOAT_EQ(control.Update(100), 0.35f);
  EXPECT_FLOAT_EQ(control.Update(600), 0.28f);  // longer: at once
  EXPECT_FLOAT_EQ(control.Update(500), 0.28f);  // just below 512: kept
  EXPECT_FLOAT_EQ(control.Update(600), 0.28f);
  EXPECT_FLOAT_EQ(control.Update(470), 0.28f);  // 470 + 470 / 8 = 528: within an eighth
  EXPECT_FLOAT_EQ(control.Update(450), 0.35f);  // 450 + 56 = 506: clearly below
  EXPECT_FLOAT_EQ(control.Update(5000), 0.20f);
  EXPECT_FLOAT_EQ(control.Update(1900), 0.20f);  // 1900 + 237 >= 2048
  EXPECT_FLOAT_EQ(control.Update(100), 0.35f);   // far below both limits
}

}  // namespace
}  // namespace strata
