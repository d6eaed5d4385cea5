#include "services/router/request_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(RequestMetricsTest, TotalsAndMeans) {
  RequestMetrics metrics;
  for (int i = 0; i < 5; ++i) metrics.AddToken(/*first=*/i % 4 == 0, 0.02);
  metrics.Record({.prompt_tokens = 10, .completion_tokens = 4, .time_to_first_token_ms = 30},
                 /*decode_ms=*/60);
  metrics.Record({.prompt_tokens = 6, .completion_tokens = 1, .time_to_first_token_ms = 10}, 0);
  metrics.Record({.prompt_tokens = 3}, 0);  // cancelled while waiting: no token, no latency
  const RequestMetrics::Totals t = metrics.totals();
  EXPECT_EQ(t.requests, 3);
  EXPECT_EQ(t.prompt_tokens, 19);
  EXPECT_EQ(t.generated_tokens, 5);
  EXPECT_EQ(t.tokens_so_far, 5);
  EXPECT_DOUBLE_EQ(t.mean_ttft_ms(), 20.0);
  EXPECT_DOUBLE_EQ(t.mean_inter_token_ms(), 20.0);  // 60 ms over 3 gaps
  EXPECT_GE(metrics.uptime(), absl::ZeroDuration());
  EXPECT_EQ(metrics.time_to_first_token().snapshot().count, 2u);
  EXPECT_EQ(metrics.inter_token_latency().snapshot().count, 3u);
  EXPECT_DOUBLE_EQ(RequestMetrics::Totals().mean_ttft_ms(), 0.0);
}

TEST(RequestMetricsTest, FinishedRequestLine) {
  const RequestUsage usage{.prompt_tokens = 12,
                           .completion_tokens = 48,
                           .time_to_first_token_ms = 35.25,
                           .decode_tokens_per_second = 210.3};
  EXPECT_EQ(FinishedRequestLine("abc", FinishReason::kStop, usage),
            "request abc finished (stop): 12 prompt tokens, 48 generated, TTFT 35.2 ms, "
            "210.3 tok/s decode");
}

TEST(RequestMetricsTest, ThroughputLineOnlyWhenBusy) {
  RequestMetrics::Totals before, now;
  now.requests = 4;
  now.tokens_so_far = 200;
  const ThroughputState idle;
  EXPECT_FALSE(Busy(before, before, idle));
  EXPECT_TRUE(Busy(before, now, idle));
  EXPECT_TRUE(Busy(before, before, ThroughputState{.running = 1}));
  const std::string line = ThroughputLine(
      before, now, 10.0, {.running = 2, .queued = 1, .used_kv_blocks = 7, .total_kv_blocks = 64});
  EXPECT_EQ(line,
            "last 10 s: 4 requests finished, 20.0 generated tok/s; 2 running, 1 queued, KV "
            "blocks 7/64 used");
  // Tiered workers: their expert uses over the span.
  EXPECT_EQ(ThroughputLine(before, now, 10.0,
                           {.used_kv_blocks = 7,
                            .total_kv_blocks = 64,
                            .expert_uses = {.hot = 50, .warm = 30, .cold = 20}}),
            "last 10 s: 4 requests finished, 20.0 generated tok/s; 0 running, 0 queued, KV "
            "blocks 7/64 used; expert uses 50.0% hot, 30.0% warm, 20.0% cold");
}

}  // namespace
}  // namespace strata
