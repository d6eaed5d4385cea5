// The KV pool and the workers' expert slots as one budget: the pool grows only by memory a
// worker reports freed, and shrinks before a worker is asked to take memory back.
#include "services/router/kv_lending.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

// A block is 1 MiB, a slot 3 MiB: a lent slot is three blocks.
constexpr uint64_t kMiB = 1 << 20;
KvLendingOptions Options() {
  return {.top_ratio = 0.35f,
          .base_blocks = 100,
          .max_blocks = 1000,
          .block_bytes = kMiB,
          .retry_steps = 2};
}

TEST(KvLendingTest, LendsAsTheRatioFallsAndGrowsOnlyByWhatWasFreed) {
  KvLending lending(Options());
  std::vector<LendingWorker> workers = {
      {.shares = true, .owned = 100, .slot_bytes = 3 * kMiB, .lent = 0},
      {.shares = false, .owned = 100, .slot_bytes = 3 * kMiB, .lent = 0}};  // another GPU
  EXPECT_FALSE(lending.Step(0.35f, workers, 100).has_value());
  EXPECT_EQ(lending.asks()[0], 0u);

  // Long contexts: 0.15 x 100 experts asked of worker 0; nothing of worker 1. The pool waits for
  // the worker's report.
  EXPECT_FALSE(lending.Step(0.20f, workers, 100).has_value());
  EXPECT_EQ(lending.asks()[0], 15u);
  EXPECT_EQ(lending.asks()[1], 0u);
  workers[0].lent = 15;
  const std::optional<int> grow = lending.Step(0.20f, workers, 100);
  ASSERT_TRUE(grow.has_value());
  EXPECT_EQ(*grow, 100 + 45);
  // One resize at a time.
  EXPECT_FALSE(lending.Step(0.20f, workers, 100).has_value());
  lending.ResizeDone(true);
  EXPECT_FALSE(lending.Step(0.20f, workers, 145).has_value());
  EXPECT_EQ(lending.borrowed_blocks(), 45);

  // A worker that could lend only part: the pool takes only that.
  workers[0].lent = 10;
  const std::optional<int> less = lending.Step(0.20f, workers, 145);
  ASSERT_TRUE(less.has_value());
  EXPECT_EQ(*less, 130);
  lending.ResizeDone(true);
}

TEST(KvLendingTest, ThePoolShrinksBeforeTheWorkerTakesMemoryBack) {
  KvLending lending(Options());
  std::vector<LendingWorker> workers = {
      {.shares = true, .owned = 100, .slot_bytes = 3 * kMiB, .lent = 15}};
  lending.Step(0.20f, workers, 145);  // asks 15, as lent
  ASSERT_EQ(lending.asks()[0], 15u);

  // Short contexts again: the ask stays until the pool has given the blocks back.
  const std::optional<int> shrink = lending.Step(0.35f, workers, 145);
  ASSERT_TRUE(shrink.has_value());
  EXPECT_EQ(*shrink, 100);
  EXPECT_EQ(lending.asks()[0], 15u);
  // Its blocks are in use: tried again after retry_steps.
  lending.ResizeDone(false);
  EXPECT_FALSE(lending.Step(0.35f, workers, 145).has_value());
  EXPECT_FALSE(lending.Step(0.35f, workers, 145).has_value());
  EXPECT_EQ(lending.asks()[0], 15u);
  ASSERT_TRUE(lending.Step(0.35f, workers, 145).has_value());
  lending.ResizeDone(true);
  // Shrunk: now the worker may take its slots back.
  EXPECT_FALSE(lending.Step(0.35f, workers, 100).has_value());
  EXPECT_EQ(lending.asks()[0], 0u);
  workers[0].lent = 0;
  EXPECT_FALSE(lending.Step(0.35f, workers, 100).has_value());
}

TEST(KvLendingTest, APoolAtItsLargestTakesNoMore) {
  KvLendingOptions options = Options();
  options.max_blocks = 120;
  KvLending lending(options);
  std::vector<LendingWorker> workers = {
      {.shares = true, .owned = 100, .slot_bytes = 3 * kMiB, .lent = 15}};
  EXPECT_EQ(lending.Step(0.20f, workers, 100).value_or(-1), 120);
  lending.ResizeDone(true);
  EXPECT_FALSE(lending.Step(0.20f, workers, 120).has_value());
}

TEST(KvLendingTest, AWorkerYetToAnswerLendsNothing) {
  KvLending lending(Options());
  std::vector<LendingWorker> workers = {{.shares = true, .owned = 100, .slot_bytes = 0}};
  EXPECT_FALSE(lending.Step(0.0f, workers, 100).has_value());
  EXPECT_EQ(lending.asks()[0], 0u);
}

}  // namespace
}  // namespace strata
