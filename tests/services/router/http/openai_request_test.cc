#include "services/router/http/openai_request.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(OpenAiRequestTest, Completion) {
  auto r = ParseOpenAiRequest(R"({"model": "m", "prompt": "Once", "max_tokens": 8,
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n", "."],
      "stream": true, "stream_options": {"include_usage": true}, "logprobs": 0})",
                              false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->prompt_text, "Once");
  EXPECT_EQ(r->max_tokens, 8);
  EXPECT_EQ(r->sampling.temperature, 0.5);
  EXPECT_EQ(r->sampling.top_p, 0.9);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.seed, 7u);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n", "."}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 0);
}

TEST(OpenAiRequestTest, DefaultsAndPromptForms) {
  auto r = ParseOpenAiRequest(R"({"model": "m", "prompt": [1, 2, 3], "stop": "x"})", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(r->prompt_text.has_value());
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_FALSE(r->sampling.temperature.has_value());  // kOpenAiTemperature when made a spec
  EXPECT_FALSE(r->sampling.seed.has_value());
  EXPECT_EQ(r->stop, (std::vector<std::string>{"x"}));
  EXPECT_FALSE(r->logprobs);
  r = ParseOpenAiRequest(R"({"model": "m", "prompt": ["one"]})", false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_text, "one");
}

TEST(OpenAiRequestTest, Chat) {
  auto r = ParseOpenAiRequest(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
      "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 1,
      "chat_template_kwargs": {"enable_thinking": false}})",
                              true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1]["content"], "Hi there");
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 1);
  EXPECT_EQ(r->template_variables["enable_thinking"], false);
}

TEST(OpenAiRequestTest, VllmSamplingExtras) {
  auto r = ParseOpenAiRequest(R"({"model": "m", "prompt": "x", "min_p": 0.05,
      "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.5,
      "logit_bias": {"17": 100, "3": -100}, "min_tokens": 4, "stop_token_ids": [2, 9],
      "include_stop_str_in_output": true, "skip_special_tokens": false,
      "response_format": {"type": "text"}})",
                              false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.min_p, 0.05);
  EXPECT_EQ(r->sampling.repetition_penalty, 1.2);
  EXPECT_EQ(r->sampling.presence_penalty, 0.5);
  EXPECT_EQ(r->sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r->sampling.logit_bias,
            (std::vector<std::pair<int64_t, double>>{{17, 100.0}, {3, -100.0}}));
  EXPECT_EQ(r->sampling.min_tokens, 4);
  EXPECT_EQ(r->sampling.stop_token_ids, (std::vector<int64_t>{2, 9}));
  EXPECT_EQ(r->sampling.include_stop_str_in_output, true);
  EXPECT_EQ(r->sampling.skip_special_tokens, false);
  // Zero penalties and an empty bias are the defaults, as before.
  r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "presence_penalty": 0, "frequency_penalty": 0,
          "logit_bias": {}})",
      false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->sampling.logit_bias.empty());
  EXPECT_FALSE(r->sampling.skip_special_tokens.has_value());
}

// The error's param and HTTP status, as the API reports them.
void ExpectError(const std::string& body, bool chat, const std::string& param, int status = 400) {
  auto r = ParseOpenAiRequest(body, chat);
  ASSERT_FALSE(r.ok()) << body;
  const ApiError e = ToApiError(r.status());
  EXPECT_EQ(e.status, status) << body;
  EXPECT_EQ(e.param, param) << body << ": " << r.status();
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_FALSE(e.message.empty());
}

// Completions' `logprobs: N` and chat's `top_logprobs: N` take 0..20 alternatives; chat's
// needs `logprobs: true`. `echo` on both (max_tokens 0 with it: the completions' only).
TEST(OpenAiRequestTest, LogprobsAndEcho) {
  for (const int n : {0, 1, 5, 20}) {
    auto r = ParseOpenAiRequest(
        absl::StrCat(R"({"model": "m", "prompt": "x", "logprobs": )", n, "}"), false);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->logprobs);
    EXPECT_EQ(r->top_logprobs, n);
    r = ParseOpenAiRequest(
        absl::StrCat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "logprobs": true, "top_logprobs": )",
                     n, "}"),
        true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->logprobs);
    EXPECT_EQ(r->top_logprobs, n);
  }
  auto r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 2})", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo);
  EXPECT_EQ(r->max_tokens, 0);
  r = ParseOpenAiRequest(R"({"model": "m", "prompt": "x", "echo": false})", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->echo);
  r = ParseOpenAiRequest(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                             "echo": true})",
                         true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo);
  // Out of range, of the wrong type, or without what it needs: a 400 naming the field.
  for (const char* n : {"21", "-1", "100", "1.5", "\"3\"", "true"}) {
    ExpectError(absl::StrCat(R"({"model": "m", "prompt": "x", "logprobs": )", n, "}"), false,
                "logprobs");
    ExpectError(absl::StrCat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                 "logprobs": true, "top_logprobs": )",
                             n, "}"),
                true, "top_logprobs");
  }
  const ApiError e = ToApiError(
      ParseOpenAiRequest(R"({"model": "m", "prompt": "x", "logprobs": 21})", false).status());
  EXPECT_NE(e.message.find("[0, 20]"), std::string::npos) << e.message;
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "top_logprobs": 2})",
              true, "top_logprobs");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "logprobs": false, "top_logprobs": 2})",
              true, "top_logprobs");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "echo": true,
                  "max_tokens": 0})",
              true, "max_tokens");
  ExpectError(R"({"model": "m", "prompt": "x", "echo": 1})", false, "echo");
  ExpectError(R"({"model": "m", "prompt": "x", "echo": false, "max_tokens": 0})", false,
              "max_tokens");
  ExpectError(R"({"model": "m", "prompt": "x", "echo": true, "max_tokens": -1})", false,
              "max_tokens");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "max_tokens": 0})",
              true, "max_tokens");
}

