// The scheduler as policy only: what it asks a StepRunner for, step by step, against a fake
// runner with no model (tests/testing/fake_step_runner.h). The model-backed scheduler_test
// checks the tokens of real steps; here the plans themselves are checked.
#include <memory>
#include <random>
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

// What one request produces alone: each token NextToken of the one before at its position.
std::vector<int32_t> Expected(const RequestSpec& spec) {
  std::vector<int32_t> out;
  int32_t token = spec.prompt.back();
  int64_t position = static_cast<int64_t>(spec.prompt.size()) - 1;
  for (int i = 0; i < spec.max_new_tokens; ++i) {
    token = FakeStepRunner::NextToken(token, position++, kVocab);
    out.push_back(token);
  }
  return out;
}

class Harness {
 public:
  Harness(int num_blocks, SchedulerOptions options, bool replays, bool prefix_caching = false,
          int initial_blocks = 0)
      : config_(::strata::testing::FakeConfig(kVocab)),
        kv_(*PagedKvCache::Create({.cache = {.block_size = 4, .prefix_caching = prefix_caching},
                                   .num_blocks = num_blocks,
                                   .initial_blocks = initial_blocks,
                                   .num_layers = 1,
                                   .num_kv_heads = 1,
                                   .head_dim = 1})),
        runner_(kv_, kVocab) {
    runner_.replays = replays;
    scheduler_ = std::make_unique<Scheduler>(config_, runner_, kv_, nullptr, options);
  }
  ~Harness() { scheduler_.reset(); }

  Scheduler& scheduler() { return *scheduler_; }
  FakeStepRunner& runner() { return runner_; }
  PagedKvCache& kv() { return kv_; }

  // Submits every spec before the engine thread starts (so the first step sees them all), then
  // waits for each and checks its tokens.
  void RunAndExpect(const std::vector<RequestSpec>& specs) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const RequestSpec& spec : specs) {
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE(scheduler_->Submit(spec, sinks.back()).ok());
    }
    scheduler_->Start();
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_TRUE(sinks[i]->Wait(10)) << "request " << i;
      EXPECT_EQ(sinks[i]->reason(), FinishReason::kLength) << "request " << i;
      EXPECT_EQ(sinks[i]->tokens(), Expected(specs[i])) << "request " << i;
    }
    EXPECT_EQ(runner_.violation(), "");
  }

 private:
  ModelConfig config_;
  PagedKvCache kv_;
  FakeStepRunner runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

RequestSpec Greedy(int prompt_len, int max_new_tokens, int32_t first = 3) {
  RequestSpec spec;
  for (int i = 0; i < prompt_len; ++i) spec.prompt.push_back(first + i % 50);
  spec.max_new_tokens = max_new_tokens;
  spec.ignore_eos = true;
  return spec;
}

TEST(SchedulerPolicyTest, DecodesComeFirstAndPromptsAreChunkedByTheBudget) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 8, .max_running = 4}, /*replays=*/false);
  h.RunAndExpect({Greedy(3, 4), Greedy(20, 2, 9)});
  const std::vector<StepPlan> plans = h.runner().plans();
  ASSERT_GE(plans.size(), 4u);
  for (const StepPlan& plan : plans) EXPECT_LE(plan.ids.size(), 8u);
  // Step 1: all of prompt A (positions 0-2), then B's first 5. Step 2: A's first decode
  // (position 3) ahead of B's next chunk of 7 (positions 5-11).
  const PagedKvCache::SequenceId a = plans[0].batch.sequence[0];
  EXPECT_EQ(plans[0].batch.position, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4}));
  EXPECT_EQ(plans[0].logit_rows, (std::vector<int64_t>{2}));  // B's prompt is not done
  EXPECT_EQ(plans[1].batch.sequence[0], a);
  EXPECT_EQ(plans[1].batch.position, (std::vector<int64_t>{3, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(plans[1].logit_rows, (std::vector<int64_t>{0}));
}

TEST(SchedulerPolicyTest, GreedyDecodesAskForTheNextStepBehindThem) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64, .max_running = 4}, /*replays=*/true);
  h.RunAndExpect({Greedy(5, 12), Greedy(7, 12, 20)});
  // Two prompts of one step, then decodes: every decode after the first is collected from a
  // step launched ahead, but the last (its row's token limit).
  EXPECT_GE(h.runner().collects(), 8);
  EXPECT_GE(h.scheduler().stats().steps_ahead, 8);
}

