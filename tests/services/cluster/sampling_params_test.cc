// The sampling parameters of issue #40 through a real cluster on models/strata-demo, over gRPC
// Generate and the OpenAI HTTP API: each changes the output as vLLM defines it, and values out
// of range are refused with the parameter's name.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <set>
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

constexpr char kPrompt[] = "In the beginning";
constexpr uint32_t kEos = 0;  // strata-demo's <|endoftext|>, a special token

struct Output {
  grpc::Status status;
  std::vector<uint32_t> tokens;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

class SamplingParamsTest : public ::strata::testing::DemoClusterTest {
 protected:
  // Greedy (the gRPC default), `max_new` tokens after kPrompt.
  static v1::GenerateRequest Request(int max_new, bool ignore_eos = true) {
    v1::GenerateRequest r;
    r.set_prompt(kPrompt);
    r.set_max_new_tokens(max_new);
    r.set_ignore_eos(ignore_eos);
    return r;
  }

  static Output Run(const v1::GenerateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub_->Generate(&context, request);
    Output out;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
      out.text += response.text();
      if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        out.finish = response.finish_reason();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  // A /v1/completions request, greedy unless `body` says otherwise; its status and body.
  static ::strata::testing::HttpReply Complete(Json body) {
    body["model"] = "strata-demo";
    body["prompt"] = kPrompt;
    if (!body.contains("temperature")) body["temperature"] = 0;
    return ::strata::testing::PostJson(http_port_, "/v1/completions", body.dump());
  }
  // The choice of a completion that must succeed.
  static Json Choice(const Json& body) {
    const ::strata::testing::HttpReply reply = Complete(body);
    EXPECT_EQ(reply.status, 200) << reply.body;
    const Json parsed = Json::parse(reply.body, nullptr, false);
    if (reply.status != 200 || parsed.is_discarded()) return Json{{"text", ""}};
    Json choice = parsed["choices"][0];
    choice["usage"] = parsed["usage"];
    return choice;
  }
  // The `param` of a refused completion (400), or "" if it was not refused.
  static std::string RefusedParam(const Json& body) {
    const ::strata::testing::HttpReply reply = Complete(body);
    if (reply.status != 400) return "";
    const Json parsed = Json::parse(reply.body, nullptr, false);
    if (parsed.is_discarded() || !parsed["error"]["param"].is_string()) return "(none)";
    return parsed["error"]["param"].get<std::string>();
  }
};

TEST_F(SamplingParamsTest, LogitBiasMakesGreedyPickTheToken) {
  const Output base = Run(Request(6));
  ASSERT_TRUE(base.status.ok()) << base.status.error_message();
  uint32_t target = 1;
  while (std::count(base.tokens.begin(), base.tokens.end(), target) > 0) ++target;
  v1::GenerateRequest biased = Request(6);
  (*biased.mutable_sampling()->mutable_logit_bias())[target] = 100.0f;
  const Output out = Run(biased);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, std::vector<uint32_t>(6, target));
  // The same through the OpenAI API.
  const Json choice = Choice({{"max_tokens", 6}, {"logit_bias", {{std::to_string(target), 100}}}});
  EXPECT_EQ(choice["text"], out.text);
  // A ban moves greedy off its first choice.
  v1::GenerateRequest banned = Request(6);
  (*banned.mutable_sampling()->mutable_logit_bias())[base.tokens[0]] = -100.0f;
  const Output moved = Run(banned);
  ASSERT_TRUE(moved.status.ok());
  EXPECT_NE(moved.tokens[0], base.tokens[0]);
}

TEST_F(SamplingParamsTest, StopTokenIdsEndGenerationWithoutTheirText) {
  const Output base = Run(Request(10));
  ASSERT_TRUE(base.status.ok()) << base.status.error_message();
  // The first token (after the first) that did not come before: stopping on it stops there.
  size_t i = 1;
  while (i < base.tokens.size() &&
         std::count(base.tokens.begin(), base.tokens.begin() + i, base.tokens[i]) > 0) {
    ++i;
  }
  ASSERT_LT(i, base.tokens.size()) << "every token repeats an earlier one";
  v1::GenerateRequest stop = Request(10);
  stop.add_stop_token_ids(base.tokens[i]);
  const Output out = Run(stop);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, std::vector<uint32_t>(base.tokens.begin(), base.tokens.begin() + i + 1));
  EXPECT_EQ(out.finish, v1::FINISH_REASON_STOP);
  EXPECT_EQ(out.text, Run(Request(static_cast<int>(i))).text);
  stop.set_include_stop_str_in_output(true);
  EXPECT_EQ(Run(stop).text, Run(Request(static_cast<int>(i) + 1)).text);
  const Json choice = Choice({{"max_tokens", 10}, {"stop_token_ids", {base.tokens[i]}}});
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["text"], out.text);
  EXPECT_EQ(choice["usage"]["completion_tokens"], i + 1);
}

