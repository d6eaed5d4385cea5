// Log-probabilities through a real cluster on models/strata-demo: gRPC Generate's logprobs,
// prompt_logprobs and top_logprobs against the Score RPC on the same tokens, the OpenAI API's
// echoed prompt against Score too, and the bounds refused by name.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/demo_cluster_test.h"
#include "tests/testing/http_post.h"

namespace strata {
namespace {

using Json = nlohmann::json;

constexpr char kPrompt[] = "In the beginning God created the heaven";
// Decode rows and a scored prompt's rows are computed in other batches.
constexpr double kTolerance = 2e-3;

class LogprobsTest : public ::strata::testing::DemoClusterTest {
 protected:
  static std::vector<uint32_t> Tokenize(const std::string& text) {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text(text);
    request.set_add_special_tokens(true);
    v1::TokenizeResponse response;
    EXPECT_TRUE(stub_->Tokenize(&context, request, &response).ok());
    return {response.token_ids().begin(), response.token_ids().end()};
  }

  static grpc::Status Score(const std::vector<uint32_t>& ids, uint32_t top,
                            v1::ScoreResponse& response) {
    grpc::ClientContext context;
    v1::ScoreRequest request;
    for (uint32_t id : ids) request.add_token_ids(id);
    request.set_top_logprobs(top);
    return stub_->Score(&context, request, &response);
  }

  // A streamed Generate's messages, and its final status.
  static grpc::Status Generate(const v1::GenerateRequest& request,
                               std::vector<v1::GenerateResponse>& messages) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) messages.push_back(response);
    return reader->Finish();
  }
};

// Both entries' values, and their alternatives' (ids where no near-tie could swap them).
void ExpectSame(const v1::TokenLogprobs& got, const v1::TokenLogprobs& want,
                const std::string& where) {
  EXPECT_EQ(got.token_id(), want.token_id()) << where;
  EXPECT_NEAR(got.logprob(), want.logprob(), kTolerance) << where;
  ASSERT_EQ(got.top_logprobs_size(), want.top_logprobs_size()) << where;
  for (int k = 0; k < want.top_logprobs_size(); ++k) {
    EXPECT_NEAR(got.top_logprobs(k).logprob(), want.top_logprobs(k).logprob(), kTolerance)
        << where << " alternative " << k;
    const bool apart =
        (k == 0 || want.top_logprobs(k - 1).logprob() - want.top_logprobs(k).logprob() > 0.01) &&
        (k + 1 == want.top_logprobs_size() ||
         want.top_logprobs(k).logprob() - want.top_logprobs(k + 1).logprob() > 0.01);
    if (apart) {
      EXPECT_EQ(got.top_logprobs(k).token_id(), want.top_logprobs(k).token_id())
          << where << " alternative " << k;
    }
    if (k > 0) {
      EXPECT_GE(got.top_logprobs(k - 1).logprob(), got.top_logprobs(k).logprob()) << where;
    }
  }
}

