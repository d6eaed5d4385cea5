// A request's n samples (RequestSpec::n) against a fake step runner: the prompt is computed
// once, the samples share its KV blocks, each draws from its own seed, and they end together
// when the request is cancelled.
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "services/router/scheduler.h"
#include "tests/testing/collecting_sink.h"
#include "tests/testing/fake_step_runner.h"

namespace strata {
namespace {

using ::strata::testing::CollectingSink;
using ::strata::testing::FakeStepRunner;

constexpr int64_t kVocab = 97;

class Harness {
 public:
  explicit Harness(bool prefix_caching = false)
      : config_(::strata::testing::FakeConfig(kVocab)),
        kv_(*PagedKvCache::Create({.cache = {.block_size = 4, .prefix_caching = prefix_caching},
                                   .num_blocks = 64,
                                   .num_layers = 1,
                                   .num_kv_heads = 1,
                                   .head_dim = 1})),
        runner_(kv_, kVocab) {
    scheduler_ = std::make_unique<Scheduler>(config_, runner_, kv_, nullptr,
                                             SchedulerOptions{.max_batch_tokens = 64});
  }
  ~Harness() { scheduler_.reset(); }

  Scheduler& scheduler() { return *scheduler_; }
  FakeStepRunner& runner() { return runner_; }

  // Submits `spec` with a sink per sample; the sinks.
  std::vector<std::shared_ptr<CollectingSink>> Submit(const RequestSpec& spec,
                                                      Scheduler::Ticket* ticket = nullptr) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    std::vector<std::shared_ptr<ResponseSink>> as_sinks;
    for (int i = 0; i < spec.n; ++i) {
      sinks.push_back(std::make_shared<CollectingSink>());
      as_sinks.push_back(sinks.back());
    }
    absl::StatusOr<Scheduler::Ticket> t = scheduler_->Submit(spec, as_sinks);
    EXPECT_TRUE(t.ok()) << t.status();
    if (ticket != nullptr && t.ok()) *ticket = *t;
    return sinks;
  }

