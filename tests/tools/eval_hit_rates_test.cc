// `strata eval --hit-rates`: expert caches replayed over a routing trace (SimulateExpertCaches),
// and the demo model's routing on held-out text traced in process.
#include <vector>

#include "gtest/gtest.h"
#include "tools/strata/eval_command.h"

namespace strata {
namespace {

TEST(EvalHitRatesTest, CachesOverATrace) {
  // 4 pairs; pair 0 used 6 times, pair 1 3 times, pairs 2 and 3 once each (11 uses).
  std::vector<ExpertKey> trace;
  for (int i = 0; i < 3; ++i) trace.insert(trace.end(), {{0, 0}, {0, 1}, {0, 0}});
  trace.insert(trace.end(), {{0, 2}, {1, 3}});
  const std::vector<CacheHitRate> r = SimulateExpertCaches(trace, 4, {0.25, 0.5, 1.0});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].slots, 1);
  EXPECT_NEAR(r[0].best_static, 6.0 / 11, 1e-9);  // pair 0 held
  EXPECT_NEAR(r[1].best_static, 9.0 / 11, 1e-9);
  EXPECT_NEAR(r[2].best_static, 1.0, 1e-9);
  // Everything fits: only the first use of each of the 4 pairs misses.
  EXPECT_NEAR(r[2].lfu, 7.0 / 11, 1e-9);
  // One slot, every miss admitted (0 1 0 | 0 1 0 | 0 1 0 | 2 3): pair 0 hits only where it
  // follows itself, twice; the best fixed set would hold it throughout.
  EXPECT_NEAR(r[0].lfu, 2.0 / 11, 1e-9);
}

TEST(EvalHitRatesTest, TheDemoModelsRoutingIsTraced) {
  EvalOptions options;
  options.engine.model_dir = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
  options.engine.num_threads = 2;
  options.text_file = std::string(STRATA_SOURCE_DIR) + "/tests/data/heldout/strata-demo-valid.txt";
  options.window = 256;
  options.hit_rate_shares = {0.25, 1.0};
  auto result = Evaluate(options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->hit_rates.size(), 2u);
  // 8 MoE layers x 16 experts: a quarter is 32 slots.
  EXPECT_EQ(result->hit_rates[0].slots, 32);
  EXPECT_GT(result->hit_rates[0].lfu, 0.2);
  EXPECT_LT(result->hit_rates[0].lfu, result->hit_rates[1].lfu);
  // Every pair fits: only first uses miss (at most 128 of the text's 8303 x 8 x 4 uses).
  EXPECT_GT(result->hit_rates[1].lfu, 0.99);
  EXPECT_NEAR(result->hit_rates[1].best_static, 1.0, 1e-9);
  options.server = "127.0.0.1:1";
  EXPECT_EQ(Evaluate(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