TEST_F(SamplingParamsTest, MinTokensHoldsBackAnEarlyEos) {
  // A bias on EOS makes it the first token: the request ends at once.
  v1::GenerateRequest eos = Request(8, /*ignore_eos=*/false);
  (*eos.mutable_sampling()->mutable_logit_bias())[kEos] = 100.0f;
  const Output early = Run(eos);
  ASSERT_TRUE(early.status.ok()) << early.status.error_message();
  EXPECT_EQ(early.tokens, std::vector<uint32_t>{kEos});
  EXPECT_EQ(early.finish, v1::FINISH_REASON_EOS);
  // min_tokens 4: four other tokens, then EOS.
  eos.set_min_tokens(4);
  const Output held = Run(eos);
  ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  ASSERT_EQ(held.tokens.size(), 5u);
  for (int j = 0; j < 4; ++j) EXPECT_NE(held.tokens[j], kEos) << j;
  EXPECT_EQ(held.tokens[4], kEos);
  EXPECT_EQ(held.finish, v1::FINISH_REASON_EOS);
  const Json choice = Choice({{"max_tokens", 8}, {"min_tokens", 4}, {"logit_bias", {{"0", 100}}}});
  EXPECT_EQ(choice["usage"]["completion_tokens"], 5);
  EXPECT_EQ(choice["finish_reason"], "stop");
}

TEST_F(SamplingParamsTest, RepetitionPenaltyBreaksARepetitiveGreedyContinuation) {
  const Output base = Run(Request(32));
  ASSERT_TRUE(base.status.ok()) << base.status.error_message();
  const std::set<uint32_t> base_distinct(base.tokens.begin(), base.tokens.end());
  ASSERT_LT(base_distinct.size(), base.tokens.size()) << "the greedy continuation never repeats";
  v1::GenerateRequest penalized = Request(32);
  penalized.mutable_sampling()->set_repetition_penalty(2.0f);
  const Output out = Run(penalized);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_NE(out.tokens, base.tokens);
  EXPECT_GT(std::set<uint32_t>(out.tokens.begin(), out.tokens.end()).size(), base_distinct.size());
  // Through the API too, and the OpenAI penalties change it as well.
  EXPECT_EQ(Choice({{"max_tokens", 32}, {"repetition_penalty", 2.0}})["text"], out.text);
  const std::string plain = Choice({{"max_tokens", 32}})["text"];
  EXPECT_EQ(plain, base.text);
  EXPECT_NE(Choice({{"max_tokens", 32}, {"frequency_penalty", 2.0}})["text"], plain);
  EXPECT_NE(Choice({{"max_tokens", 32}, {"presence_penalty", 2.0}})["text"], plain);
}

TEST_F(SamplingParamsTest, MinPOfOneSamplesTheArgmax) {
  const Output base = Run(Request(16));
  ASSERT_TRUE(base.status.ok());
  v1::GenerateRequest hot = Request(16);
  hot.mutable_sampling()->set_temperature(2.0f);
  hot.mutable_sampling()->set_seed(5);
  EXPECT_NE(Run(hot).tokens, base.tokens);  // temperature 2 wanders
  hot.mutable_sampling()->set_min_p(1.0f);
  EXPECT_EQ(Run(hot).tokens, base.tokens);
  EXPECT_EQ(Choice({{"max_tokens", 16}, {"temperature", 2.0}, {"seed", 5}, {"min_p", 1.0}})["text"],
            base.text);
}

