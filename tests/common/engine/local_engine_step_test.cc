// LocalEngine::RunStep: steps a caller plans itself give the logits of one whole pass.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/engine/local_engine.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(LocalEngineStepTest, StepsAfterAPrefixGiveTheLogitsOfOnePass) {
  LocalEngineOptions options;
  options.model_dir =
      (std::filesystem::path(STRATA_TEST_DATA_DIR) / "oracles" / "qwen3_moe").string();
  options.num_threads = 1;
  auto engine = LocalEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> ids = {3, 17, 5, 42, 8, 11, 2, 29};
  auto whole = (*engine)->Logits(ids);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const int64_t vocab = (*engine)->config().vocab_size;

  const auto seq = (*engine)->AddSequence();
  ASSERT_TRUE((*engine)->RunStep(seq, absl::MakeConstSpan(ids).first(5), 0).ok());
  // A verify-shaped step: the last three tokens at once, every row's logits.
  auto step = (*engine)->RunStep(seq, absl::MakeConstSpan(ids).subspan(5), 5);
  ASSERT_TRUE(step.ok()) << step.status();
  for (int64_t r = 0; r < 3; ++r) {
    double diff = 0, norm = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double ref = whole->row(5 + r)[v];
      diff += (step->logits(r)[v] - ref) * (step->logits(r)[v] - ref);
      norm += ref * ref;
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "row " << r;
  }
  // The same positions again (a rejected draft's keys are simply written over).
  EXPECT_TRUE((*engine)->RunStep(seq, absl::MakeConstSpan(ids).subspan(5), 5).ok());
  EXPECT_FALSE((*engine)->RunStep(seq, {}, 8).ok());
  (*engine)->ReleaseSequence(seq);
}

}  // namespace
}  // namespace strata