TEST(OpenAiRequestTest, Errors) {
  ExpectError("{not json", false, "");
  ExpectError("[1]", false, "");
  ExpectError(R"({"prompt": "x"})", false, "model");
  ExpectError(R"({"model": "m"})", false, "prompt");
  ExpectError(R"({"model": "m"})", true, "messages");
  ExpectError(R"({"model": "m", "messages": []})", true, "messages");
  ExpectError(R"({"model": "m", "messages": [{"content": "x"}]})", true, "messages[0].role");
  ExpectError(
      R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true,
      "messages[0].content");
  ExpectError(R"({"model": "m", "prompt": ["a", "b"]})", false, "prompt");
  ExpectError(R"({"model": "m", "prompt": "x", "n": 17})", false, "n");
  ExpectError(R"({"model": "m", "prompt": "x", "max_tokens": 0})", false, "max_tokens");
  ExpectError(R"({"model": "m", "prompt": "x", "temperature": 3})", false, "temperature");
  ExpectError(R"({"model": "m", "prompt": "x", "top_p": 0})", false, "top_p");
  ExpectError(R"({"model": "m", "prompt": "x", "stop": 5})", false, "stop");
  ExpectError(R"({"model": "m", "prompt": "x", "stream": "yes"})", false, "stream");
  ExpectError(R"({"model": "m", "prompt": "x", "logprobs": true})", false, "logprobs");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 1})",
              true, "logprobs");
  ExpectError(R"({"model": "m", "prompt": "x", "presence_penalty": 3})", false, "presence_penalty");
  ExpectError(R"({"model": "m", "prompt": "x", "frequency_penalty": "1"})", false,
              "frequency_penalty");
  ExpectError(R"({"model": "m", "prompt": "x", "repetition_penalty": 0})", false,
              "repetition_penalty");
  ExpectError(R"({"model": "m", "prompt": "x", "min_p": 2})", false, "min_p");
  ExpectError(R"({"model": "m", "prompt": "x", "logit_bias": {"5": 101}})", false, "logit_bias");
  ExpectError(R"({"model": "m", "prompt": "x", "logit_bias": {"a": 1}})", false, "logit_bias");
  ExpectError(R"({"model": "m", "prompt": "x", "logit_bias": {"-1": 1}})", false, "logit_bias");
  ExpectError(R"({"model": "m", "prompt": "x", "logit_bias": [1]})", false, "logit_bias");
  ExpectError(R"({"model": "m", "prompt": "x", "min_tokens": -1})", false, "min_tokens");
  ExpectError(R"({"model": "m", "prompt": "x", "stop_token_ids": [-1]})", false, "stop_token_ids");
  ExpectError(R"({"model": "m", "prompt": "x", "stop_token_ids": 3})", false, "stop_token_ids");
  ExpectError(R"({"model": "m", "prompt": "x", "skip_special_tokens": 1})", false,
              "skip_special_tokens");
  ExpectError(R"({"model": "m", "prompt": "x", "include_stop_str_in_output": "y"})", false,
              "include_stop_str_in_output");
  ExpectError(R"({"model": "m", "prompt": "x", "response_format": {"type": "xml"}})", false,
              "response_format");
  ExpectError(R"({"model": "m", "prompt": "x", "response_format": {"type": "json_schema"}})", false,
              "response_format");
  ExpectError(R"({"model": "m", "prompt": "x", "guided_json": 5})", false, "guided_json");
  ExpectError(R"({"model": "m", "prompt": "x", "guided_regex": ["a+"]})", false, "guided_regex");
  ExpectError(R"({"model": "m", "prompt": "x", "guided_choice": ["a", 1]})", false,
              "guided_choice");
  ExpectError(R"({"model": "m", "prompt": "x", "guided_grammar": "root ::= \"a\""})", false,
              "guided_grammar");
  ExpectError(R"({"model": "m", "prompt": "x", "guided_json": {}, "guided_regex": "a"})", false,
              "guided_regex");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]})",
              true, "tools[0]");
}

