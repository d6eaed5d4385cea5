#include "common/util/flag_help.h"

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, max_new_tokens, 16, "Tokens to generate");
ABSL_FLAG(bool, stream, false, "Print as it arrives");
ABSL_FLAG(std::string, stop, "", "A stop string");

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FlagHelpTest, DocsUseDashedNamesAndDefaults) {
  const std::string help = FormatFlagDocs(DocsOfFlags({"max_new_tokens", "stream", "no-such"}));
  EXPECT_EQ(help,
            "  --max-new-tokens  Tokens to generate (default 16)\n"
            "  --stream  Print as it arrives (default false)\n");
  // Every flag this file defines, by name.
  const std::vector<FlagDoc> own = DocsOfFlagsIn(__FILE__);
  ASSERT_EQ(own.size(), 3u);
  EXPECT_EQ(own[0].name, "max-new-tokens");
  EXPECT_EQ(own[1].name, "stop");
  EXPECT_EQ(own[1].default_value, "\"\"");
}

TEST(FlagHelpTest, UnknownFlagNamesTheNearest) {
  const absl::Status status = CheckFlagsKnown({"strata", "generate", "--max-new-token=3"},
                                              {"max-new-tokens", "stream"}, "strata generate");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("unknown flag --max-new-token; did you mean "
                                          "--max-new-tokens?"));
  EXPECT_THAT(status.message(), HasSubstr("`strata generate --help`"));
  EXPECT_THAT(std::string(CheckFlagsKnown({"x", "--zzzzzzzz"}, {"stream"}, "x").message()),
              ::testing::Not(HasSubstr("did you mean")));
  // Known ones, dashed or not, switches negated, and anything after "--".
  EXPECT_TRUE(
      CheckFlagsKnown({"x", "--max_new_tokens", "4", "--nostream", "--", "--bogus"}, {}, "x").ok());
  EXPECT_EQ(NearestFlagHint("workes", {"workers", "threads"}), "; did you mean --workers?");
}

TEST(FlagHelpTest, RepeatedFlagKeepsEveryValueInOrder) {
  std::vector<std::string> args = {"strata",    "generate", "--stop", ", the", "--max-new-tokens=4",
                                   "--stop=\n", "--ids",    "1"};
  auto stops = TakeRepeatedFlag(args, "stop");
  ASSERT_TRUE(stops.ok()) << stops.status();
  EXPECT_THAT(*stops, ElementsAre(", the", "\n"));
  EXPECT_THAT(args, ElementsAre("strata", "generate", "--max-new-tokens=4", "--ids", "1"));
  std::vector<std::string> dangling = {"strata", "--stop"};
  EXPECT_FALSE(TakeRepeatedFlag(dangling, "stop").ok());
}

TEST(FlagHelpTest, AsksForHelp) {
  EXPECT_TRUE(AsksForHelp({"strata", "generate", "--help"}));
  EXPECT_TRUE(AsksForHelp({"strata-router", "-h"}));
  EXPECT_FALSE(AsksForHelp({"strata", "generate", "--", "--help"}));
  EXPECT_FALSE(AsksForHelp({"strata", "generate", "--prompt", "x"}));
}

}  // namespace
}  // namespace strata
