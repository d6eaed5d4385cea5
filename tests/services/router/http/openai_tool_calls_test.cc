// Tool calling through the HTTP API end to end: a chat with tools is rendered, the reply a
// FakeStepRunner scripts (the demo model would not call tools by itself) is parsed into
// `tool_calls`, whole and streamed.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/openai_api.h"

namespace strata::testing {
namespace {

constexpr char kTwoCalls[] =
    "Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
    "</tool_call>";

Json Tools() {
  return Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}])");
}

Json ChatRequest(Json extra = Json::object()) {
  Json request{{"model", "strata-demo"},
               {"messages", Json::parse(R"([{"role": "user", "content": "Weather and time?"}])")},
               {"tools", Tools()},
               {"temperature", 0},
               {"max_tokens", 200}};
  for (auto& [key, value] : extra.items()) request[key] = value;
  return request;
}

// A streamed chat's content, and its tool calls put together from their deltas as the openai
// package's stream helpers do.
struct Streamed {
  std::string content;
  Json calls = Json::array();
  std::string finish_reason;
};

Streamed Accumulate(const std::vector<Json>& events) {
  Streamed s;
  for (const Json& e : events) {
    if (e["choices"].empty()) continue;
    const Json& choice = e["choices"][0];
    const Json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      s.content += delta["content"].get<std::string>();
    }
    if (delta.contains("tool_calls")) {
      for (const Json& call : delta["tool_calls"]) {
        const size_t index = call["index"].get<size_t>();
        if (index == s.calls.size()) {
          // A call's first delta carries its id, type and name.
          EXPECT_TRUE(call.contains("id") && call.contains("type")) << call;
          EXPECT_TRUE(call["function"].contains("name")) << call;
          s.calls.push_back(
              Json{{"id", call["id"]},
                   {"type", call["type"]},
                   {"function", {{"name", call["function"]["name"]}, {"arguments", ""}}}});
        }
        EXPECT_LT(index, s.calls.size()) << call;
        if (index >= s.calls.size()) continue;
        if (call["function"].contains("arguments")) {
          s.calls[index]["function"]["arguments"] =
              s.calls[index]["function"]["arguments"].get<std::string>() +
              call["function"]["arguments"].get<std::string>();
        }
      }
    }
    if (!choice["finish_reason"].is_null()) s.finish_reason = choice["finish_reason"];
  }
  return s;
}

void ExpectTwoCalls(const Json& calls) {
  ASSERT_EQ(calls.size(), 2u) << calls;
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Zürich\"}");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
  const std::string id0 = calls[0]["id"], id1 = calls[1]["id"];
  EXPECT_THAT(id0, ::testing::MatchesRegex("call_[A-Za-z0-9]{24}"));
  EXPECT_NE(id0, id1);
}

TEST(OpenAiToolCallsTest, ReplyIsParsedIntoToolCalls) {
  Api api(Named("strata-demo"));
  api.SetScript(kTwoCalls);
  const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest());
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json choice = BodyOf(reply)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Checking both.");
  ExpectTwoCalls(choice["message"]["tool_calls"]);
}

