// The HTTP API's routes and settings through a real HttpServer and OpenAiService, over a
// Scheduler whose steps a FakeStepRunner answers (no model weights) and the demo model's
// tokenizer: /tokenize and /detokenize, /version, the served model name, the API key and
// unknown request keys.
#include "services/router/http/openai_service.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "common/util/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/openai_api.h"

namespace strata {
namespace {

using ::strata::testing::Api;
using ::strata::testing::BodyOf;
using ::strata::testing::ExpectError;
using ::strata::testing::HttpReply;
using ::strata::testing::Named;
using ::strata::testing::StreamEvents;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKey[] = "sk-test-0123456789";

TEST(OpenAiServiceTest, VersionIsTheProjects) {
  Api api(Named("strata-demo"));
  const HttpReply reply = api.Call("GET", "/version");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(BodyOf(reply), (Json{{"version", std::string(StrataVersion())}}));
  EXPECT_THAT(std::string(StrataVersion()), ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
  EXPECT_EQ(api.Call("POST", "/version").status, 405);
}

TEST(OpenAiServiceTest, TokenizeCountsAsTheTokenizer) {
  Api api(Named("strata-demo"));
  const std::string text = "In the beginning God created the heaven and the earth.";
  for (const bool special : {true, false}) {
    Json request{{"prompt", text}, {"model", "strata-demo"}};
    if (!special) request["add_special_tokens"] = false;  // default: true, as vLLM's
    const HttpReply reply = api.Post("/tokenize", request);
    ASSERT_EQ(reply.status, 200) << reply.body;
    const std::vector<int32_t> expected = *api.tokenizer().Encode(text, special);
    const Json body = BodyOf(reply);
    EXPECT_EQ(body["count"], expected.size());
    EXPECT_EQ(body["tokens"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(body["max_model_len"], api.scheduler().max_context_tokens());
    EXPECT_FALSE(body.contains("token_strs"));
  }
  const HttpReply strs =
      api.Post("/tokenize", {{"prompt", "the earth"}, {"return_token_strs", true}});
  ASSERT_EQ(strs.status, 200) << strs.body;
  const Json body = BodyOf(strs);
  ASSERT_EQ(body["token_strs"].size(), body["tokens"].size());
  for (size_t i = 0; i < body["tokens"].size(); ++i) {
    EXPECT_EQ(body["token_strs"][i], *api.tokenizer().IdToToken(body["tokens"][i].get<int32_t>()));
  }
}

// A chat's /tokenize count is the prompt_tokens /v1/chat/completions bills for it.
TEST(OpenAiServiceTest, TokenizeChatMatchesTheChatPrompt) {
  Api api(Named("strata-demo"));
  const Json messages = Json::array({Json{{"role", "system"}, {"content", "Be brief."}},
                                     Json{{"role", "user"}, {"content", "Hello there"}}});
  const HttpReply tokenized = api.Post("/tokenize", {{"messages", messages}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  const HttpReply chat = api.Post("/v1/chat/completions", {{"model", "strata-demo"},
                                                           {"messages", messages},
                                                           {"max_tokens", 2},
                                                           {"temperature", 0},
                                                           {"ignore_eos", true}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(BodyOf(tokenized)["count"], BodyOf(chat)["usage"]["prompt_tokens"]);
  // Without the assistant's opening the text is shorter.
  const HttpReply no_prompt =
      api.Post("/tokenize", {{"messages", messages}, {"add_generation_prompt", false}});
  ASSERT_EQ(no_prompt.status, 200) << no_prompt.body;
  EXPECT_LT(BodyOf(no_prompt)["count"], BodyOf(tokenized)["count"]);
}

TEST(OpenAiServiceTest, DetokenizeRoundTrip) {
  Api api(Named("strata-demo"));
  const std::string text = "And God said, Let there be light: and there was light.";
  const HttpReply tokenized =
      api.Post("/tokenize", {{"prompt", text}, {"add_special_tokens", false}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  const HttpReply detokenized =
      api.Post("/detokenize", {{"tokens", BodyOf(tokenized)["tokens"]}, {"model", "strata-demo"}});
  ASSERT_EQ(detokenized.status, 200) << detokenized.body;
  EXPECT_EQ(BodyOf(detokenized), (Json{{"prompt", text}}));
  EXPECT_EQ(BodyOf(api.Post("/detokenize", {{"tokens", Json::array()}})), (Json{{"prompt", ""}}));
}

TEST(OpenAiServiceTest, TokenizerRouteErrors) {
  Api api(Named("strata-demo"));
  const int64_t vocab = api.tokenizer().vocab_size();
  ExpectError(api.Post("/detokenize", {{"tokens", Json::array({1, vocab})}}), 400, "tokens");
  EXPECT_THAT(api.Post("/detokenize", {{"tokens", Json::array({1, vocab})}}).body,
              HasSubstr("outside the vocabulary"));
  ExpectError(api.Post("/detokenize", {{"tokens", Json::array({-1})}}), 400, "tokens");
  ExpectError(api.Post("/detokenize", {{"tokens", Json::array({"a"})}}), 400, "tokens");
  ExpectError(api.Post("/detokenize", {{"tokens", Json::array({uint64_t{1} << 63})}}), 400,
              "tokens");
  ExpectError(api.Post("/detokenize", Json::object()), 400, "tokens");
  ExpectError(api.Call("POST", "/tokenize", "{not json"), 400, "");
  ExpectError(api.Call("POST", "/detokenize", "[1, 2]"), 400, "");
  ExpectError(api.Post("/tokenize", Json::object()), 400, "prompt");
  ExpectError(api.Post("/tokenize", {{"prompt", 5}}), 400, "prompt");
  ExpectError(api.Post("/tokenize", {{"prompt", "x"}, {"messages", Json::array()}}), 400, "prompt");
  ExpectError(api.Post("/tokenize", {{"prompt", "x"}, {"add_special_tokens", "yes"}}), 400,
              "add_special_tokens");
  ExpectError(api.Post("/tokenize", {{"messages", Json::array()}}), 400, "messages");
  // Unknown keys are named, every one of them; a chat key on a prompt too.
  const HttpReply unknown =
      api.Post("/tokenize", {{"prompt", "x"}, {"truncate", 3}, {"add_generation_prompt", true}});
  ExpectError(unknown, 400, "truncate");
  EXPECT_THAT(unknown.body, HasSubstr("'truncate', 'add_generation_prompt'"));
  ExpectError(
      api.Post("/detokenize", {{"tokens", Json::array({1})}, {"skip_special_tokens", true}}), 400,
      "skip_special_tokens");
  ExpectError(api.Call("GET", "/tokenize"), 405, "", "method_not_allowed");
  // A model is optional; one that is named must be this one.
  ExpectError(api.Post("/tokenize", {{"prompt", "x"}, {"model", "other"}}), 404, "model",
              "model_not_found");
  ExpectError(api.Post("/detokenize", {{"tokens", Json::array({1})}, {"model", "other"}}), 404,
              "model", "model_not_found");

  Api ids_only(Named("strata-demo"), /*with_tokenizer=*/false);
  const HttpReply no_tokenizer = ids_only.Post("/tokenize", {{"prompt", "x"}});
  ExpectError(no_tokenizer, 400, "");
  EXPECT_THAT(no_tokenizer.body, HasSubstr("no tokenizer (tokenizer.json or tiktoken.model)"));
  ExpectError(ids_only.Post("/detokenize", {{"tokens", Json::array({1})}}), 400, "");
}

TEST(OpenAiServiceTest, ServedModelName) {
  Api api(Named("my-model"));
  const HttpReply models = api.Call("GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  ASSERT_EQ(BodyOf(models)["data"].size(), 1u);
  EXPECT_EQ(BodyOf(models)["data"][0]["id"], "my-model");
  const Json request{{"prompt", "In the beginning"}, {"max_tokens", 3}, {"temperature", 0}};
  Json mine = request;
  mine["model"] = "my-model";
  const HttpReply ok = api.Post("/v1/completions", mine);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(BodyOf(ok)["model"], "my-model");
  // The directory's name is not an alias.
  Json other = request;
  other["model"] = "strata-demo";
  const HttpReply refused = api.Post("/v1/completions", other);
  ExpectError(refused, 404, "model", "model_not_found");
  EXPECT_THAT(refused.body, HasSubstr("'my-model'"));
  ExpectError(api.Post("/v1/chat/completions",
                       {{"model", "strata-demo"},
                        {"messages", Json::array({Json{{"role", "user"}, {"content", "x"}}})}}),
              404, "model", "model_not_found");
}

TEST(OpenAiServiceTest, ApiKeyGuardsV1AndTheTokenizer) {
  Api api(Named("strata-demo", kKey));
  const std::string bearer = std::string("Authorization: Bearer ") + kKey;
  for (const auto& [method, path, body] : std::vector<std::tuple<std::string, std::string, Json>>{
           {"GET", "/v1/models", nullptr},
           {"POST",
            "/v1/completions",
            {{"model", "strata-demo"}, {"prompt", "x"}, {"max_tokens", 1}, {"temperature", 0}}},
           {"POST",
            "/v1/chat/completions",
            {{"model", "strata-demo"},
             {"messages", Json::array({Json{{"role", "user"}, {"content", "x"}}})},
             {"max_tokens", 1},
             {"temperature", 0}}},
           {"POST", "/tokenize", {{"prompt", "x"}}},
           {"POST", "/detokenize", {{"tokens", Json::array({1})}}}}) {
    const std::string text = body.is_null() ? "" : body.dump();
    const HttpReply none = api.Call(method, path, text);
    ExpectError(none, 401, "", "invalid_api_key");
    EXPECT_THAT(none.head, HasSubstr("WWW-Authenticate: Bearer")) << path;
    const HttpReply wrong = api.Call(method, path, text, {"Authorization: Bearer sk-guess"});
    ExpectError(wrong, 401, "", "invalid_api_key");
    EXPECT_THAT(wrong.body, Not(HasSubstr("sk-guess")));
    // A prefix of the key, or the key without its scheme, is no key.
    ExpectError(api.Call(method, path, text, {"Authorization: Bearer sk-test"}), 401, "",
                "invalid_api_key");
    ExpectError(api.Call(method, path, text, {std::string("Authorization: ") + kKey}), 401, "",
                "invalid_api_key");
    EXPECT_EQ(api.Call(method, path, text, {bearer}).status, 200) << path;
    // The scheme's name is case-insensitive (RFC 9110).
    EXPECT_EQ(api.Call(method, path, text, {std::string("authorization: bearer ") + kKey}).status,
              200)
        << path;
  }
  // Every path under /v1 asks for it first, as vLLM's; probes and scrapers need none.
  ExpectError(api.Call("GET", "/v1/nowhere"), 401, "", "invalid_api_key");
  EXPECT_EQ(api.Call("GET", "/v1/nowhere", "", {bearer}).status, 404);
  EXPECT_EQ(api.Call("GET", "/health").status, 200);
  EXPECT_EQ(api.Call("GET", "/metrics").status, 200);
  EXPECT_EQ(api.Call("GET", "/version").status, 200);
  // Without a key nothing is asked.
  Api open(Named("strata-demo"));
  EXPECT_EQ(open.Call("GET", "/v1/models").status, 200);
  EXPECT_EQ(open.Call("GET", "/v1/models", "", {"Authorization: Bearer anything"}).status, 200);
}

TEST(OpenAiServiceTest, UnknownRequestKeysAreRefused) {
  Api api(Named("strata-demo"));
  const Json completion{{"model", "strata-demo"}, {"prompt", "x"}, {"max_tokens", 1}};
  Json typo = completion;
  typo["temprature"] = 0.5;
  typo["best_of_n"] = 2;
  const HttpReply refused = api.Post("/v1/completions", typo);
  ExpectError(refused, 400, "temprature");
  EXPECT_THAT(refused.body, HasSubstr("'temprature', 'best_of_n'"));
  // What the openai package sends for its own parameters is read.
  Json user = completion;
  user["user"] = "user-1234";
  EXPECT_EQ(api.Post("/v1/completions", user).status, 200);
  const Json chat{{"model", "strata-demo"},
                  {"messages", Json::array({Json{{"role", "user"}, {"content", "x"}}})},
                  {"max_completion_tokens", 1},
                  {"tool_choice", "none"},
                  {"parallel_tool_calls", false},
                  {"user", "u"}};
  EXPECT_EQ(api.Post("/v1/chat/completions", chat).status, 200);
  Json wrong_endpoint = completion;
  wrong_endpoint["max_completion_tokens"] = 4;  // a chat parameter
  ExpectError(api.Post("/v1/completions", wrong_endpoint), 400, "max_completion_tokens");
}

// echo on a chat (vLLM's rule): a reply that continues an assistant's last message starts
// with that message's text, whole or streamed; after a user's message nothing is echoed.
TEST(OpenAiServiceTest, ChatEchoPrependsTheAssistantsLastMessage) {
  Api api(Named("strata-demo"));
  const std::string started = "The answer is";
  Json chat{{"model", "strata-demo"},
            {"messages", Json::array({Json{{"role", "user"}, {"content", "Say it."}},
                                      Json{{"role", "assistant"}, {"content", started}}})},
            {"add_generation_prompt", false},
            {"max_tokens", 4},
            {"temperature", 0},
            {"ignore_eos", true}};
  auto content = [&](const Json& request) {
    const HttpReply reply = api.Post("/v1/chat/completions", request);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.status == 200
               ? BodyOf(reply)["choices"][0]["message"]["content"].get<std::string>()
               : std::string();
  };
  const std::string reply = content(chat);
  chat["echo"] = true;
  EXPECT_EQ(content(chat), started + reply);

  chat["stream"] = true;
  const std::vector<Json> events = StreamEvents(api.Post("/v1/chat/completions", chat));
  std::string streamed, first;
  for (const Json& event : events) {
    const Json& delta = event["choices"][0]["delta"];
    if (!delta.contains("content") || !delta["content"].is_string()) continue;
    if (first.empty()) first = delta["content"].get<std::string>();
    streamed += delta["content"].get<std::string>();
  }
  EXPECT_EQ(first, started);
  EXPECT_EQ(streamed, started + reply);

  Json asked{{"model", "strata-demo"},
             {"messages", Json::array({Json{{"role", "user"}, {"content", "Say it."}}})},
             {"max_tokens", 4},
             {"temperature", 0},
             {"ignore_eos", true}};
  const std::string answer = content(asked);
  asked["echo"] = true;
  EXPECT_EQ(content(asked), answer);
  asked["max_tokens"] = 0;  // the prompt alone is the completions' only
  ExpectError(api.Post("/v1/chat/completions", asked), 400, "max_tokens");
}

}  // namespace
}  // namespace strata
