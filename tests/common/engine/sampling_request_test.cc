#include "common/engine/sampling_request.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// The parameter a refusal names, as the OpenAI API reports it.
std::string ParamOf(const absl::Status& status) {
  const auto param = status.GetPayload(kInvalidParamPayload);
  return param ? std::string(*param) : "";
}

TEST(NormalizeSamplingTest, DefaultsDependOnlyOnTheFrontEndsTemperature) {
  auto grpc = NormalizeSampling({.seed = 3}, 1000, 0.0);
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  EXPECT_EQ(grpc->temperature, 0.0f);
  EXPECT_EQ(grpc->top_p, 1.0f);
  EXPECT_EQ(grpc->top_k, 0);
  EXPECT_EQ(grpc->seed, 3u);
  auto openai = NormalizeSampling({.seed = 3}, 1000, 1.0);
  ASSERT_TRUE(openai.ok());
  EXPECT_EQ(openai->temperature, 1.0f);
}

TEST(NormalizeSamplingTest, TopKAtOrAboveTheVocabularyOrMinusOneIsNoLimit) {
  for (int64_t k : {-1, 0, 1000, 5000}) {
    auto p = NormalizeSampling({.top_k = k}, 1000, 1.0);
    ASSERT_TRUE(p.ok()) << k;
    EXPECT_EQ(p->top_k, 0) << k;
  }
  EXPECT_EQ(NormalizeSampling({.top_k = 40}, 1000, 1.0)->top_k, 40);
  const absl::Status bad = NormalizeSampling({.top_k = -2}, 1000, 1.0).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParamOf(bad), "top_k");
}

TEST(NormalizeSamplingTest, AnySeedGivenRepeatsAndNoneDrawsAFreshOne) {
  EXPECT_EQ(NormalizeSampling({.temperature = 1.0, .seed = 0}, 1000, 0.0)->seed, 0u);
  EXPECT_EQ(NormalizeSampling({.seed = ~uint64_t{0}}, 1000, 0.0)->seed, ~uint64_t{0});
  // Without a seed, two requests draw differently (2^-64 to fail by chance).
  EXPECT_NE(NormalizeSampling({.temperature = 1.0}, 1000, 0.0)->seed,
            NormalizeSampling({.temperature = 1.0}, 1000, 0.0)->seed);
}

TEST(NormalizeSamplingTest, OutOfRangeValuesNameTheirParameter) {
  struct Case {
    SamplingRequest request;
    const char* param;
    const char* words;
  };
  const Case cases[] = {{{.temperature = -0.1}, "temperature", "[0, 2]"},
                        {{.temperature = 2.5}, "temperature", "[0, 2]"},
                        {{.temperature = std::nan("")}, "temperature", "[0, 2]"},
                        {{.top_p = 0.0}, "top_p", "(0, 1]"},
                        {{.top_p = 1.01}, "top_p", "(0, 1]"}};
  for (const Case& c : cases) {
    const absl::Status s = NormalizeSampling(c.request, 1000, 1.0).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.param;
    EXPECT_EQ(ParamOf(s), c.param);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.words));
  }
  auto edge = NormalizeSampling({.temperature = 2.0, .top_p = 1.0}, 1000, 0.0);
  ASSERT_TRUE(edge.ok());
  EXPECT_EQ(edge->temperature, 2.0f);
}

}  // namespace
}  // namespace strata