TEST(OpenAiToolCallsTest, StreamedDeltasAddUpToTheSameCalls) {
  Api api(Named("strata-demo"));
  api.SetScript(kTwoCalls);
  const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest({{"stream", true}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const std::vector<Json> events = StreamEvents(reply);
  const Streamed s = Accumulate(events);
  EXPECT_EQ(s.content, "Checking both.");
  EXPECT_EQ(s.finish_reason, "tool_calls");
  ExpectTwoCalls(s.calls);
  // Nothing of the blocks went out as content, and the text came before the first call.
  bool call_seen = false;
  for (const Json& e : events) {
    if (e["choices"].empty()) continue;
    const Json& delta = e["choices"][0]["delta"];
    if (delta.contains("tool_calls")) call_seen = true;
    if (delta.contains("content") && delta["content"].is_string()) {
      const std::string content = delta["content"];
      EXPECT_THAT(content, ::testing::Not(::testing::HasSubstr("<tool")));
      EXPECT_TRUE(content.empty() || !call_seen) << content;
    }
  }
}

TEST(OpenAiToolCallsTest, MalformedBlocksAndNoToolsStayContent) {
  Api api(Named("strata-demo"));
  const std::string reply_text =
      "Let me see. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }"
      "</tool_call> Sorry.";
  api.SetScript(reply_text);
  for (const bool stream : {false, true}) {
    const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest({{"stream", stream}}));
    ASSERT_EQ(reply.status, 200) << reply.body;
    if (stream) {
      const Streamed s = Accumulate(StreamEvents(reply));
      EXPECT_EQ(s.content, reply_text);
      EXPECT_TRUE(s.calls.empty());
      EXPECT_EQ(s.finish_reason, "stop");
    } else {
      const Json choice = BodyOf(reply)["choices"][0];
      EXPECT_EQ(choice["message"]["content"], reply_text);
      EXPECT_FALSE(choice["message"].contains("tool_calls"));
      EXPECT_EQ(choice["finish_reason"], "stop");
    }
  }
  // Without tools (or with tool_choice "none") a well-formed block is only text.
  api.SetScript(kTwoCalls);
  for (const Json& extra : {Json{{"tools", Json::array()}}, Json{{"tool_choice", "none"}}}) {
    const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest(extra));
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json choice = BodyOf(reply)["choices"][0];
    EXPECT_EQ(choice["message"]["content"], kTwoCalls) << extra;
    EXPECT_EQ(choice["finish_reason"], "stop");
  }
}