TEST(SchedulerPolicyTest, SampledRowsDrawOnTheDeviceAndGoAhead) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64}, /*replays=*/true);
  RequestSpec sampled = Greedy(4, 6);
  // A temperature with top_k 1 picks the argmax too: the tokens stay predictable.
  sampled.sampling = {.temperature = 0.7f, .top_k = 1, .seed = 5};
  h.RunAndExpect({sampled});
  uint64_t last_step = 0;
  bool first = true;
  for (const StepPlan& plan : h.runner().plans()) {
    EXPECT_TRUE(plan.host_rows.empty());  // the device draws: no logits cross
    ASSERT_EQ(plan.sampling.size(), 1u);
    EXPECT_EQ(plan.sampling[0].temperature, 0.7f);
    EXPECT_EQ(plan.sampling[0].seed, 5u);
    // The draw's index is the tokens generated before it.
    if (!first) EXPECT_GT(plan.sampling[0].step, last_step);
    last_step = plan.sampling[0].step;
    first = false;
  }
  EXPECT_GT(h.runner().collects(), 0);  // and steps went ahead
}

TEST(SchedulerPolicyTest, PenalizedRowsTakeTheirTokensToTheDevice) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64}, /*replays=*/true);
  RequestSpec sampled = Greedy(4, 8);
  // A penalty moves logits on the device; top_k 1 keeps the argmax of the peaked fake logits.
  sampled.sampling = {.temperature = 0.7f, .top_k = 1, .seed = 5, .repetition_penalty = 1.1f};
  h.RunAndExpect({sampled});
  for (const StepPlan& plan : h.runner().plans()) {
    EXPECT_TRUE(plan.host_rows.empty());
    ASSERT_EQ(plan.sampling.size(), 1u);
    const RowSampling& row = plan.sampling[0];
    EXPECT_EQ(row.repetition_penalty, 1.1f);
    ASSERT_NE(row.tokens, nullptr);
    EXPECT_GE(row.tokens->size(), 4u);  // the prompt's tokens, seen
    EXPECT_EQ(row.list_step, row.step);
  }
  // A step launched behind one in flight counts that one's token as the device's to add.
  const std::vector<std::vector<RowSampling>> ahead = h.runner().next_samplings();
  ASSERT_FALSE(ahead.empty());
  for (const std::vector<RowSampling>& rows : ahead) {
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].step, rows[0].list_step + 1);
  }
}

TEST(SchedulerPolicyTest, LogprobsRowsAskForLogitsAndNeverForAStepAhead) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64}, /*replays=*/true);
  RequestSpec sampled = Greedy(4, 6);
  sampled.logprobs = true;
  h.RunAndExpect({sampled});
  for (const StepPlan& plan : h.runner().plans()) {
    EXPECT_FALSE(plan.launch_next);
    ASSERT_EQ(plan.host_rows.size(), 1u);  // its row's logits, every step
    EXPECT_EQ(plan.host_rows[0], 0);
  }
  EXPECT_EQ(h.runner().collects(), 0);
}

TEST(SchedulerPolicyTest, AFailedStepAheadIsRunAgainFromTheHostsTokens) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64}, /*replays=*/true);
  h.runner().fail_collect_call = 3;
  h.RunAndExpect({Greedy(6, 10)});
}

