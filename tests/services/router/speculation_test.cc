// Prompt lookup drafts, the draft length's adaptation and the control that turns drafting off.
#include "services/router/speculation.h"

#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

TEST(NgramDraftTest, CopiesWhatFollowedTheLongestSuffixFound) {
  // "7 8 9" occurred before, followed by 1 2 3 4.
  const Ids tokens = {5, 7, 8, 9, 1, 2, 3, 4, 6, 7, 8, 9};
  EXPECT_EQ(NgramDraft(tokens, 1, 3, 4), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(NgramDraft(tokens, 1, 3, 2), (Ids{1, 2}));
  // Only the last token matches ("9" alone): the same continuation.
  const Ids shorter = {9, 1, 2, 6, 9};
  EXPECT_EQ(NgramDraft(shorter, 1, 3, 3), (Ids{1, 2, 6}));
  // The longest n wins over a later match of a shorter one.
  const Ids longest = {1, 2, 3, 10, 11, 0, 2, 3, 20, 1, 2, 3};
  EXPECT_EQ(NgramDraft(longest, 1, 3, 2), (Ids{10, 11}));
  EXPECT_TRUE(NgramDraft(Ids{1, 2, 3, 4}, 1, 3, 4).empty());  // nothing repeats
  EXPECT_TRUE(NgramDraft(tokens, 1, 3, 0).empty());
  EXPECT_TRUE(NgramDraft(Ids{}, 1, 3, 4).empty());
  EXPECT_TRUE(NgramDraft(Ids{5}, 1, 3, 4).empty());
}

TEST(NgramDraftTest, ARepeatingRunDraftsInFull) {
  // The latest occurrence of "4 4 4" is followed by one token; an earlier one by four.
  const Ids run = {1, 4, 4, 4, 4, 4, 4, 4, 4};
  EXPECT_EQ(NgramDraft(run, 1, 3, 4), (Ids{4, 4, 4, 4}));
  const Ids period = {1, 2, 1, 2, 1, 2, 1, 2};
  EXPECT_EQ(NgramDraft(period, 1, 3, 4), (Ids{1, 2, 1, 2}));
}

TEST(DraftLengthTest, GrowsOnFullAcceptanceAndHalvesOnNone) {
  EXPECT_EQ(NextDraftLength(2, 2, 2, 4), 3);
  EXPECT_EQ(NextDraftLength(4, 4, 4, 4), 4);
  EXPECT_EQ(NextDraftLength(4, 4, 0, 4), 2);
  EXPECT_EQ(NextDraftLength(1, 1, 0, 4), 1);
  EXPECT_EQ(NextDraftLength(3, 3, 1, 4), 3);
  EXPECT_EQ(NextDraftLength(3, 0, 0, 4), 3);  // nothing drafted: unchanged
}

TEST(SpeculationControlTest, TurnsOffWhenSlowerWithGrowingPauses) {
  SpeculationControl control({.max_draft_tokens = 4, .probe_interval = 8});
  EXPECT_TRUE(control.active());
  // Plain steps give 100 tokens a second, drafted ones 50.
  auto run_until_off = [&] {
    int steps = 0;
    while (control.active() && steps < 1000) {
      const bool draft = control.DraftThisStep();
      control.RecordStep(draft, draft ? 0.02 : 0.01, 1);
      ++steps;
    }
    return steps;
  };
  run_until_off();
  EXPECT_FALSE(control.active());
  EXPECT_EQ(control.times_turned_off(), 1);
  int off = 0;
  while (!control.active()) {
    control.DraftThisStep();
    ++off;
  }
  EXPECT_EQ(off, 8);
  run_until_off();
  off = 0;
  while (!control.active()) {
    control.DraftThisStep();
    ++off;
  }
  EXPECT_EQ(off, 16);  // twice as long the second time in a row
}

TEST(SpeculationControlTest, StaysOnWhenDraftsPay) {
  SpeculationControl control({.max_draft_tokens = 4, .probe_interval = 8});
  int drafted = 0;
  for (int i = 0; i < 200; ++i) {
    const bool draft = control.DraftThisStep();
    drafted += draft;
    control.RecordStep(draft, 0.01, draft ? 3 : 1);
  }
  EXPECT_TRUE(control.active());
  EXPECT_EQ(control.times_turned_off(), 0);
  EXPECT_GT(drafted, 150);  // all but the probe steps
  SpeculationControl off({});
  EXPECT_FALSE(off.DraftThisStep());
  EXPECT_FALSE(off.active());
}

}  // namespace
}  // namespace strata