// Generate's log-probabilities of the prompt and of its greedy tokens, with 5 alternatives
// each, are Score's on the prompt and the tokens; the prompt's come before the first token.
TEST_F(LogprobsTest, GenerateLogprobsAreTheScoresOfItsTokens) {
  const std::vector<uint32_t> prompt = Tokenize(kPrompt);
  ASSERT_GE(prompt.size(), 3u);
  v1::GenerateRequest request;
  for (uint32_t id : prompt) request.add_prompt_token_ids(id);
  request.set_max_new_tokens(6);
  request.set_ignore_eos(true);
  request.set_logprobs(true);
  request.set_prompt_logprobs(true);
  request.set_top_logprobs(5);
  std::vector<v1::GenerateResponse> messages;
  const grpc::Status status = Generate(request, messages);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<uint32_t> tokens;
  std::vector<v1::TokenLogprobs> logprobs, prompt_logprobs;
  for (const v1::GenerateResponse& m : messages) {
    EXPECT_TRUE(m.prompt_logprobs().empty() || tokens.empty()) << "prompt logprobs after tokens";
    prompt_logprobs.insert(prompt_logprobs.end(), m.prompt_logprobs().begin(),
                           m.prompt_logprobs().end());
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
    EXPECT_EQ(m.logprobs_size(), m.token_ids_size());
    logprobs.insert(logprobs.end(), m.logprobs().begin(), m.logprobs().end());
  }
  ASSERT_EQ(tokens.size(), 6u);
  ASSERT_EQ(prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(logprobs.size(), tokens.size());
  for (size_t j = 0; j < tokens.size(); ++j) {
    // Greedy: the most likely token is the one drawn.
    ASSERT_EQ(logprobs[j].top_logprobs_size(), 5);
    EXPECT_EQ(logprobs[j].top_logprobs(0).token_id(), tokens[j]) << "token " << j;
    EXPECT_FLOAT_EQ(logprobs[j].top_logprobs(0).logprob(), logprobs[j].logprob());
  }

  std::vector<uint32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  v1::ScoreResponse scored;
  const grpc::Status score_status = Score(all, 5, scored);
  ASSERT_TRUE(score_status.ok()) << score_status.error_message();
  ASSERT_EQ(scored.token_logprobs_size(), static_cast<int>(all.size()) - 1);
  ASSERT_EQ(scored.logprobs_size(), scored.token_logprobs_size());
  for (int i = 0; i < scored.token_logprobs_size(); ++i) {
    EXPECT_EQ(scored.token_logprobs(i).logprob(), scored.logprobs(i));
    const std::string where = "position " + std::to_string(i + 1);
    if (i + 1 < static_cast<int>(prompt.size())) {
      ExpectSame(prompt_logprobs[i], scored.token_logprobs(i), where);
    } else {
      ExpectSame(logprobs[i + 1 - prompt.size()], scored.token_logprobs(i), where);
    }
  }
  // Without top_logprobs Score answers as before.
  v1::ScoreResponse plain;
  ASSERT_TRUE(Score(all, 0, plain).ok());
  EXPECT_EQ(plain.token_logprobs_size(), 0);
  ASSERT_EQ(plain.logprobs_size(), scored.logprobs_size());
}

// /v1/completions with echo and max_tokens 0 scores the prompt: Score's values, the first null.
TEST_F(LogprobsTest, EchoedPromptLogprobsAreScores) {
  const std::vector<uint32_t> prompt = Tokenize(kPrompt);
  const Json body{{"model", "strata-demo"},
                  {"prompt", prompt},
                  {"max_tokens", 0},
                  {"echo", true},
                  {"logprobs", 3}};
  const ::strata::testing::HttpReply reply =
      ::strata::testing::PostJson(http_port_, "/v1/completions", body.dump());
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json lp = Json::parse(reply.body)["choices"][0]["logprobs"];
  v1::ScoreResponse scored;
  ASSERT_TRUE(Score(prompt, 3, scored).ok());
  ASSERT_EQ(lp["token_logprobs"].size(), prompt.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), scored.logprobs(i - 1), 1e-5)
        << "prompt token " << i;
    EXPECT_GE(lp["top_logprobs"][i].size(), 3u);
  }
}

TEST_F(LogprobsTest, BoundsAreRefusedByName) {
  v1::GenerateRequest request;
  request.add_prompt_token_ids(5);
  request.set_max_new_tokens(2);
  auto refused = [&](const v1::GenerateRequest& r) {
    std::vector<v1::GenerateResponse> messages;
    const grpc::Status status = Generate(r, messages);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("top_logprobs"), std::string::npos)
        << status.error_message();
  };
  v1::GenerateRequest r = request;
  r.set_logprobs(true);
  r.set_top_logprobs(21);
  refused(r);
  r = request;
  r.set_top_logprobs(2);  // no logprobs asked for
  refused(r);
  v1::ScoreResponse scored;
  const grpc::Status score = Score({5, 6}, 21, scored);
  EXPECT_EQ(score.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(score.error_message().find("top_logprobs"), std::string::npos);
  r = request;
  r.set_logprobs(true);
  r.set_top_logprobs(20);
  std::vector<v1::GenerateResponse> messages;
  ASSERT_TRUE(Generate(r, messages).ok());
  for (const v1::GenerateResponse& m : messages) {
    for (const v1::TokenLogprobs& l : m.logprobs()) EXPECT_EQ(l.top_logprobs_size(), 20);
  }
}

}  // namespace
}  // namespace strata
