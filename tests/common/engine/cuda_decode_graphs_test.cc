// DecodeGraphs on the demo model on one GPU: each replayed decode step against the same step
// run eagerly on twin sequences (same prompts, same tokens), with the expert backend's graph
// hooks played by a fake (FakeGraphSteps) whose version and failures the test sets: capture
// once per batch size and again when the experts change, batches past the largest graph run
// eagerly, failed steps turn the graphs off until the experts change, steps launched ahead of
// the one before, the timing counters, and the calls it refuses. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "common/backend/cuda/device_router.h"
#include "common/cuda/cuda_context.h"
#include "common/engine/decode_graphs.h"
#include "common/engine/model_stack.h"
#include "common/engine/step_runner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo";
constexpr int kMaxRows = 2;  // the largest batch with a graph
constexpr int kContext = 256;

// The expert backend's part in the graphs, for experts that run on the router's stream (the
// stack's CudaExpertBackend): a version the test sets, the calls counted, and a failure
// returned once where the test puts one.
class FakeGraphSteps : public GraphStepExperts {
 public:
  uint64_t version = 1;
  absl::Status fail_begin, fail_await;
  int captures = 0, begun = 0, awaited = 0;

  uint64_t graph_version() const override { return version; }
  absl::Status BeginGraphStep(int64_t) override {
    ++begun;
    return std::exchange(fail_begin, absl::OkStatus());
  }
  absl::Status AwaitGraphStep() override {
    ++awaited;
    return std::exchange(fail_await, absl::OkStatus());
  }
  void SetGraphCapture(bool capturing) override { captures += capturing ? 1 : 0; }
};

// A decode row run both ways: the graphs' sequence and its eager twin, at one position, with
// one token.
struct Row {
  PagedKvCache::SequenceId graphed = 0;
  PagedKvCache::SequenceId eager = 0;
  int64_t position = 0;
  int32_t token = 0;
};

int32_t Argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

class CudaDecodeGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ModelStackOptions options;
    options.device = "cuda";
    options.max_step_tokens = 64;
    options.max_sequences = kMaxRows + 1;  // an eager step one row past the graphs
    options.kv_within_context = false;
    options.kv_blocks = 64;
    auto stack = ModelStack::Create(kModel, options);
    ASSERT_TRUE(stack.ok()) << stack.status();
    stack_ = *std::move(stack);
    ASSERT_NE(stack_->experts(), nullptr);
    ASSERT_NE(stack_->router().device_router(), nullptr);
    forward_ = std::make_unique<ForwardPass>(config(), stack_->router(), *stack_->experts(),
                                             ForwardOptions{});
    graphs_ = std::make_unique<DecodeGraphs>(*forward_, *stack_->router().device_router(),
                                             *stack_->experts(), steps_, stack_->kv(),
                                             DecodeGraphOptions{kContext, kMaxRows});
    std::ifstream in(kModel + "/reference.json");
    for (const auto& p : nlohmann::json::parse(in)["generation"]["prompts"]) {
      prompts_.push_back(p["input_ids"].get<std::vector<int32_t>>());
    }
    ASSERT_GE(prompts_.size(), 2u);
  }

  const ModelConfig& config() const { return stack_->config(); }
  PagedKvCache& kv() { return stack_->kv(); }

  // Prompt `i` prefilled eagerly into two sequences: the row of its first decode step.
  Row Start(size_t i) {
    const std::vector<int32_t>& prompt = prompts_[i];
    const int64_t n = static_cast<int64_t>(prompt.size());
    Row row;
    for (PagedKvCache::SequenceId* seq : {&row.graphed, &row.eager}) {
      *seq = kv().AddSequence();
      EXPECT_TRUE(kv().Reserve(*seq, n).ok());
      BatchLayout batch;
      batch.sequence.assign(n, *seq);
      for (int64_t t = 0; t < n; ++t) batch.position.push_back(t);
      Tensor logits;
      const int64_t last = n - 1;
      EXPECT_TRUE(forward_->Run(prompt, batch, kv(), {&last, 1}, logits).ok());
      row.token = Argmax(logits.row(0), config().vocab_size);
    }
    row.position = n;
    return row;
  }

  // The rows' step as a batch of their graphed (or eager) sequences, positions reserved.
  BatchLayout Batch(const std::vector<Row>& rows, bool graphed) {
    BatchLayout batch;
    for (const Row& r : rows) {
      const PagedKvCache::SequenceId seq = graphed ? r.graphed : r.eager;
      EXPECT_TRUE(kv().Reserve(seq, r.position + 1).ok());
      batch.sequence.push_back(seq);
      batch.position.push_back(r.position);
    }
    return batch;
  }
  static std::vector<int32_t> Tokens(const std::vector<Row>& rows) {
    std::vector<int32_t> ids;
    for (const Row& r : rows) ids.push_back(r.token);
    return ids;
  }
  static std::vector<int64_t> AllRows(size_t n) {
    std::vector<int64_t> rows(n);
    for (size_t i = 0; i < n; ++i) rows[i] = static_cast<int64_t>(i);
    return rows;
  }

  // The rows' step for a StepRunner, on the graphed sequences, every row's logits wanted.
  StepPlan Plan(const std::vector<Row>& rows) {
    StepPlan plan;
    plan.ids = Tokens(rows);
    plan.batch = Batch(rows, true);
    plan.logit_rows = AllRows(rows.size());
    return plan;
  }

  // The rows' step run eagerly on the twins: its logits, [rows, vocab].
  std::vector<float> Eager(const std::vector<Row>& rows) {
    Tensor logits;
    EXPECT_TRUE(
        forward_->Run(Tokens(rows), Batch(rows, false), kv(), AllRows(rows.size()), logits).ok());
    return std::vector<float>(logits.data(), logits.data() + logits.size());
  }

  // The rows' step replayed: its device tokens and logits, [rows, vocab].
  absl::Status Replay(const std::vector<Row>& rows, std::vector<int32_t>& tokens,
                      std::vector<float>& logits) {
    const size_t n = rows.size();
    if (absl::Status s = graphs_->Launch(Tokens(rows), Batch(rows, true)); !s.ok()) return s;
    absl::StatusOr<const int32_t*> picked = graphs_->Wait();
    if (!picked.ok()) return picked.status();
    tokens.assign(*picked, *picked + n);
    absl::StatusOr<const float*> copied = graphs_->Logits(AllRows(n));
    if (!copied.ok()) return copied.status();
    logits.assign(*copied, *copied + n * config().vocab_size);
    return absl::OkStatus();
  }

  // Replays the rows' step and runs it eagerly on the twins; the tokens and logits must agree.
  // Moves each row one position on, with the step's token.
  void StepBothWays(std::vector<Row>& rows) {
    std::vector<int32_t> tokens;
    std::vector<float> logits;
    const absl::Status replayed = Replay(rows, tokens, logits);
    ASSERT_TRUE(replayed.ok()) << replayed;
    const std::vector<float> eager = Eager(rows);
    const int64_t vocab = config().vocab_size;
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* want = eager.data() + i * vocab;
      const float* got = logits.data() + i * vocab;
      EXPECT_EQ(tokens[i], Argmax(want, vocab)) << "row " << i << " at " << rows[i].position;
      // A replay's attention is planned for the graphs' context, an eager step's for its own:
      // the same sums, perhaps in another order.
      float scale = 0.0f, worst = 0.0f;
      for (int64_t v = 0; v < vocab; ++v) {
        scale = std::max(scale, std::abs(want[v]));
        worst = std::max(worst, std::abs(got[v] - want[v]));
      }
      EXPECT_LE(worst, 0.02f * scale) << "row " << i << " at " << rows[i].position;
      rows[i].token = tokens[i];
      ++rows[i].position;
    }
  }

  FakeGraphSteps steps_;
  std::unique_ptr<ModelStack> stack_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<DecodeGraphs> graphs_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(CudaDecodeGraphsTest, ReplaysGiveTheEagerStepsTokensAndLogits) {
  std::vector<Row> rows = {Start(0)};
  EXPECT_TRUE(graphs_->NeedsCapture(1));
  for (int step = 0; step < 3; ++step) StepBothWays(rows);
  // One capture per input slot, then replays only.
  EXPECT_EQ(steps_.captures, 2);
  EXPECT_FALSE(graphs_->NeedsCapture(1));
  EXPECT_TRUE(graphs_->NeedsCapture(2));
  rows.push_back(Start(1));
  for (int step = 0; step < 3; ++step) StepBothWays(rows);
  EXPECT_EQ(steps_.captures, 4);
  EXPECT_EQ(steps_.begun, 6);
  EXPECT_EQ(steps_.awaited, 6);
  EXPECT_EQ(graphs_->timing().replays, 6);
  EXPECT_EQ(graphs_->failures(), 0);
}