TEST(SchedulerPolicyTest, AFailedStepEndsItsRequestsWithAnError) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64}, /*replays=*/false);
  h.runner().fail_run_call = 2;  // the first decode
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(h.scheduler().Submit(Greedy(4, 5), sink).ok());
  h.scheduler().Start();
  ASSERT_TRUE(sink->Wait(10));
  EXPECT_EQ(sink->reason(), FinishReason::kError);
  EXPECT_EQ(sink->tokens().size(), 1u);  // the prefill's token came out first
  EXPECT_EQ(h.kv().free_blocks(), 64);
}

TEST(SchedulerPolicyTest, AWaitingRequestStopsStepsAhead) {
  // One running request at a time: while the second waits, the first is never run ahead.
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 64, .max_running = 1}, /*replays=*/true);
  h.RunAndExpect({Greedy(4, 6), Greedy(4, 6, 30)});
  const std::vector<StepPlan> plans = h.runner().plans();
  for (size_t i = 0; i < plans.size(); ++i) {
    // Steps of the first request (prompt position 0 is the prefill) while the second waits.
    if (plans[i].batch.sequence[0] == plans[0].batch.sequence[0]) {
      EXPECT_FALSE(plans[i].launch_next) << "step " << i;
    }
  }
}

TEST(SchedulerPolicyTest, APoolTooSmallPreemptsAndKeepsTheTokens) {
  // 12 blocks of 4 tokens; three requests growing to 6 blocks each outgrow it while decoding.
  Harness h(/*num_blocks=*/12, {.max_batch_tokens = 64, .max_running = 3}, /*replays=*/true);
  h.RunAndExpect({Greedy(4, 20), Greedy(4, 20, 11), Greedy(4, 20, 21)});
  EXPECT_GT(h.scheduler().stats().preemptions, 0);
  EXPECT_EQ(h.kv().free_blocks(), 12);
}

// A pool that starts below its largest (memory lent later): a request longer than it is taken,
// and when the pool does not grow for it, ends with an error instead of preempting itself
// forever; the pool's blocks all come back.
TEST(SchedulerPolicyTest, ARequestThePoolNeverGrowsForEndsWithAnError) {
  Harness h(/*num_blocks=*/64, {.max_batch_tokens = 8}, /*replays=*/false,
            /*prefix_caching=*/false, /*initial_blocks=*/4);
  EXPECT_EQ(h.scheduler().max_context_tokens(), 256);
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(h.scheduler().Submit(Greedy(30, 4), sink).ok());  // 8 blocks
  h.scheduler().Start();
  ASSERT_TRUE(sink->Wait(10));
  EXPECT_EQ(sink->reason(), FinishReason::kError);
  EXPECT_TRUE(absl::IsResourceExhausted(sink->status())) << sink->status();
  EXPECT_NE(sink->status().message().find("has not grown for it"), std::string::npos);
  EXPECT_EQ(h.kv().free_blocks(), 4);
}

TEST(SchedulerPolicyTest, ARepeatedPromptStartsAfterItsCachedBlocks) {
  Harness h(/*num_blocks=*/16, {.max_batch_tokens = 64, .max_running = 4}, /*replays=*/true,
            /*prefix_caching=*/true);
  h.scheduler().Start();
  const RequestSpec spec = Greedy(10, 6);
  for (int round = 0; round < 2; ++round) {
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(h.scheduler().Submit(spec, sink).ok());
    ASSERT_TRUE(sink->Wait(10));
    EXPECT_EQ(sink->tokens(), Expected(spec)) << "round " << round;
  }
  EXPECT_EQ(h.runner().violation(), "");
  // The second prompt's first step computes only the tokens after its 2 cached blocks; the
  // first request's output filled its third block (positions 8-11), which is cached too but
  // unused: a prompt leaves its last token to compute.
  const std::vector<StepPlan> plans = h.runner().plans();
  const StepPlan* second = nullptr;
  for (const StepPlan& plan : plans) {
    if (plan.ids.size() > 1 && plan.batch.position[0] > 0) second = &plan;
  }
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->batch.position, (std::vector<int64_t>{8, 9}));
  const Scheduler::Stats stats = h.scheduler().stats();
  EXPECT_EQ(stats.prefix_queried_tokens, 20);
  EXPECT_EQ(stats.prefix_hit_tokens, 8);
  EXPECT_EQ(h.kv().free_blocks(), 16);
}

