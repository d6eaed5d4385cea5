#include "services/router/http/metrics.h"

#include "gtest/gtest.h"
#include "services/router/http/serving_metrics.h"

namespace strata {
namespace {

TEST(MetricsTest, TextFormat) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(5);
  MetricsWriter w;
  w.Counter("strata_x_total", "Things\ncounted", 3, {{"outcome", "a\"b"}});
  w.Counter("strata_x_total", "", 4, {{"outcome", "c"}});
  w.Gauge("strata_g", "A gauge", 0.25);
  w.Histogram("strata_h_seconds", "A histogram", h.snapshot());
  EXPECT_EQ(w.text(),
            "# HELP strata_x_total Things\\ncounted\n"
            "# TYPE strata_x_total counter\n"
            "strata_x_total{outcome=\"a\\\"b\"} 3\n"
            "strata_x_total{outcome=\"c\"} 4\n"
            "# HELP strata_g A gauge\n"
            "# TYPE strata_g gauge\n"
            "strata_g 0.25\n"
            "# HELP strata_h_seconds A histogram\n"
            "# TYPE strata_h_seconds histogram\n"
            "strata_h_seconds_bucket{le=\"0.1\"} 1\n"
            "strata_h_seconds_bucket{le=\"1\"} 2\n"
            "strata_h_seconds_bucket{le=\"+Inf\"} 3\n"
            "strata_h_seconds_sum 5.55\n"
            "strata_h_seconds_count 3\n");
}

TEST(MetricsTest, ServingPageHasEveryFamilyOnce) {
  ServingMetrics serving;
  serving.Count(RequestOutcome::kSuccess);
  RequestMetrics requests;
  requests.AddToken(/*first=*/true, 0.2);
  requests.AddToken(/*first=*/false, 0.004);
  RouterSnapshot router;
  router.kv_blocks_total = 10;
  router.kv_blocks_free = 4;
  router.steps = 9;
  router.graph_steps = 7;
  router.replay_or_eager = {.trials = 2, .eager = true};
  router.workers.push_back(
      {.index = 0, .connected = true, .hot_hits = 5, .warm_hits = 2, .misses = 1});
  router.workers.push_back({.index = 1});
  const std::string page = RenderMetrics(serving, requests, router);
  EXPECT_NE(page.find("strata_requests_total{outcome=\"success\"} 1\n"), std::string::npos);
  EXPECT_NE(page.find("strata_kv_blocks_used 6\n"), std::string::npos);
  EXPECT_NE(page.find("strata_generated_tokens_total 2\n"), std::string::npos);
  EXPECT_NE(page.find("strata_time_to_first_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(page.find("strata_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(page.find("strata_worker_tier_hits_total{worker=\"0\",tier=\"warm\"} 2\n"),
            std::string::npos);
  EXPECT_NE(page.find("strata_worker_tier_misses_total{worker=\"1\"} 0\n"), std::string::npos);
  EXPECT_NE(page.find("strata_graph_steps_total 7\n"), std::string::npos);
  EXPECT_NE(page.find("strata_eager_step_trials_total 2\n"), std::string::npos);
  EXPECT_NE(page.find("strata_eager_step_switches_total 0\n"), std::string::npos);
  EXPECT_NE(page.find("strata_eager_steps_preferred 1\n"), std::string::npos);
  // Each family's TYPE line appears once.
  size_t types = 0, pos = 0;
  while ((pos = page.find("# TYPE strata_worker_tier_hits_total", pos)) != std::string::npos) {
    ++types, ++pos;
  }
  EXPECT_EQ(types, 1u);
  EXPECT_EQ(page.back(), '\n');
}

}  // namespace
}  // namespace strata
