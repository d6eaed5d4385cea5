// `n` choices through the HTTP API over a fake step runner: one choice per sample, indexed,
// streamed chunks carrying their choice's index, usage with the prompt once.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/openai_api.h"

namespace strata::testing {
namespace {

Json Completion(Json extra = Json::object()) {
  Json request{{"model", "strata-demo"},
               {"prompt", "In the beginning"},
               {"max_tokens", 5},
               {"temperature", 0},
               {"ignore_eos", true}};
  for (auto& [key, value] : extra.items()) request[key] = value;
  return request;
}

TEST(OpenAiSamplesTest, CompletionChoicesAndUsage) {
  Api api(Named("strata-demo"));
  const HttpReply one = api.Post("/v1/completions", Completion());
  ASSERT_EQ(one.status, 200) << one.body;
  const Json single = BodyOf(one);
  const HttpReply reply = api.Post("/v1/completions", Completion({{"n", 3}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json body = BodyOf(reply);
  ASSERT_EQ(body["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const Json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["text"], single["choices"][0]["text"]);  // greedy: the same
    EXPECT_EQ(choice["finish_reason"], "length");
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], single["usage"]["prompt_tokens"]);
  EXPECT_EQ(body["usage"]["completion_tokens"], 15);
  EXPECT_EQ(body["usage"]["total_tokens"], single["usage"]["prompt_tokens"].get<int>() + 15);
}

TEST(OpenAiSamplesTest, StreamedChunksCarryTheirChoice) {
  Api api(Named("strata-demo"));
  for (const bool chat : {false, true}) {
    Json request =
        Completion({{"n", 2}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
    if (chat) {
      request.erase("prompt");
      request["messages"] = Json::parse(R"([{"role": "user", "content": "Hello"}])");
    }
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const HttpReply reply = api.Post(path, request);
    ASSERT_EQ(reply.status, 200) << reply.body;
    std::map<int, std::string> texts;
    std::map<int, int> finishes;
    int64_t completion_tokens = -1;
    for (const Json& e : StreamEvents(reply)) {
      if (e.contains("usage") && e["usage"].is_object()) {
        completion_tokens = e["usage"]["completion_tokens"];
      }
      if (e["choices"].empty()) continue;
      ASSERT_EQ(e["choices"].size(), 1u);
      const Json& choice = e["choices"][0];
      const int index = choice["index"];
      if (chat) {
        if (choice["delta"].contains("content")) texts[index] += choice["delta"]["content"];
      } else {
        texts[index] += choice["text"];
      }
      if (!choice["finish_reason"].is_null()) ++finishes[index];
    }
    EXPECT_EQ(finishes, (std::map<int, int>{{0, 1}, {1, 1}})) << chat;
    ASSERT_EQ(texts.size(), 2u);
    EXPECT_FALSE(texts[0].empty());
    EXPECT_EQ(texts[0], texts[1]);
    EXPECT_EQ(completion_tokens, 10);
    // The same choices whole.
    request.erase("stream");
    request.erase("stream_options");
    const Json whole = BodyOf(api.Post(path, request));
    ASSERT_EQ(whole["choices"].size(), 2u) << whole;
    EXPECT_EQ(chat ? whole["choices"][1]["message"]["content"] : whole["choices"][1]["text"],
              texts[1]);
  }
}

TEST(OpenAiSamplesTest, EchoAndLogprobsPerChoice) {
  Api api(Named("strata-demo"));
  const HttpReply reply =
      api.Post("/v1/completions", Completion({{"n", 2}, {"echo", true}, {"logprobs", 1}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json body = BodyOf(reply);
  ASSERT_EQ(body["choices"].size(), 2u);
  const int prompt_tokens = body["usage"]["prompt_tokens"];
  for (const Json& choice : body["choices"]) {
    EXPECT_EQ(choice["text"].get<std::string>().rfind("In the beginning", 0), 0u) << choice;
    // The prompt's tokens, then the 5 generated, in each choice.
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), static_cast<size_t>(prompt_tokens + 5));
    EXPECT_TRUE(choice["logprobs"]["token_logprobs"][0].is_null());
    EXPECT_FALSE(choice["logprobs"]["token_logprobs"][1].is_null());
  }
  // Scoring the prompt alone has one answer.
  ExpectError(
      api.Post("/v1/completions", Completion({{"n", 2}, {"echo", true}, {"max_tokens", 0}})), 400,
      "n");
}

TEST(OpenAiSamplesTest, ToolCallsInEveryChoice) {
  Api api(Named("strata-demo"));
  api.SetScript("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  const HttpReply reply =
      api.Post("/v1/chat/completions",
               Json{{"model", "strata-demo"},
                    {"messages", Json::parse(R"([{"role": "user", "content": "Call f."}])")},
                    {"tools", Json::parse(R"([{"type": "function", "function": {"name": "f"}}])")},
                    {"temperature", 0},
                    {"n", 2}});
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json body = BodyOf(reply);
  ASSERT_EQ(body["choices"].size(), 2u);
  std::set<std::string> ids;
  for (const Json& choice : body["choices"]) {
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
    ids.insert(choice["message"]["tool_calls"][0]["id"].get<std::string>());
  }
  EXPECT_EQ(ids.size(), 2u);
}

TEST(OpenAiSamplesTest, RefusedCounts) {
  Api api(Named("strata-demo"));
  ExpectError(api.Post("/v1/completions", Completion({{"n", 17}})), 400, "n");
  ExpectError(api.Post("/v1/completions", Completion({{"n", 0}})), 400, "n");
  ExpectError(api.Post("/v1/completions", Completion({{"n", "2"}})), 400, "n");
  ExpectError(api.Post("/v1/completions", Completion({{"n", 2}, {"best_of", 2}})), 400, "best_of");
  EXPECT_EQ(api.Post("/v1/completions", Completion({{"n", 16}, {"max_tokens", 1}})).status, 200);
}

}  // namespace
}  // namespace strata::testing