 private:
  ModelConfig config_;
  PagedKvCache kv_;
  FakeStepRunner runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

RequestSpec Prompt(int prompt_len, int max_new_tokens, int n) {
  RequestSpec spec;
  for (int i = 0; i < prompt_len; ++i) spec.prompt.push_back(3 + i);
  spec.max_new_tokens = max_new_tokens;
  spec.ignore_eos = true;
  spec.n = n;
  return spec;
}

TEST(ParallelSamplesTest, ThePromptIsComputedOnceAndItsBlocksShared) {
  Harness h;
  // 10 prompt tokens in blocks of 4: two full blocks and a partial one.
  const RequestSpec spec = Prompt(10, 3, 4);
  const std::vector<std::shared_ptr<CollectingSink>> sinks = h.Submit(spec);
  h.scheduler().Start();
  std::vector<int32_t> expected;  // greedy: every sample the same tokens
  int32_t token = spec.prompt.back();
  for (int64_t position = 9; position < 12; ++position) {
    token = FakeStepRunner::NextToken(token, position, kVocab);
    expected.push_back(token);
  }
  for (const auto& sink : sinks) {
    ASSERT_TRUE(sink->Wait(10));
    EXPECT_EQ(sink->reason(), FinishReason::kLength);
    EXPECT_EQ(sink->tokens(), expected);
    EXPECT_EQ(sink->usage().prompt_tokens, 10);
    EXPECT_EQ(sink->usage().completion_tokens, 3);
  }
  EXPECT_EQ(h.runner().violation(), "");
  // Each prompt position was computed in one step, once.
  int64_t prompt_rows = 0;
  for (const StepPlan& plan : h.runner().plans()) {
    for (int64_t position : plan.batch.position) prompt_rows += position < 10;
  }
  EXPECT_EQ(prompt_rows, 10);
  EXPECT_EQ(h.scheduler().stats().prompt_tokens_computed, 10);
  // The first decode step has the four samples at position 10.
  const std::vector<StepPlan> plans = h.runner().plans();
  ASSERT_GE(plans.size(), 2u);
  EXPECT_EQ(plans[1].batch.position, (std::vector<int64_t>(4, 10)));
  EXPECT_EQ(
      std::set<int64_t>(plans[1].batch.sequence.begin(), plans[1].batch.sequence.end()).size(), 4u);
  // Positions 0-11 each: two full blocks shared, and per sample its own third block (the
  // partial one copied): 2 + 4 blocks, where four separate prompts would hold 4 x 3.
  EXPECT_EQ(h.runner().max_blocks_in_use(), 6);
}

// Sample i draws from seed + i: it is the request of one sample with that seed.
TEST(ParallelSamplesTest, SampleIIsTheRequestWithSeedPlusI) {
  std::vector<std::vector<int32_t>> together;
  {
    Harness h;
    h.runner().flat_logits = true;  // every token as likely: the seed picks
    RequestSpec spec = Prompt(6, 8, 3);
    spec.sampling = {.temperature = 1.0f, .seed = 41};
    std::vector<std::shared_ptr<CollectingSink>> sinks = h.Submit(spec);
    h.scheduler().Start();
    for (const auto& sink : sinks) {
      ASSERT_TRUE(sink->Wait(10));
      together.push_back(sink->tokens());
    }
  }
  EXPECT_EQ(std::set<std::vector<int32_t>>(together.begin(), together.end()).size(), 3u);
  for (int i = 0; i < 3; ++i) {
    Harness h;
    h.runner().flat_logits = true;
    RequestSpec spec = Prompt(6, 8, 1);
    spec.sampling = {.temperature = 1.0f, .seed = 41u + i};
    std::vector<std::shared_ptr<CollectingSink>> sinks = h.Submit(spec);
    h.scheduler().Start();
    ASSERT_TRUE(sinks[0]->Wait(10));
    EXPECT_EQ(sinks[0]->tokens(), together[i]) << "sample " << i;
  }
}

TEST(ParallelSamplesTest, CancellingTheRequestEndsEverySample) {
  for (const bool started : {false, true}) {
    Harness h;
    h.runner().run_time = std::chrono::milliseconds(2);  // 200 tokens take 0.4 s at least
    Scheduler::Ticket ticket = 0;
    std::vector<std::shared_ptr<CollectingSink>> sinks = h.Submit(Prompt(6, 200, 3), &ticket);
    if (started) {
      h.scheduler().Start();
      // Every sample is under way.
      for (int i = 0; i < 2000 && sinks.back()->tokens().empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_FALSE(sinks.back()->tokens().empty());
    }
    h.scheduler().Cancel(ticket);  // before the prompt is computed, or after
    if (!started) h.scheduler().Start();
    for (const auto& sink : sinks) {
      ASSERT_TRUE(sink->Wait(10)) << started;
      EXPECT_EQ(sink->reason(), FinishReason::kCancelled) << started;
      EXPECT_LT(sink->tokens().size(), 200u);
    }
  }
}

TEST(ParallelSamplesTest, RefusedCounts) {
  Harness h;
  auto sink = std::make_shared<CollectingSink>();
  for (int n : {0, kMaxSamples + 1}) {
    RequestSpec spec = Prompt(4, 2, n);
    absl::StatusOr<Scheduler::Ticket> t = h.scheduler().Submit(
        spec, std::vector<std::shared_ptr<ResponseSink>>(std::max(n, 0), sink));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
  // One sink for two samples.
  EXPECT_FALSE(h.scheduler().Submit(Prompt(4, 2, 2), sink).ok());
  RequestSpec scored = Prompt(4, 2, 2);
  scored.score_only = true;
  EXPECT_FALSE(
      h.scheduler().Submit(scored, std::vector<std::shared_ptr<ResponseSink>>(2, sink)).ok());
}

}  // namespace
}  // namespace strata
