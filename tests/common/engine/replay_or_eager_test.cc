#include "common/engine/replay_or_eager.h"

#include <chrono>

#include "gtest/gtest.h"

namespace strata {
namespace {

using Clock = ReplayOrEager::Clock;

// Decode steps of `tokens` tokens back to back, each taking the given time by the way it runs
// and missing `missed_per_step` bytes of experts. Returns the steps run eagerly.
struct Steps {
  ReplayOrEager& chooser;
  Clock::time_point now = Clock::time_point() + std::chrono::hours(1);
  uint64_t missed = 0;

  int Run(int steps, double replay_ms, double eager_ms, uint64_t missed_per_step,
          int64_t tokens = 1) {
    int eager = 0;
    for (int i = 0; i < steps; ++i) {
      const bool replay = chooser.Replay(tokens, [&] { return missed; });
      missed += missed_per_step;
      eager += replay ? 0 : 1;
      now += std::chrono::microseconds(static_cast<int64_t>((replay ? replay_ms : eager_ms) * 1e3));
      chooser.Ended(true, tokens, replay, now);
    }
    return eager;
  }
};

// 60 MB a step over the host link: about 1.1 ms at 55 GB/s, well over a tenth of 10 ms.
constexpr uint64_t kManyHostReads = 60'000'000;

TEST(ReplayOrEagerTest, EagerStepsTakeOverWhereTheyAreFaster) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  steps.Run(40, 10.0, 6.0, kManyHostReads);  // the first trial comes after 32 steps
  EXPECT_EQ(chooser.counts().trials, 1);
  EXPECT_EQ(chooser.counts().switches, 1);
  EXPECT_TRUE(chooser.counts().eager);
  // From then on every step is eager while the misses last.
  EXPECT_EQ(steps.Run(1000, 10.0, 6.0, kManyHostReads), 1000);
  EXPECT_TRUE(chooser.counts().eager);
  EXPECT_EQ(chooser.counts().switches, 1);
}

TEST(ReplayOrEagerTest, ReplaysComeBackWhenTheMissesGo) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  steps.Run(100, 10.0, 6.0, kManyHostReads);
  ASSERT_TRUE(chooser.counts().eager);
  // 100 KB a step: eager steps would still be faster (their time is kept), but the reason for
  // them is gone: back to replays at the next look, 32 steps on.
  EXPECT_LE(steps.Run(200, 10.0, 6.0, 100'000), 32);
  EXPECT_FALSE(chooser.counts().eager);
  EXPECT_EQ(chooser.counts().switches, 2);
}

TEST(ReplayOrEagerTest, EachBatchSizeChoosesItsOwnWay) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  int eager_ones = 0, eager_fours = 0;
  for (int i = 0; i < 10; ++i) {
    eager_ones += steps.Run(100, 10.0, 6.0, kManyHostReads, 1);   // eager faster
    eager_fours += steps.Run(100, 6.0, 10.0, kManyHostReads, 4);  // replays faster
  }
  EXPECT_GT(eager_ones, 900);
  EXPECT_LT(eager_fours, 100);
  EXPECT_TRUE(chooser.counts().eager);
}

TEST(ReplayOrEagerTest, FasterReplaysAreTriedLessAndLessOften) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  const int eager = steps.Run(20000, 6.0, 10.0, kManyHostReads);
  EXPECT_FALSE(chooser.counts().eager);
  EXPECT_EQ(chooser.counts().switches, 0);
  // Trials after 32, 64, ..., 4096 replays, then every 4096: starting at steps 32, 101, 234,
  // ..., 16394 (10 in 20,000 steps), 5 steps each.
  EXPECT_EQ(chooser.counts().trials, 10);
  EXPECT_EQ(eager, 10 * 5);
}

TEST(ReplayOrEagerTest, EagerStepsAreNotTriedWhereReplaysMissLittle) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  // 1 MB a step: 18 us of a 10 ms step, below a tenth, though eager steps would be faster.
  EXPECT_EQ(steps.Run(5000, 10.0, 6.0, 1'000'000), 0);
  EXPECT_EQ(chooser.counts().trials, 0);
  // Unless told to try them whatever the misses: taken after 37 steps, left at the next look
  // (the misses gave no reason for them).
  ReplayOrEager always({.trials = Tunables::StepTrials::kAlways});
  Steps forced{always};
  EXPECT_EQ(forced.Run(100, 10.0, 6.0, 0), 5 + 32);
  EXPECT_EQ(always.counts().trials, 1);
  EXPECT_EQ(always.counts().switches, 2);
}

TEST(ReplayOrEagerTest, AChangeOfTokenCountStartsTheTimingAgain) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  // The batch changes every 3 steps: too few steps of one size to time, so no trial.
  for (int i = 0; i < 200; ++i) steps.Run(3, 10.0, 6.0, kManyHostReads, 1 + i % 2);
  EXPECT_EQ(chooser.counts().trials, 0);
  // A step that does not fit a graph (a prefill) breaks the timing too: the step after it is
  // not timed against it.
  steps.Run(40, 10.0, 6.0, kManyHostReads, 4);
  EXPECT_EQ(chooser.counts().trials, 1);
}

TEST(ReplayOrEagerTest, TheFirstStepAfterAChangeIsNotTimed) {
  ReplayOrEager chooser({});
  Steps steps{chooser};
  steps.Run(31, 10.0, 6.0, kManyHostReads);
  // The trial's first eager step pays for the change (e.g. the workers' first eager layer):
  // left out, the rest are faster.
  ASSERT_FALSE(chooser.Replay(1, [&] { return steps.missed; }));
  steps.now += std::chrono::milliseconds(50);
  chooser.Ended(true, 1, false, steps.now);
  steps.Run(4, 10.0, 6.0, kManyHostReads);
  EXPECT_TRUE(chooser.counts().eager);
}

TEST(ReplayOrEagerTest, TheMissesAreAskedOnlyAtALook) {
  ReplayOrEager chooser({});
  int asked = 0;
  auto now = Clock::time_point() + std::chrono::hours(1);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(chooser.Replay(1, [&] {
      ++asked;
      return uint64_t{0};
    }));
    now += std::chrono::milliseconds(10);
    chooser.Ended(true, 1, true, now);
  }
  // Once when the batch size is first seen, then every 32 steps: not once a step.
  EXPECT_EQ(asked, 1 + 1000 / 32);
}

TEST(ReplayOrEagerTest, OffAlwaysReplays) {
  ReplayOrEager chooser({.trials = Tunables::StepTrials::kOff});
  Steps steps{chooser};
  EXPECT_EQ(steps.Run(1000, 10.0, 1.0, kManyHostReads), 0);
  EXPECT_EQ(chooser.counts().trials, 0);
}

}  // namespace
}  // namespace strata
