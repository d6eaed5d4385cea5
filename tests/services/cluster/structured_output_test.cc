// Structured output through a real cluster on models/strata-demo: completions sampled at
// temperature 1 under JSON schemas (required properties, enums, bounded integers, arrays, nested
// objects, patterns) all parse and validate; json_object, guided_choice and guided_regex hold;
// gRPC's response_format too; bad formats are refused with the field's name.
//
// STRATA_STRUCTURED_REQUESTS sets how many schema completions run (default 200, about 10 s on
// two cores); STRATA_STRUCTURED_OUTPUTS names a JSONL file that gets each (schema, text), for a
// second check with Python's jsonschema (scripts/check_structured_outputs.py).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/grammar/grammar_compiler.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/demo_cluster_test.h"
#include "tests/testing/http_post.h"
#include "tests/testing/json_schema_check.h"

namespace strata {
namespace {

using Json = nlohmann::json;
using ::strata::testing::SchemaViolation;

// Bounded schemas: every output the grammar allows fits in kMaxTokens.
const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["color", "count"]})",
    R"({"type": "object", "properties": {"tags": {"type": "array", "minItems": 1, "maxItems": 3,
        "items": {"type": "string", "maxLength": 8}}}, "required": ["tags"]})",
    R"({"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999}, "active": {"type": "boolean"}},
        "required": ["id", "active"], "additionalProperties": false},
        "score": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["user", "score"]})",
    R"({"type": "object", "properties": {"code": {"type": "string",
        "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "ok": {"type": "boolean"}},
        "required": ["code", "ok"]})",
    R"({"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"k": {"type": "string", "maxLength": 5},
        "v": {"type": "integer", "minimum": 0, "maximum": 50}}, "required": ["k", "v"]}}},
        "required": ["items"]})",
    R"({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2, "maxItems": 4})",
    R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 1,
        "maxLength": 6}, "b": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["a"]})",
    R"({"type": "object", "properties": {"kind": {"const": "point"},
        "x": {"type": "integer", "minimum": -9, "maximum": 9}, "note": {"type": "null"}},
        "required": ["kind", "x", "note"]})",
    R"({"type": "object", "properties": {"answer": {"enum": ["yes", "no", 1, null]},
        "why": {"type": "string", "pattern": "^[a-z ]{0,10}$"}}, "required": ["answer", "why"]})",
};
constexpr int kNumSchemas = sizeof(kSchemas) / sizeof(kSchemas[0]);
constexpr int kMaxTokens = 300;

int RequestsToRun() {
  const char* value = std::getenv("STRATA_STRUCTURED_REQUESTS");
  return value != nullptr && std::atoi(value) > 0 ? std::atoi(value) : 200;
}

class StructuredOutputTest : public ::strata::testing::DemoClusterTest {
 protected:
  void SetUp() override {
    DemoClusterTest::SetUp();
    if (!GrammarCompiler::available()) {
      GTEST_SKIP() << "built without xgrammar (scripts/fetch_xgrammar.sh fetches it)";
    }
  }

  static ::strata::testing::HttpReply Post(const char* path, Json body) {
    body["model"] = "strata-demo";
    return ::strata::testing::PostJson(http_port_, path, body.dump());
  }
  static Json Complete(Json body) {
    if (!body.contains("prompt")) body["prompt"] = "The record, as JSON:";
    const ::strata::testing::HttpReply reply = Post("/v1/completions", body);
    EXPECT_EQ(reply.status, 200) << reply.body;
    const Json parsed = Json::parse(reply.body, nullptr, false);
    return parsed.is_discarded() || !parsed.contains("choices") ? Json{{"text", ""}}
                                                                : parsed["choices"][0];
  }
  // The refused request's `param` (400), or what came instead.
  static std::string RefusedParam(Json body) {
    body["prompt"] = "x";
    const ::strata::testing::HttpReply reply = Post("/v1/completions", body);
    if (reply.status != 400) return "status " + std::to_string(reply.status) + ": " + reply.body;
    const Json error = Json::parse(reply.body)["error"];
    return error["param"].is_string() ? error["param"].get<std::string>() : "null";
  }
};