TEST_F(SamplingParamsTest, SkipSpecialTokensDecidesWhetherTheirTextShows) {
  v1::GenerateRequest r = Request(3);
  (*r.mutable_sampling()->mutable_logit_bias())[kEos] = 100.0f;  // EOS, ignored, three times
  const Output skipped = Run(r);
  ASSERT_TRUE(skipped.status.ok()) << skipped.status.error_message();
  EXPECT_EQ(skipped.tokens, std::vector<uint32_t>(3, kEos));
  EXPECT_EQ(skipped.text, "");
  r.set_skip_special_tokens(false);
  EXPECT_EQ(Run(r).text, "<|endoftext|><|endoftext|><|endoftext|>");
  EXPECT_EQ(Choice({{"max_tokens", 3},
                    {"ignore_eos", true},
                    {"logit_bias", {{"0", 100}}},
                    {"skip_special_tokens", false}})["text"],
            "<|endoftext|><|endoftext|><|endoftext|>");
}

TEST_F(SamplingParamsTest, IncludeStopStrInOutputKeepsTheStopString) {
  const std::string text = Choice({{"max_tokens", 24}})["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 3);
  const size_t at = text.find(stop);
  const Json cut = Choice({{"max_tokens", 24}, {"stop", stop}});
  EXPECT_EQ(cut["text"], text.substr(0, at));
  EXPECT_EQ(cut["finish_reason"], "stop");
  const Json kept =
      Choice({{"max_tokens", 24}, {"stop", stop}, {"include_stop_str_in_output", true}});
  EXPECT_EQ(kept["text"], text.substr(0, at + stop.size()));
}

TEST_F(SamplingParamsTest, OutOfRangeValuesAreRefusedByName) {
  EXPECT_EQ(RefusedParam({{"repetition_penalty", 0}}), "repetition_penalty");
  EXPECT_EQ(RefusedParam({{"min_p", 1.5}}), "min_p");
  EXPECT_EQ(RefusedParam({{"presence_penalty", -2.5}}), "presence_penalty");
  EXPECT_EQ(RefusedParam({{"frequency_penalty", 2.5}}), "frequency_penalty");
  EXPECT_EQ(RefusedParam({{"logit_bias", {{"8192", 1}}}}), "logit_bias");  // vocabulary: 8192
  EXPECT_EQ(RefusedParam({{"logit_bias", {{"5", 150}}}}), "logit_bias");
  EXPECT_EQ(RefusedParam({{"stop_token_ids", {9000}}}), "stop_token_ids");
  EXPECT_EQ(RefusedParam({{"max_tokens", 4}, {"min_tokens", 5}}), "min_tokens");
  EXPECT_EQ(RefusedParam({{"response_format", {{"type", "xml"}}}}), "response_format");
  EXPECT_EQ(RefusedParam({{"guided_json", 5}}), "guided_json");
  EXPECT_EQ(RefusedParam({{"n", 17}}), "n");
  EXPECT_EQ(RefusedParam({{"echo", "yes"}}), "echo");
  EXPECT_EQ(RefusedParam({{"logprobs", 21}}), "logprobs");
  auto invalid = [&](v1::GenerateRequest r, const std::string& words) {
    const Output out = Run(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << words;
    EXPECT_NE(out.status.error_message().find(words), std::string::npos)
        << out.status.error_message();
  };
  v1::GenerateRequest r = Request(4);
  (*r.mutable_sampling()->mutable_logit_bias())[8192] = 1.0f;
  invalid(r, "logit_bias");
  r = Request(4);
  r.set_min_tokens(5);
  invalid(r, "min_tokens");
  r = Request(4);
  r.mutable_sampling()->set_repetition_penalty(0.0f);  // set: not the default of 1
  invalid(r, "repetition_penalty");
  r = Request(4);
  r.add_stop_token_ids(8192);
  invalid(r, "stop_token_ids");
}

}  // namespace
}  // namespace strata