TEST_F(CudaDecodeGraphsTest, OnlyStepsWithinTheGraphsFit) {
  const std::vector<Row> rows = {Start(0), Start(1), Start(2)};
  const BatchLayout three = Batch(rows, true);
  EXPECT_FALSE(graphs_->Fits(three, AllRows(3))) << "past the largest graph";
  BatchLayout two = Batch({rows[0], rows[1]}, true);
  EXPECT_TRUE(graphs_->Fits(two, AllRows(2)));
  EXPECT_FALSE(graphs_->Fits(two, std::vector<int64_t>{1, 0})) << "rows out of order";
  EXPECT_FALSE(graphs_->Fits(two, std::vector<int64_t>{0})) << "a row without logits";
  BatchLayout twice = two;
  twice.sequence[1] = twice.sequence[0];
  EXPECT_FALSE(graphs_->Fits(twice, AllRows(2))) << "one sequence twice";
  BatchLayout late = two;
  late.position[0] = kContext;
  EXPECT_FALSE(graphs_->Fits(late, AllRows(2))) << "past the planned context";
  steps_.version = 0;
  EXPECT_FALSE(graphs_->Fits(two, AllRows(2))) << "experts that cannot be captured";
}

TEST_F(CudaDecodeGraphsTest, AStepRunnerRunsBatchesPastTheLargestGraphEagerly) {
  StepRunnerOptions options;
  options.graphs = {kContext, kMaxRows};
  options.replay_or_eager.trials = Tunables::StepTrials::kOff;
  std::unique_ptr<StepRunner> runner =
      CreateStepRunner(config(), stack_->router(), *stack_->experts(), kv(), options);
  std::vector<Row> rows = {Start(0), Start(1), Start(2)};
  auto eager = runner->Run(Plan(rows), [] {});
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_FALSE(eager->replayed);
  for (Row& r : rows) {
    r.token = Argmax(eager->logits(&r - rows.data()), config().vocab_size);
    ++r.position;
  }
  rows.pop_back();
  auto replayed = runner->Run(Plan(rows), [] {});
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(replayed->replayed);
  EXPECT_EQ(runner->stats().steps, 2);
  EXPECT_EQ(runner->stats().graph_steps, 1);
}

TEST_F(CudaDecodeGraphsTest, NewExpertsAreCapturedAgain) {
  std::vector<Row> rows = {Start(0)};
  StepBothWays(rows);
  StepBothWays(rows);
  EXPECT_EQ(steps_.captures, 2);
  steps_.version = 2;  // e.g. a worker registered again
  EXPECT_TRUE(graphs_->NeedsCapture(1));
  StepBothWays(rows);
  EXPECT_EQ(steps_.captures, 4);
  EXPECT_FALSE(graphs_->NeedsCapture(1));
}

TEST_F(CudaDecodeGraphsTest, FailedStepsTurnTheGraphsOffUntilTheExpertsChange) {
  std::vector<Row> rows = {Start(0)};
  StepBothWays(rows);
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  // Before the launch (the workers not started) and after it (the replay ran on released
  // waits): either way nothing is left in flight and the graphs are dropped.
  steps_.fail_begin = absl::UnavailableError("a worker is gone");
  EXPECT_TRUE(absl::IsUnavailable(Replay(rows, tokens, logits)));
  EXPECT_EQ(graphs_->in_flight(), 0);
  EXPECT_EQ(graphs_->failures(), 1);
  EXPECT_TRUE(graphs_->NeedsCapture(1));
  steps_.fail_await = absl::UnavailableError("a worker did not start");
  EXPECT_TRUE(absl::IsUnavailable(Replay(rows, tokens, logits)));
  EXPECT_EQ(graphs_->in_flight(), 0);
  EXPECT_EQ(graphs_->failures(), 2);
  steps_.fail_begin = absl::UnavailableError("a worker is gone");
  EXPECT_FALSE(Replay(rows, tokens, logits).ok());
  EXPECT_EQ(graphs_->failures(), DecodeGraphs::kMaxFailures);
  const BatchLayout batch = Batch(rows, true);
  EXPECT_FALSE(graphs_->Fits(batch, AllRows(1))) << "off after kMaxFailures in a row";
  steps_.version = 2;
  EXPECT_TRUE(graphs_->Fits(batch, AllRows(1))) << "on again for new experts";
  StepBothWays(rows);
  EXPECT_EQ(graphs_->failures(), 0);
}

