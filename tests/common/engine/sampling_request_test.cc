#include "common/engine/sampling_request.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

TEST(NormalizeSamplingTest, PenaltiesBiasAndStopsCarryOver) {
  SamplingRequest r;
  r.min_p = 0.1;
  r.repetition_penalty = 1.3;
  r.presence_penalty = -0.5;
  r.frequency_penalty = 2.0;
  r.logit_bias = {{7, 3.0}, {2, -100.0}, {7, 5.0}, {4, 0.0}};  // 7 twice: the last; 0 dropped
  r.min_tokens = 4;
  r.stop_token_ids = {9, 3, 9};
  r.include_stop_str_in_output = true;
  r.skip_special_tokens = false;
  auto p = NormalizeSampling(r, 1000, 0.0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->min_p, 0.1f);
  EXPECT_FLOAT_EQ(p->repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(p->presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p->frequency_penalty, 2.0f);
  EXPECT_EQ(p->logit_bias, (std::vector<std::pair<int32_t, float>>{{2, -100.0f}, {7, 5.0f}}));
  EXPECT_EQ(p->min_tokens, 4);
  EXPECT_EQ(p->stop_token_ids, (std::vector<int32_t>{3, 9}));
  EXPECT_TRUE(p->include_stop_str_in_output);
  EXPECT_FALSE(p->skip_special_tokens);
  // Absent: every one off.
  auto off = NormalizeSampling({}, 1000, 0.0);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->min_p, 0.0f);
  EXPECT_EQ(off->repetition_penalty, 1.0f);
  EXPECT_EQ(off->presence_penalty, 0.0f);
  EXPECT_EQ(off->frequency_penalty, 0.0f);
  EXPECT_TRUE(off->logit_bias.empty());
  EXPECT_EQ(off->min_tokens, 0);
  EXPECT_TRUE(off->stop_token_ids.empty());
  EXPECT_FALSE(off->include_stop_str_in_output);
  EXPECT_TRUE(off->skip_special_tokens);
}

TEST(NormalizeSamplingTest, OutOfRangeNewParametersNameThemselves) {
  struct Case {
    SamplingRequest request;
    const char* param;
    const char* words;
  };
  std::vector<Case> cases;
  auto add = [&](auto set, const char* param, const char* words) {
    SamplingRequest r;
    set(r);
    cases.push_back({r, param, words});
  };
  add([](SamplingRequest& r) { r.min_p = -0.01; }, "min_p", "[0, 1]");
  add([](SamplingRequest& r) { r.min_p = 1.5; }, "min_p", "[0, 1]");
  add([](SamplingRequest& r) { r.repetition_penalty = 0.0; }, "repetition_penalty", "above 0");
  add([](SamplingRequest& r) { r.repetition_penalty = -1.0; }, "repetition_penalty", "above 0");
  add([](SamplingRequest& r) { r.repetition_penalty = std::nan(""); }, "repetition_penalty",
      "above 0");
  add([](SamplingRequest& r) { r.presence_penalty = 2.5; }, "presence_penalty", "[-2, 2]");
  add([](SamplingRequest& r) { r.frequency_penalty = -3.0; }, "frequency_penalty", "[-2, 2]");
  add([](SamplingRequest& r) { r.logit_bias = {{5, 100.5}}; }, "logit_bias", "[-100, 100]");
  add([](SamplingRequest& r) { r.logit_bias = {{5, -101.0}}; }, "logit_bias", "[-100, 100]");
  add([](SamplingRequest& r) { r.logit_bias = {{-1, 1.0}}; }, "logit_bias", "token ids");
  add([](SamplingRequest& r) { r.logit_bias = {{1000, 1.0}}; }, "logit_bias", "vocabulary");
  add([](SamplingRequest& r) { r.min_tokens = -1; }, "min_tokens", "at least 0");
  add([](SamplingRequest& r) { r.stop_token_ids = {1, 1000}; }, "stop_token_ids", "vocabulary");
  add([](SamplingRequest& r) { r.stop_token_ids = {-3}; }, "stop_token_ids", "token ids");
  for (const Case& c : cases) {
    const absl::Status s = NormalizeSampling(c.request, 1000, 1.0).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.param;
    EXPECT_EQ(ParamOf(s), c.param) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.words)) << c.param;
  }
  // The model-free rules refuse before any vocabulary is known; the vocabulary ones then.
  SamplingRequest big;
  big.logit_bias = {{1000, 1.0}};
  EXPECT_TRUE(CheckSampling(big, 1.0).ok());
  SamplingRequest edge;
  edge.min_p = 1.0;
  edge.repetition_penalty = 1e-3;
  edge.presence_penalty = -2.0;
  edge.frequency_penalty = 2.0;
  edge.logit_bias = {{0, -100.0}, {999, 100.0}};
  edge.stop_token_ids = {0, 999};
  EXPECT_TRUE(NormalizeSampling(edge, 1000, 1.0).ok());
}

}  // namespace
}  // namespace strata