// Preempted sequences release shared and registered blocks; a tight pool evicts them again.
TEST(SchedulerPolicyTest, PreemptionWithPrefixCachingKeepsTheTokensAndTheBlocks) {
  Harness h(/*num_blocks=*/12, {.max_batch_tokens = 64, .max_running = 3}, /*replays=*/true,
            /*prefix_caching=*/true);
  h.RunAndExpect({Greedy(4, 20), Greedy(4, 20, 11), Greedy(4, 20, 21)});
  EXPECT_GT(h.scheduler().stats().preemptions, 0);
  EXPECT_EQ(h.kv().free_blocks(), 12);
}

// A grammar that lets every token through and is complete after three.
class CompleteAfterThree : public CompiledConstraint {
 public:
  std::unique_ptr<TokenConstraint> NewConstraint() const override {
    class Counter : public TokenConstraint {
     public:
      void MaskLogits(float*, int64_t) override {}
      bool Accept(int32_t) override { return ++taken_ <= 3; }
      bool terminated() const override { return taken_ >= 3; }

     private:
      int taken_ = 0;
    };
    return std::make_unique<Counter>();
  }
};

// Whether any decode row of the run's plans carried a draft, and whether every row's logits
// came to the host.
std::pair<bool, bool> DraftsAndHostRows(const std::vector<StepPlan>& plans) {
  bool drafts = false, host = true;
  for (const StepPlan& plan : plans) {
    drafts |= plan.logit_rows.size() > 1;
    host &= plan.host_rows.size() == plan.logit_rows.size();
  }
  return {drafts, host};
}

TEST(SchedulerPolicyTest, ConstrainedRowsDrawOnTheHostWithoutDraftsAndEndWithTheirGrammar) {
  SchedulerOptions options{.max_batch_tokens = 64};
  options.speculation.max_draft_tokens = 4;
  RequestSpec spec = Greedy(0, 10);
  // Every token once: prompt lookup finds any last token and drafts what followed it.
  for (int32_t i = 0; i < kVocab; ++i) spec.prompt.push_back(i);
  {
    Harness free(/*num_blocks=*/64, options, /*replays=*/true);
    free.RunAndExpect({spec});
    EXPECT_TRUE(DraftsAndHostRows(free.runner().plans()).first) << "no drafts to leave out";
  }
  Harness h(/*num_blocks=*/64, options, /*replays=*/true);
  spec.constraint = std::make_shared<CompleteAfterThree>();
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(h.scheduler().Submit(spec, sink).ok());
  h.scheduler().Start();
  ASSERT_TRUE(sink->Wait(10));
  // Complete after three tokens: the request ends there, ignore_eos or not.
  EXPECT_EQ(sink->reason(), FinishReason::kStop);
  std::vector<int32_t> expected = Expected(spec);
  expected.resize(3);
  EXPECT_EQ(sink->tokens(), expected);
  const auto [drafts, host] = DraftsAndHostRows(h.runner().plans());
  EXPECT_FALSE(drafts);
  EXPECT_TRUE(host);
  EXPECT_EQ(h.runner().collects(), 0);  // nothing launched ahead of the host's draw
  EXPECT_EQ(h.runner().violation(), "");
}

TEST(SchedulerPolicyTest, ConstrainedRequestsRefuseMinTokens) {
  Harness h(/*num_blocks=*/64, {}, /*replays=*/false);
  RequestSpec spec = Greedy(4, 6);
  spec.sampling.min_tokens = 2;
  spec.constraint = std::make_shared<CompleteAfterThree>();
  EXPECT_EQ(h.scheduler().Submit(spec, std::make_shared<CollectingSink>()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