// The tools reach the prompt (so /tokenize with them counts what the chat bills), except with
// tool_choice "none".
TEST(OpenAiToolCallsTest, ToolsAreRenderedUnlessChoiceIsNone) {
  Api api(Named("strata-demo"));
  api.SetScript("Hi.");
  auto prompt_tokens = [&](Json extra) {
    const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest(std::move(extra)));
    EXPECT_EQ(reply.status, 200) << reply.body;
    return BodyOf(reply)["usage"]["prompt_tokens"].get<int64_t>();
  };
  const int64_t with_tools = prompt_tokens(Json::object());
  const int64_t without = prompt_tokens({{"tools", Json::array()}});
  EXPECT_GT(with_tools, without + 20);
  EXPECT_EQ(prompt_tokens({{"tool_choice", "none"}}), without);
  const HttpReply tokenized = api.Post(
      "/tokenize",
      {{"model", "strata-demo"}, {"messages", ChatRequest()["messages"]}, {"tools", Tools()}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  EXPECT_EQ(BodyOf(tokenized)["count"], with_tools);
}

TEST(OpenAiToolCallsTest, ParallelToolCallsFalseKeepsTheFirst) {
  Api api(Named("strata-demo"));
  api.SetScript(kTwoCalls);
  for (const bool stream : {false, true}) {
    const HttpReply reply = api.Post(
        "/v1/chat/completions", ChatRequest({{"parallel_tool_calls", false}, {"stream", stream}}));
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json calls = stream ? Accumulate(StreamEvents(reply)).calls
                              : BodyOf(reply)["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), 1u) << reply.body;
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  }
}

// A named function or "required" starts the assistant's turn as a call: the model writes the
// rest (here the arguments and the closing tag after a forced name).
TEST(OpenAiToolCallsTest, NamedChoiceForcesTheCallsStart) {
  Api api(Named("strata-demo"));
  api.SetScript("{\"city\": \"Oslo\"}}\n</tool_call>");
  const Json named{{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const bool stream : {false, true}) {
    const HttpReply reply =
        api.Post("/v1/chat/completions", ChatRequest({{"tool_choice", named}, {"stream", stream}}));
    ASSERT_EQ(reply.status, 200) << reply.body;
    Json calls;
    Json content;
    std::string finish;
    if (stream) {
      const Streamed s = Accumulate(StreamEvents(reply));
      calls = s.calls;
      content = s.content;
      finish = s.finish_reason;
    } else {
      const Json choice = BodyOf(reply)["choices"][0];
      calls = choice["message"]["tool_calls"];
      content = choice["message"]["content"];
      finish = choice["finish_reason"];
    }
    ASSERT_EQ(calls.size(), 1u) << reply.body;
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
    EXPECT_EQ(content, stream ? Json("") : Json(nullptr));
    EXPECT_EQ(finish, "tool_calls");
  }
  // "required" whose reply is no call: what the turn holds comes back as content (the forced
  // start included), with the model's finish reason.
  api.SetScript("I would rather not.");
  const HttpReply reply =
      api.Post("/v1/chat/completions", ChatRequest({{"tool_choice", "required"}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json choice = BodyOf(reply)["choices"][0];
  EXPECT_EQ(choice["message"]["content"], "<tool_call>\nI would rather not.");
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(choice["finish_reason"], "stop");
}

TEST(OpenAiToolCallsTest, LogprobsAreKeptWhileTextIsHeldBack) {
  Api api(Named("strata-demo"));
  api.SetScript(kTwoCalls);
  const HttpReply reply = api.Post(
      "/v1/chat/completions",
      ChatRequest(
          {{"stream", true}, {"logprobs", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  size_t entries = 0;
  int64_t completion_tokens = -1;
  for (const Json& e : StreamEvents(reply)) {
    if (e.contains("usage") && e["usage"].is_object()) {
      completion_tokens = e["usage"]["completion_tokens"];
    }
    if (e["choices"].empty() || e["choices"][0]["logprobs"].is_null()) continue;
    entries += e["choices"][0]["logprobs"]["content"].size();
  }
  // Every token has its entry, though the calls' tokens went out as no content.
  EXPECT_EQ(entries, static_cast<size_t>(completion_tokens));
  EXPECT_GT(completion_tokens, 20);
}

// A GLM reply: the request's tools tell the parser that `city` is a string (kept as written);
// a forced call starts with the function's name.
TEST(OpenAiToolCallsTest, GlmCallsReadWithTheRequestsSchemas) {
  auto options = Named("strata-demo");
  options.tool_call_format = ToolCallFormat::kGlm45;
  Api api(options);
  api.SetScript(
      "On it.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>2046</arg_value>\n"
      "</tool_call>\n<tool_call>get_time\n</tool_call>");
  for (const bool stream : {false, true}) {
    const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest({{"stream", stream}}));
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json choice = stream ? Json() : BodyOf(reply)["choices"][0];
    const Streamed s = stream ? Accumulate(StreamEvents(reply)) : Streamed();
    const Json calls = stream ? s.calls : choice["message"]["tool_calls"];
    EXPECT_EQ(stream ? Json(s.content) : choice["message"]["content"], "On it.");
    ASSERT_EQ(calls.size(), 2u) << reply.body;
    EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"2046\"}");
    EXPECT_EQ(calls[1]["function"]["name"], "get_time");
    EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
  }
  api.SetScript("<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>");
  const Json named{{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest({{"tool_choice", named}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json calls = BodyOf(reply)["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << reply.body;
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
}

// Kimi-K2 names its calls functions.NAME:INDEX and expects those ids back: they are the calls'
// ids.
TEST(OpenAiToolCallsTest, KimiCallsKeepTheModelsIds) {
  auto options = Named("strata-demo");
  options.tool_call_format = ToolCallFormat::kKimiK2;
  Api api(options);
  api.SetScript(
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3"
      "<|tool_call_argument_begin|>{\"city\": \"Zürich\"}<|tool_call_end|>"
      "<|tool_calls_section_end|>");
  const HttpReply reply = api.Post("/v1/chat/completions", ChatRequest());
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json choice = BodyOf(reply)["choices"][0];
  EXPECT_EQ(choice["message"]["content"], nullptr);
  const Json calls = choice["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << reply.body;
  EXPECT_EQ(calls[0]["id"], "functions.get_weather:3");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Zürich\"}");
}

TEST(OpenAiToolCallsTest, ModelsWithoutAToolFormatRefuseTools) {
  auto options = Named("strata-demo");
  options.tool_call_format = ToolCallFormat::kNone;
  Api api(options);
  ExpectError(api.Post("/v1/chat/completions", ChatRequest()), 400, "tools");
  // Tools not offered need no format.
  api.SetScript("Hi.");
  EXPECT_EQ(api.Post("/v1/chat/completions", ChatRequest({{"tool_choice", "none"}})).status, 200);
}

}  // namespace
}  // namespace strata::testing
