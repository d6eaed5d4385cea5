// `n` samples on a real cluster (models/strata-demo on the CPU): the prompt is prefilled once
// for all of them (the router's prompt-token counter moves by the prompt's length, not n times
// it), the samples differ at temperature 1, and sample i is exactly the request of one sample
// with seed + i, over the OpenAI HTTP API and gRPC Generate.
#include <grpcpp/grpcpp.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/demo_cluster_test.h"
#include "tests/testing/http_post.h"

namespace strata::testing {
namespace {

using Json = nlohmann::json;

class ClusterSamplesTest : public DemoClusterTest {
 protected:
  // The router's strata_prompt_tokens_computed_total.
  static int64_t PromptTokensComputed() {
    const HttpReply reply = Exchange(http_port_, "GET", "/metrics");
    EXPECT_EQ(reply.status, 200);
    const std::string name = "\nstrata_prompt_tokens_computed_total ";
    const size_t at = reply.body.find(name);
    EXPECT_NE(at, std::string::npos) << reply.body;
    if (at == std::string::npos) return -1;
    return std::stoll(reply.body.substr(at + name.size()));
  }

  static Json Complete(const std::string& prompt, int n, uint64_t seed) {
    const Json request{{"model", "strata-demo"}, {"prompt", prompt}, {"max_tokens", 12},
                       {"temperature", 1.0},     {"seed", seed},     {"n", n},
                       {"ignore_eos", true}};
    const HttpReply reply = PostJson(http_port_, "/v1/completions", request.dump());
    EXPECT_EQ(reply.status, 200) << reply.body;
    return Json::parse(reply.body, nullptr, false);
  }

  // gRPC Generate: each sample's tokens, by index.
  static std::map<uint32_t, std::vector<uint32_t>> Generate(const std::string& prompt, int n,
                                                            uint64_t seed) {
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.set_max_new_tokens(10);
    request.set_ignore_eos(true);
    request.mutable_sampling()->set_temperature(1.0f);
    request.mutable_sampling()->set_seed(seed);
    request.set_n(n);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub_->Generate(&context, request);
    std::map<uint32_t, std::vector<uint32_t>> tokens;
    std::map<uint32_t, int> finishes;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      auto& out = tokens[response.index()];
      out.insert(out.end(), response.token_ids().begin(), response.token_ids().end());
      if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) ++finishes[response.index()];
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    for (const auto& [index, count] : finishes) EXPECT_EQ(count, 1) << "sample " << index;
    EXPECT_EQ(finishes.size(), static_cast<size_t>(n));
    return tokens;
  }
};

// Shorter than a KV block (32 tokens): no prefix of it is ever cached, so every request with it
// computes all of it.
constexpr char kPrompt[] = "The lighthouse keeper counted the ships that passed at night";

TEST_F(ClusterSamplesTest, OnePrefillForFourSamples) {
  const int64_t before = PromptTokensComputed();
  const Json together = Complete(kPrompt, 4, 1234);
  const int64_t after_one = PromptTokensComputed();
  ASSERT_EQ(together["choices"].size(), 4u) << together;
  const int prompt_tokens = together["usage"]["prompt_tokens"];
  ASSERT_GT(prompt_tokens, 5);
  ASSERT_LT(prompt_tokens, 32);
  EXPECT_EQ(after_one - before, prompt_tokens);  // once, not 4 times
  EXPECT_EQ(together["usage"]["completion_tokens"], 4 * 12);

  std::set<std::string> texts;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(together["choices"][i]["index"], i);
    texts.insert(together["choices"][i]["text"].get<std::string>());
  }
  EXPECT_GE(texts.size(), 3u) << together;  // temperature 1 over 12 tokens: they differ

  // Sample i is the request of one sample with seed 1234 + i, which computes the prompt itself.
  for (int i = 0; i < 4; ++i) {
    const Json alone = Complete(kPrompt, 1, 1234 + i);
    ASSERT_EQ(alone["choices"].size(), 1u);
    EXPECT_EQ(alone["choices"][0]["text"], together["choices"][i]["text"]) << "sample " << i;
  }
  EXPECT_EQ(PromptTokensComputed() - after_one, 4 * prompt_tokens);
}

TEST_F(ClusterSamplesTest, GrpcSamplesAreIndexedAndSeeded) {
  const std::string prompt = "A small boat crossed the bay before the storm";
  const std::map<uint32_t, std::vector<uint32_t>> together = Generate(prompt, 3, 77);
  ASSERT_EQ(together.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    const std::map<uint32_t, std::vector<uint32_t>> alone = Generate(prompt, 1, 77 + i);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone.at(0), together.at(i)) << "sample " << i;
    EXPECT_EQ(together.at(i).size(), 10u);
  }
}

TEST_F(ClusterSamplesTest, StreamedSamplesMatchTheWholeAnswer) {
  const std::string prompt = "The miller and his daughter walked to the market";
  const Json whole = Complete(prompt, 2, 5);
  Json request{{"model", "strata-demo"}, {"prompt", prompt}, {"max_tokens", 12},
               {"temperature", 1.0},     {"seed", 5},        {"n", 2},
               {"ignore_eos", true},     {"stream", true}};
  const HttpReply reply = PostJson(http_port_, "/v1/completions", request.dump());
  ASSERT_EQ(reply.status, 200) << reply.body;
  std::map<int, std::string> texts;
  size_t at = 0;
  while ((at = reply.body.find("data: ", at)) != std::string::npos) {
    const size_t end = reply.body.find('\n', at);
    const std::string data = reply.body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") continue;
    const Json chunk = Json::parse(data);
    for (const Json& choice : chunk["choices"]) {
      texts[choice["index"].get<int>()] += choice["text"].get<std::string>();
    }
  }
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0], whole["choices"][0]["text"]);
  EXPECT_EQ(texts[1], whole["choices"][1]["text"]);
}

}  // namespace
}  // namespace strata::testing