TEST_F(StructuredOutputTest, SampledSchemaCompletionsParseAndValidate) {
  const int requests = RequestsToRun();
  std::atomic<int> next{0}, valid{0};
  std::mutex mu;
  std::vector<std::string> failures;
  Json outputs = Json::array();
  auto work = [&] {
    for (int i = next++; i < requests; i = next++) {
      const Json schema = Json::parse(kSchemas[i % kNumSchemas]);
      const Json choice =
          Complete({{"response_format",
                     {{"type", "json_schema"},
                      {"json_schema", {{"name", "record"}, {"schema", schema}, {"strict", true}}}}},
                    {"temperature", 1.0},
                    {"seed", 1000 + i},
                    {"max_tokens", kMaxTokens}});
      const std::string text = choice.value("text", "");
      const Json value = Json::parse(text, nullptr, false);
      std::string why;
      if (value.is_discarded()) {
        why = "does not parse";
      } else {
        why = SchemaViolation(schema, value);
      }
      if (why.empty() && choice.value("finish_reason", "") != "stop") why = "did not end on EOS";
      std::lock_guard<std::mutex> lock(mu);
      outputs.push_back({{"schema", schema}, {"text", text}});
      if (why.empty()) {
        ++valid;
      } else {
        failures.push_back("schema " + std::to_string(i % kNumSchemas) + " seed " +
                           std::to_string(1000 + i) + ": " + why + ": " + text);
      }
    }
  };
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) clients.emplace_back(work);
  for (std::thread& client : clients) client.join();
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  std::printf("structured output: %d of %d json_schema completions parse and validate\n",
              valid.load(), requests);
  EXPECT_EQ(valid.load(), requests);
  if (const char* path = std::getenv("STRATA_STRUCTURED_OUTPUTS")) {
    std::ofstream out(path);
    for (const Json& output : outputs) out << output.dump() << "\n";
  }
}

TEST_F(StructuredOutputTest, JsonObjectIsAnObject) {
  int complete = 0;
  for (int seed = 0; seed < 6; ++seed) {
    const Json choice = Complete({{"response_format", {{"type", "json_object"}}},
                                  {"temperature", 1.0},
                                  {"seed", seed},
                                  {"max_tokens", 200}});
    const std::string text = choice.value("text", "");
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text[0], '{') << text;
    // An object may run past max_tokens (its values are unbounded); one that ended is whole.
    if (choice.value("finish_reason", "") == "length") continue;
    ++complete;
    const Json value = Json::parse(text, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << text;
    EXPECT_TRUE(value.is_object()) << text;
  }
  std::printf("json_object: %d of 6 ended before max_tokens\n", complete);
}

TEST_F(StructuredOutputTest, ChatCompletionsFollowTheSchema) {
  const Json schema = Json::parse(kSchemas[1]);
  Json body = {{"messages", {{{"role", "user"}, {"content", "Pick a color."}}}},
               {"response_format",
                {{"type", "json_schema"}, {"json_schema", {{"name", "pick"}, {"schema", schema}}}}},
               {"temperature", 1.0},
               {"seed", 7},
               {"max_tokens", kMaxTokens}};
  const ::strata::testing::HttpReply reply = Post("/v1/chat/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json choice = Json::parse(reply.body)["choices"][0];
  const std::string content = choice["message"]["content"];
  const Json value = Json::parse(content, nullptr, false);
  ASSERT_FALSE(value.is_discarded()) << content;
  EXPECT_EQ(SchemaViolation(schema, value), "") << content;
  EXPECT_EQ(choice["finish_reason"], "stop");
}

TEST_F(StructuredOutputTest, GuidedChoiceAndRegex) {
  for (int seed = 0; seed < 4; ++seed) {
    const Json choice = Complete({{"guided_choice", {"alpha", "beta", "gamma delta"}},
                                  {"temperature", 1.0},
                                  {"seed", seed},
                                  {"max_tokens", 20}});
    const std::string text = choice.value("text", "");
    EXPECT_TRUE(text == "alpha" || text == "beta" || text == "gamma delta") << text;
    const Json regex = Complete({{"guided_regex", "[0-9]{3}-[a-z]{2,4}"},
                                 {"temperature", 1.0},
                                 {"seed", seed},
                                 {"max_tokens", 20}});
    EXPECT_TRUE(std::regex_match(regex.value("text", ""), std::regex("[0-9]{3}-[a-z]{2,4}")))
        << regex.value("text", "");
  }
}

TEST_F(StructuredOutputTest, GrpcGenerateTakesAResponseFormat) {
  const Json schema = Json::parse(kSchemas[0]);
  v1::GenerateRequest request;
  request.set_prompt("A person:");
  request.set_max_new_tokens(kMaxTokens);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_seed(3);
  request.mutable_response_format()->set_type(v1::ResponseFormat::TYPE_JSON_SCHEMA);
  request.mutable_response_format()->set_json_schema(schema.dump());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub_->Generate(&context, request);
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    text += response.text();
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED)
      finish = response.finish_reason();
  }
  ASSERT_TRUE(reader->Finish().ok());
  const Json value = Json::parse(text, nullptr, false);
  ASSERT_FALSE(value.is_discarded()) << text;
  EXPECT_EQ(SchemaViolation(schema, value), "") << text;
  EXPECT_EQ(finish, v1::FINISH_REASON_EOS);

  // A schema the engine refuses: INVALID_ARGUMENT naming the field.
  request.mutable_response_format()->set_json_schema(
      R"({"type": "integer", "minimum": 9, "maximum": 1})");
  grpc::ClientContext bad_context;
  auto bad = stub_->Generate(&bad_context, request);
  while (bad->Read(&response)) {
  }
  const grpc::Status status = bad->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("response_format"), std::string::npos)
      << status.error_message();
}