// Every key is read or refused: one no endpoint knows (or the other endpoint's) is a 400
// naming each, not an option silently dropped.
TEST(OpenAiRequestTest, UnknownKeysAreNamed) {
  auto r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "use_beam_search": true, "length_penalty": 1})", false);
  ASSERT_FALSE(r.ok());
  const ApiError e = ToApiError(r.status());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "use_beam_search");
  EXPECT_NE(e.message.find("'use_beam_search', 'length_penalty'"), std::string::npos) << e.message;
  ExpectError(R"({"model": "m", "prompt": "x", "max_completion_tokens": 2})", false,
              "max_completion_tokens");
  ExpectError(R"({"model": "m", "prompt": "x", "top_logprobs": 1})", false, "top_logprobs");
  ExpectError(R"({"model": "m", "prompt": "x", "messages": []})", false, "messages");
  ExpectError(R"({"model": "m", "prompt": "x", "add_generation_prompt": true})", false,
              "add_generation_prompt");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt": "x"})",
              true, "prompt");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "continue_final_message": true})",
              true, "continue_final_message");
  // A null is a value too: the key is still one nothing reads.
  ExpectError(R"({"model": "m", "prompt": "x", "priority": null})", false, "priority");
  // OpenAI's own keys that change nothing here are read: an end user's id, tool settings
  // without tools.
  r = ParseOpenAiRequest(R"({"model": "m", "prompt": "x", "user": "u-1"})", false);
  EXPECT_TRUE(r.ok()) << r.status();
  r = ParseOpenAiRequest(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "tools": [], "tool_choice": "none", "parallel_tool_calls": true, "user": "u"})",
                         true);
  EXPECT_TRUE(r.ok()) << r.status();
  ExpectError(R"({"model": "m", "prompt": "x", "user": 5})", false, "user");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "tool_choice": "required"})",
              true, "tool_choice");
  ExpectError(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "parallel_tool_calls": "yes"})",
              true, "parallel_tool_calls");
}

TEST(OpenAiRequestTest, ModelNotFound) {
  const ApiError e = ToApiError(ModelNotFound("a", "b"));
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(e.message, "the model 'a' does not exist; this server has 'b'");
}

// JSON nested deeper than any request needs is refused before it is parsed or used (templates
// and conversions of its values recurse): 100,000 levels in a 200 KB body once crashed the
// router. Brackets inside strings do not count.
TEST(OpenAiRequestTest, DeepNestingIsRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ExpectError(
      R"({"model": "m", "messages": [{"role": "user", "content": "hi", "x": )" + deep + "}]}", true,
      "");
  ExpectError(R"({"model": "m", "prompt": "x", "chat_template_kwargs": )" + deep + "}", false, "");
  auto r =
      ParseOpenAiRequest(R"({"model": "m", "prompt": ")" + std::string(1000, '[') + R"("})", false);
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(OpenAiRequestTest, ErrorBodyAndStatusMapping) {
  ApiError e = ToApiError(BadParam("prompt", "too \"long\"", "context_length_exceeded"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(ErrorBody(e), R"({"error":{"message":"too \"long\"","type":"invalid_request_error",)"
                          R"("param":"prompt","code":"context_length_exceeded"}})");
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("full")).status, 429);
  EXPECT_EQ(ToApiError(absl::NotFoundError("no")).status, 404);
  EXPECT_EQ(ToApiError(absl::UnavailableError("draining")).status, 503);
  EXPECT_EQ(ErrorBody(ToApiError(absl::InternalError("x"))),
            R"({"error":{"message":"x","type":"server_error","param":null,"code":null}})");
}

// The structured-output fields, read into one ResponseFormat; the grammar is compiled later.
TEST(OpenAiRequestTest, ResponseFormatsAreRead) {
  auto schema = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "response_format": {"type": "json_schema",
          "json_schema": {"name": "p", "strict": true, "schema": {"type": "object"}}}})",
      false);
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->format.param, "response_format");
  EXPECT_EQ(schema->format.format.type, ResponseFormat::Type::kJsonSchema);
  EXPECT_EQ(schema->format.format.json_schema, R"({"type":"object"})");
  auto object = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "response_format": {"type": "json_object"}})", false);
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object->format.format.type, ResponseFormat::Type::kJsonObject);
  auto text = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "response_format": {"type": "text"}})", false);
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->format.format.constrained());
  auto choice = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "x", "guided_choice": ["yes", "no"],
          "guided_decoding_backend": "xgrammar"})",
      false);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->format.param, "guided_choice");
  EXPECT_EQ(choice->format.format.choices, (std::vector<std::string>{"yes", "no"}));
  auto guided = ParseOpenAiRequest(R"({"model": "m", "prompt": "x", "guided_json": "{}"})", false);
  ASSERT_TRUE(guided.ok());
  EXPECT_EQ(guided->format.format.json_schema, "{}");
}

}  // namespace
}  // namespace strata
