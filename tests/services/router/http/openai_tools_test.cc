#include "services/router/http/openai_tools.h"

#include "gtest/gtest.h"
#include "services/router/http/openai_request.h"

namespace strata {
namespace {

constexpr char kWeather[] =
    R"([{"type": "function", "function": {"name": "get_weather", "description": "Now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
       {"type": "function", "function": {"name": "get_time"}}])";

absl::StatusOr<OpenAiRequest> Chat(
    const std::string& extra,
    const std::string& messages = R"([{"role": "user", "content": "Weather?"}])") {
  return ParseOpenAiRequest(
      R"({"model": "m", "messages": )" + messages + R"(, "tools": )" + kWeather + extra + "}",
      true);
}

void ExpectParam(const absl::StatusOr<OpenAiRequest>& r, const std::string& param) {
  ASSERT_FALSE(r.ok());
  const ApiError e = ToApiError(r.status());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, param) << r.status();
  EXPECT_FALSE(e.message.empty());
}

TEST(OpenAiToolsTest, ToolsAndChoices) {
  auto r = Chat("");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.tools.size(), 2u);
  EXPECT_EQ(r->tools.choice, ToolChoice::kAuto);
  EXPECT_TRUE(r->tools.parallel);
  EXPECT_TRUE(r->tools.offered());

  r = Chat(R"(, "tool_choice": "none")");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->tools.offered());
  r = Chat(R"(, "tool_choice": "required", "parallel_tool_calls": false)");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tools.choice, ToolChoice::kRequired);
  EXPECT_FALSE(r->tools.parallel);
  r = Chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.choice, ToolChoice::kFunction);
  EXPECT_EQ(r->tools.function, "get_time");
}

TEST(OpenAiToolsTest, BadToolsAreNamed) {
  const std::string messages = R"([{"role": "user", "content": "x"}])";
  auto with_tools = [&](const std::string& tools) {
    return ParseOpenAiRequest(
        R"({"model": "m", "messages": )" + messages + R"(, "tools": )" + tools + "}", true);
  };
  ExpectParam(with_tools(R"({"type": "function"})"), "tools");
  ExpectParam(with_tools(R"([{"type": "code_interpreter"}])"), "tools[0]");
  ExpectParam(with_tools(R"([{"type": "function"}])"), "tools[0].function");
  ExpectParam(with_tools(R"([{"type": "function", "function": {"name": ""}}])"),
              "tools[0].function.name");
  ExpectParam(with_tools(R"([{"type": "function", "function": {"name": "f"}},
                             {"type": "function", "function": {"name": "f"}}])"),
              "tools[1].function.name");
  ExpectParam(with_tools(R"([{"type": "function", "function": {"name": "f", "parameters": 1}}])"),
              "tools[0].function.parameters");
  ExpectParam(with_tools(R"([{"type": "function", "function": {"name": "f", "strict": "y"}}])"),
              "tools[0].function.strict");
  ExpectParam(Chat(R"(, "tool_choice": "any")"), "tool_choice");
  ExpectParam(Chat(R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})"),
              "tool_choice");
  ExpectParam(Chat(R"(, "tool_choice": {"type": "function"})"), "tool_choice");
  ExpectParam(Chat(R"(, "parallel_tool_calls": 1)"), "parallel_tool_calls");
  // A call asked for with nothing to call.
  ExpectParam(ParseOpenAiRequest(R"({"model": "m", "messages": )" + messages +
                                     R"(, "tools": [], "tool_choice": "required"})",
                                 true),
              "tool_choice");
}

TEST(OpenAiToolsTest, ToolCallsAndResponsesInMessages) {
  auto r = Chat("", R"([
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "assistant", "tool_calls": [{"id": "call_2", "type": "function",
       "function": {"name": "get_time", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "-3C"}])");
  ASSERT_TRUE(r.ok()) << r.status();
  // The arguments' text is an object for the template, unless it is not JSON.
  const Json& first = r->messages[1]["tool_calls"][0]["function"]["arguments"];
  ASSERT_TRUE(first.is_object());
  EXPECT_EQ(first["city"], "Oslo");
  EXPECT_EQ(r->messages[1]["content"], "");
  EXPECT_EQ(r->messages[2]["tool_calls"][0]["function"]["arguments"], "not json");
  EXPECT_EQ(r->messages[2]["content"], "");
  EXPECT_EQ(r->messages[3]["tool_call_id"], "call_1");
}

TEST(OpenAiToolsTest, BadMessageFieldsAreNamed) {
  ExpectParam(Chat("", R"([{"role": "assistant", "tool_calls": {}}])"), "messages[0].tool_calls");
  ExpectParam(Chat("", R"([{"role": "assistant", "tool_calls": [{"id": "c"}]}])"),
              "messages[0].tool_calls[0]");
  ExpectParam(Chat("", R"([{"role": "assistant", "tool_calls": [{"function": {}}]}])"),
              "messages[0].tool_calls[0].function.name");
  ExpectParam(Chat("", R"([{"role": "assistant", "tool_calls": [{"type": "x",
                            "function": {"name": "f"}}]}])"),
              "messages[0].tool_calls[0].type");
  ExpectParam(Chat("", R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                            "arguments": 5}}]}])"),
              "messages[0].tool_calls[0].function.arguments");
  ExpectParam(Chat("", R"([{"role": "user", "content": "x", "tool_calls": []}])"),
              "messages[0].tool_calls");
  ExpectParam(Chat("", R"([{"role": "tool", "tool_call_id": 3, "content": "x"}])"),
              "messages[0].tool_call_id");
  // Only an assistant's calls excuse a missing content.
  ExpectParam(Chat("", R"([{"role": "tool", "tool_call_id": "c"}])"), "messages[0].content");
}

}  // namespace
}  // namespace strata
