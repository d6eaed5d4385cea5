#include "common/util/tunables.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<Tunables> ParseFrom(const std::map<std::string, std::string>& env) {
  return ParseTunables([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(TunablesTest, UnsetVariablesGiveTheDefaults) {
  auto t = ParseFrom({});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, Tunables());
  EXPECT_TRUE(t->tensor_core_experts);
  EXPECT_EQ(DescribeTunables(*t), "defaults");
}

TEST(TunablesTest, EveryVariableIsRead) {
  auto t = ParseFrom({{"STRATA_MMA_EXPERTS", "0"},
                      {"STRATA_FLAG_WAIT", "memop"},
                      {"STRATA_SIGNAL_SCOPE", "system"},
                      {"STRATA_GPU_CLOCK_STAMPS", "/tmp/stamps"},
                      {"STRATA_STEP_TRIALS", "always"},
                      {"STRATA_FP8_GEMM", "tensor-cores"},
                      {"STRATA_NUCLEUS", "draw-first"}});
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->tensor_core_experts);
  EXPECT_TRUE(t->fp8_tensor_core_gemm);
  EXPECT_TRUE(t->nucleus_draw_first);
  EXPECT_EQ(t->step_trials, Tunables::StepTrials::kAlways);
  EXPECT_TRUE(t->flag_wait_memop);
  EXPECT_TRUE(t->system_scope_signals);
  EXPECT_EQ(t->gpu_clock_stamps, "/tmp/stamps");
  EXPECT_EQ(DescribeTunables(*t),
            "STRATA_MMA_EXPERTS=0 STRATA_FLAG_WAIT=memop STRATA_SIGNAL_SCOPE=system "
            "STRATA_GPU_CLOCK_STAMPS=/tmp/stamps STRATA_STEP_TRIALS=always "
            "STRATA_FP8_GEMM=tensor-cores STRATA_NUCLEUS=draw-first");
  EXPECT_EQ(DescribeTunables(*ParseFrom({{"STRATA_STEP_TRIALS", "off"}})),
            "STRATA_STEP_TRIALS=off");
}

TEST(TunablesTest, TheDefaultsSpelledOutAreAccepted) {
  auto t = ParseFrom({{"STRATA_MMA_EXPERTS", "1"},
                      {"STRATA_FLAG_WAIT", "poll"},
                      {"STRATA_SIGNAL_SCOPE", "device"},
                      {"STRATA_GPU_CLOCK_STAMPS", ""},
                      {"STRATA_STEP_TRIALS", "auto"},
                      {"STRATA_FP8_GEMM", "dequantize"},
                      {"STRATA_NUCLEUS", "radix"}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, Tunables());
}

TEST(TunablesTest, ABadValueNamesTheVariableAndWhatItTakes) {
  auto t = ParseFrom({{"STRATA_FLAG_WAIT", "spin"}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("STRATA_FLAG_WAIT=\"spin\""));
  EXPECT_THAT(t.status().message(), HasSubstr("memop or poll"));
  EXPECT_FALSE(ParseFrom({{"STRATA_MMA_EXPERTS", "off"}}).ok());
  EXPECT_THAT(ParseFrom({{"STRATA_STEP_TRIALS", "on"}}).status().message(),
              HasSubstr("off, auto or always"));
}

TEST(TunablesTest, TestsCanReplaceTheProcessTunables) {
  const Tunables saved = GetTunables();
  Tunables changed;
  changed.tensor_core_experts = false;
  SetTunablesForTest(changed);
  EXPECT_FALSE(GetTunables().tensor_core_experts);
  SetTunablesForTest(saved);
  EXPECT_EQ(GetTunables(), saved);
}

}  // namespace
}  // namespace strata