TEST_F(CudaDecodeGraphsTest, AStepLaunchedAheadTakesTheTokenOfTheOneBefore) {
  std::vector<Row> rows = {Start(0)};
  StepBothWays(rows);
  // Step p with its token, step p + 1 behind it with whatever step p picks on the device.
  Row ahead = rows[0];
  ++ahead.position;
  ahead.token = kTokenOfPreviousStep;
  ASSERT_TRUE(graphs_->Launch(Tokens(rows), Batch(rows, true)).ok());
  ASSERT_TRUE(graphs_->Launch(Tokens({ahead}), Batch({ahead}, true)).ok());
  EXPECT_EQ(graphs_->in_flight(), 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(graphs_->Logits(AllRows(1)).status()));
  auto first = graphs_->Wait();
  ASSERT_TRUE(first.ok()) << first.status();
  const int32_t first_token = **first;
  auto second = graphs_->Wait();
  ASSERT_TRUE(second.ok()) << second.status();
  const int32_t second_token = **second;
  // The same two steps eagerly on the twin.
  const int64_t vocab = config().vocab_size;
  EXPECT_EQ(first_token, Argmax(Eager(rows).data(), vocab));
  rows[0].token = first_token;
  ++rows[0].position;
  EXPECT_EQ(second_token, Argmax(Eager(rows).data(), vocab));
  EXPECT_EQ(graphs_->timing().replays, 3);
  EXPECT_EQ(graphs_->timing().overlapped, 1);
  EXPECT_EQ(graphs_->failures(), 0);
}

TEST_F(CudaDecodeGraphsTest, TimingCountsReplaysAndPairsOnlyReplaysInARow) {
  std::vector<Row> rows = {Start(0)};
  for (int step = 0; step < 3; ++step) StepBothWays(rows);
  DecodeGraphs::Timing t = graphs_->timing();
  EXPECT_EQ(t.replays, 3);
  EXPECT_EQ(t.overlapped, 0);
  EXPECT_GT(t.replay_us, 0.0);
  EXPECT_GT(t.mean_replay_us(), 0.0);
  EXPECT_LE(t.pairs, 2) << "the first replay follows none";
  EXPECT_GE(t.between_us, 0.0);
  // After an eager step the next replay is no pair with the last one.
  const int64_t pairs = t.pairs;
  graphs_->NoteEagerStep();
  StepBothWays(rows);
  t = graphs_->timing();
  EXPECT_EQ(t.replays, 4);
  EXPECT_EQ(t.pairs, pairs);
}

TEST_F(CudaDecodeGraphsTest, RefusesStepsItCannotRun) {
  std::vector<Row> rows = {Start(0)};
  EXPECT_TRUE(absl::IsFailedPrecondition(graphs_->Wait().status())) << "nothing in flight";
  EXPECT_TRUE(absl::IsFailedPrecondition(graphs_->Logits(AllRows(1)).status())) << "no step";
  EXPECT_TRUE(absl::IsInvalidArgument(graphs_->Launch({1, 2}, Batch(rows, true))));
  EXPECT_TRUE(absl::IsInvalidArgument(
      graphs_->Launch(std::vector<int32_t>{kTokenOfPreviousStep}, Batch(rows, true))))
      << "a token of a previous step with none in flight";
  StepBothWays(rows);
  EXPECT_TRUE(absl::IsOutOfRange(graphs_->Logits({1}).status()));
  // Behind a step in flight, only the same rows one position on.
  ASSERT_TRUE(graphs_->Launch(Tokens(rows), Batch(rows, true)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(graphs_->Launch(Tokens(rows), Batch(rows, true))));
  EXPECT_EQ(graphs_->in_flight(), 0) << "the step in flight fails with it";
}

}  // namespace
}  // namespace strata