// tool_choice "required" or a named function: sampled replies are whole calls whose arguments
// validate against the function's parameters, however little the demo model knows of tools.
TEST_F(StructuredOutputTest, ForcedToolCallsFollowTheParameters) {
  const Json weather = Json::parse(kSchemas[0]);
  const Json pick = Json::parse(kSchemas[1]);
  const Json tools = {
      {{"type", "function"}, {"function", {{"name", "get_person"}, {"parameters", weather}}}},
      {{"type", "function"}, {"function", {{"name", "pick_color"}, {"parameters", pick}}}}};
  const Json named = {{"type", "function"}, {"function", {{"name", "pick_color"}}}};
  int calls = 0, replies = 0;
  for (int seed = 0; seed < 12; ++seed) {
    const bool required = seed % 2 == 0;
    Json body = {{"messages", {{{"role", "user"}, {"content", "Use a tool."}}}},
                 {"tools", tools},
                 {"tool_choice", required ? Json("required") : named},
                 {"parallel_tool_calls", seed % 4 == 0},
                 {"temperature", 1.0},
                 {"seed", seed},
                 {"max_tokens", kMaxTokens}};
    const ::strata::testing::HttpReply reply = Post("/v1/chat/completions", body);
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json choice = Json::parse(reply.body)["choices"][0];
    ++replies;
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << reply.body;
    const Json& made = choice["message"]["tool_calls"];
    ASSERT_GE(made.size(), 1u) << reply.body;
    for (const Json& call : made) {
      const std::string name = call["function"]["name"];
      if (!required) EXPECT_EQ(name, "pick_color");
      ASSERT_TRUE(name == "get_person" || name == "pick_color") << name;
      const Json arguments = Json::parse(call["function"]["arguments"].get<std::string>());
      EXPECT_EQ(SchemaViolation(name == "get_person" ? weather : pick, arguments), "")
          << arguments.dump();
      ++calls;
    }
  }
  std::printf("forced tool calls: %d calls in %d replies, every one valid\n", calls, replies);
  // A response format beside a forced call is refused, naming it.
  const ::strata::testing::HttpReply both =
      Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                    {"tools", tools},
                                    {"tool_choice", "required"},
                                    {"response_format", {{"type", "json_object"}}}});
  ASSERT_EQ(both.status, 400) << both.body;
  EXPECT_EQ(Json::parse(both.body)["error"]["param"], "response_format");
}

TEST_F(StructuredOutputTest, BadFormatsAreRefusedByName) {
  auto schema_format = [](Json schema) {
    return Json{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}};
  };
  const ::strata::testing::HttpReply reply = Post(
      "/v1/completions",
      {{"prompt", "x"},
       {"response_format", schema_format({{"type", "integer"}, {"minimum", 9}, {"maximum", 1}})}});
  ASSERT_EQ(reply.status, 400) << reply.body;
  const Json error = Json::parse(reply.body)["error"];
  EXPECT_EQ(error["param"], "response_format");
  EXPECT_FALSE(error["message"].get<std::string>().empty());
  EXPECT_EQ(RefusedParam({{"guided_json", "{not json"}}), "guided_json");
  EXPECT_EQ(RefusedParam({{"guided_regex", "(ab"}}), "guided_regex");
  EXPECT_EQ(RefusedParam({{"guided_choice", Json::array()}}), "guided_choice");
  EXPECT_EQ(RefusedParam({{"response_format", {{"type", "xml"}}}}), "response_format");
  EXPECT_EQ(RefusedParam(
                {{"response_format",
                  {{"type", "json_schema"},
                   {"json_schema", {{"name", "x"}, {"schema", Json::object()}, {"extra", 1}}}}}}),
            "response_format.json_schema");
  EXPECT_EQ(RefusedParam({{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a"}}),
            "guided_regex");
  EXPECT_EQ(RefusedParam({{"response_format", {{"type", "json_object"}}}, {"min_tokens", 2}}),
            "min_tokens");
  EXPECT_EQ(RefusedParam({{"guided_grammar", "root ::= \"a\""}}), "guided_grammar");
  // Plain text is what a request without a format gets.
  EXPECT_EQ(Post("/v1/completions",
                 {{"prompt", "x"}, {"max_tokens", 2}, {"response_format", {{"type", "text"}}}})
                .status,
            200);
}

}  // namespace
}  // namespace strata
