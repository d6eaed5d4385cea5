// Log-probabilities through /v1/completions and /v1/chat/completions, over a FakeStepRunner
// whose logit rows are known (FakeStepRunner::RowLogit, with many ties): each value against a
// log softmax computed here, the alternatives' order, the echoed prompt's log-probabilities,
// streamed and whole answers, and the 400s.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/openai_api.h"

namespace strata {
namespace {

using ::strata::testing::Api;
using ::strata::testing::BodyOf;
using ::strata::testing::ExpectError;
using ::strata::testing::FakeStepRunner;
using ::strata::testing::HttpReply;
using ::strata::testing::Named;
using ::strata::testing::StreamEvents;

constexpr char kPrompt[] = "In the beginning God created";

// The log softmax of the runner's row peaked at `next`, the plain way.
std::vector<double> Reference(int32_t next, int64_t vocab) {
  std::vector<long double> logits(vocab);
  long double sum = 0;
  for (int64_t id = 0; id < vocab; ++id) {
    logits[id] = FakeStepRunner::RowLogit(next, id, /*shaped=*/true);
    sum += std::exp(logits[id]);
  }
  std::vector<double> out;
  for (long double x : logits) out.push_back(static_cast<double>(x - std::log(sum)));
  return out;
}

// Ids most likely first, ties by lower id.
std::vector<int32_t> Ranked(const std::vector<double>& logprobs) {
  std::vector<int32_t> ids(logprobs.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logprobs[a] > logprobs[b]; });
  return ids;
}

// A token's text (its bytes), and as a JSON answer carries it (a lone byte of a longer
// character replaced).
std::string RawText(const Api& api, int32_t id) {
  return *api.tokenizer().Decode({id}, /*skip_special_tokens=*/false);
}
std::string Text(const Api& api, int32_t id) {
  return Json::parse(Json(RawText(api, id)).dump(-1, ' ', false, Json::error_handler_t::replace))
      .get<std::string>();
}

// The greedy tokens the runner gives after `prompt`.
std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int count, int64_t vocab) {
  std::vector<int32_t> out;
  int32_t last = prompt.back();
  for (int k = 0; k < count; ++k) {
    last = FakeStepRunner::NextToken(last, std::ssize(prompt) - 1 + k, vocab);
    out.push_back(last);
  }
  return out;
}

// A completions top_logprobs entry: the `top` most likely tokens' texts and values in order,
// then `chosen`'s where it is not among them.
void ExpectCompletionTop(const Api& api, const Json& got, int32_t next, int32_t chosen, int top,
                         const std::string& where) {
  const std::vector<double> want = Reference(next, api.vocab());
  const std::vector<int32_t> ranked = Ranked(want);
  std::vector<int32_t> ids(ranked.begin(), ranked.begin() + top);
  if (std::find(ids.begin(), ids.end(), chosen) == ids.end()) ids.push_back(chosen);
  ASSERT_TRUE(got.is_object()) << where << ": " << got;
  ASSERT_EQ(got.size(), ids.size()) << where << ": " << got;
  size_t i = 0;
  for (const auto& [text, logprob] : got.items()) {
    EXPECT_EQ(text, Text(api, ids[i])) << where << " entry " << i;
    EXPECT_NEAR(logprob.get<double>(), want[ids[i]], 1e-4) << where << " entry " << i;
    ++i;
  }
}

TEST(OpenAiLogprobsTest, CompletionsLogprobsMatchTheReference) {
  Api api(Named("m"), /*with_tokenizer=*/true, /*shaped_logits=*/true);
  const std::vector<int32_t> prompt = {11, 12, 13};
  const std::vector<int32_t> tokens = Greedy(prompt, 4, api.vocab());
  // At most 10: the ties below the peak are then ids of ASCII text, each its own key.
  for (const int top : {0, 3, 10}) {
    const HttpReply reply = api.Post("/v1/completions", {{"model", "m"},
                                                         {"prompt", prompt},
                                                         {"max_tokens", 4},
                                                         {"temperature", 0},
                                                         {"ignore_eos", true},
                                                         {"logprobs", top}});
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json lp = BodyOf(reply)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), tokens.size()) << lp;
    ASSERT_EQ(lp["token_logprobs"].size(), tokens.size());
    ASSERT_EQ(lp["top_logprobs"].size(), tokens.size());
    ASSERT_EQ(lp["text_offset"].size(), tokens.size());
    EXPECT_EQ(lp["text_offset"][0], 0);
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string where = "top " + std::to_string(top) + " token " + std::to_string(k);
      EXPECT_EQ(lp["tokens"][k], Text(api, tokens[k])) << where;
      EXPECT_NEAR(lp["token_logprobs"][k].get<double>(),
                  Reference(tokens[k], api.vocab())[tokens[k]], 1e-4)
          << where;
      ExpectCompletionTop(api, lp["top_logprobs"][k], tokens[k], tokens[k], top, where);
      if (k > 0) EXPECT_GE(lp["text_offset"][k], lp["text_offset"][k - 1]) << where;
    }
  }
}

// Chat: `top_logprobs` alternatives exactly, with their bytes; the stream's chunks carry the
// same entries as the whole answer, each with its own token's.
TEST(OpenAiLogprobsTest, ChatTopLogprobsMatchTheReferenceWholeAndStreamed) {
  Api api(Named("m"), /*with_tokenizer=*/true, /*shaped_logits=*/true);
  const Json messages = Json::array({Json{{"role", "user"}, {"content", "Hello there"}}});
  const HttpReply tokenized = api.Post("/tokenize", {{"messages", messages}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  const std::vector<int32_t> prompt = BodyOf(tokenized)["tokens"].get<std::vector<int32_t>>();
  const std::vector<int32_t> tokens = Greedy(prompt, 5, api.vocab());
  Json request{{"model", "m"},       {"messages", messages}, {"max_tokens", 5},  {"temperature", 0},
               {"ignore_eos", true}, {"logprobs", true},     {"top_logprobs", 4}};
  const HttpReply whole = api.Post("/v1/chat/completions", request);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json content = BodyOf(whole)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), tokens.size()) << whole.body;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const std::string where = "token " + std::to_string(k);
    const std::vector<double> want = Reference(tokens[k], api.vocab());
    const std::vector<int32_t> ranked = Ranked(want);
    const std::string text = Text(api, tokens[k]);
    EXPECT_EQ(content[k]["token"], text) << where;
    EXPECT_NEAR(content[k]["logprob"].get<double>(), want[tokens[k]], 1e-4) << where;
    EXPECT_EQ(content[k]["bytes"].size(), RawText(api, tokens[k]).size()) << where;
    ASSERT_EQ(content[k]["top_logprobs"].size(), 4u) << where;
    for (size_t j = 0; j < 4; ++j) {
      const Json& alt = content[k]["top_logprobs"][j];
      EXPECT_EQ(alt["token"], Text(api, ranked[j])) << where << " alternative " << j;
      EXPECT_NEAR(alt["logprob"].get<double>(), want[ranked[j]], 1e-4) << where;
      std::string bytes;
      for (const Json& b : alt["bytes"]) bytes += static_cast<char>(b.get<int>());
      EXPECT_EQ(bytes, RawText(api, ranked[j])) << where;
    }
  }

  request["stream"] = true;
  const HttpReply streamed = api.Post("/v1/chat/completions", request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  Json gathered = Json::array();
  int token_chunks = 0;
  for (const Json& event : StreamEvents(streamed)) {
    const Json& choice = event["choices"][0];
    if (!choice["delta"].contains("content") || choice["delta"]["content"] == "") {
      continue;  // the role's opening, and the finish
    }
    ++token_chunks;
    ASSERT_TRUE(choice["logprobs"].is_object()) << event;
    EXPECT_FALSE(choice["logprobs"]["content"].empty()) << event;
    for (const Json& entry : choice["logprobs"]["content"]) gathered.push_back(entry);
  }
  EXPECT_GT(token_chunks, 0);
  EXPECT_EQ(gathered, content);
}

// echo: the prompt's text before the completion's; with logprobs its tokens come first, the
// first one's null, the others' from the prompt's own positions.
TEST(OpenAiLogprobsTest, EchoCarriesThePromptAndItsLogprobs) {
  Api api(Named("m"), /*with_tokenizer=*/true, /*shaped_logits=*/true);
  const std::vector<int32_t> prompt = *api.tokenizer().Encode(kPrompt, true);
  ASSERT_GE(prompt.size(), 3u);
  const std::vector<int32_t> tokens = Greedy(prompt, 3, api.vocab());
  const Json base{{"model", "m"},
                  {"prompt", kPrompt},
                  {"max_tokens", 3},
                  {"temperature", 0},
                  {"ignore_eos", true}};
  const HttpReply plain = api.Post("/v1/completions", base);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string completion = BodyOf(plain)["choices"][0]["text"];

  Json echo = base;
  echo["echo"] = true;
  const HttpReply text_only = api.Post("/v1/completions", echo);
  ASSERT_EQ(text_only.status, 200) << text_only.body;
  EXPECT_EQ(BodyOf(text_only)["choices"][0]["text"], kPrompt + completion);
  EXPECT_TRUE(BodyOf(text_only)["choices"][0]["logprobs"].is_null());

  echo["logprobs"] = 2;
  const HttpReply reply = api.Post("/v1/completions", echo);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const Json body = BodyOf(reply);
  EXPECT_EQ(body["choices"][0]["text"], kPrompt + completion);
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  const Json lp = body["choices"][0]["logprobs"];
  const size_t n = prompt.size();
  ASSERT_EQ(lp["tokens"].size(), n + tokens.size()) << lp;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string where = "prompt token " + std::to_string(i);
    EXPECT_EQ(lp["tokens"][i], Text(api, prompt[i])) << where;
    EXPECT_EQ(lp["text_offset"][i], offset) << where;
    offset += RawText(api, prompt[i]).size();
    if (i == 0) continue;
    // The row at position i - 1 gives token i.
    const int32_t next = FakeStepRunner::NextToken(prompt[i - 1], i - 1, api.vocab());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), Reference(next, api.vocab())[prompt[i]],
                1e-4)
        << where;
    ExpectCompletionTop(api, lp["top_logprobs"][i], next, prompt[i], 2, where);
  }
  for (size_t k = 0; k < tokens.size(); ++k) {
    EXPECT_NEAR(lp["token_logprobs"][n + k].get<double>(),
                Reference(tokens[k], api.vocab())[tokens[k]], 1e-4);
  }
  EXPECT_EQ(lp["text_offset"][n], std::string(kPrompt).size());

  // Streamed: the prompt's chunk first, then the tokens', the same entries in all.
  echo["stream"] = true;
  const std::vector<Json> events = StreamEvents(api.Post("/v1/completions", echo));
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["choices"][0]["text"], kPrompt);
  EXPECT_EQ(events[0]["choices"][0]["logprobs"]["tokens"].size(), n);
  std::string text;
  Json token_logprobs = Json::array();
  for (const Json& event : events) {
    const Json& choice = event["choices"][0];
    text += choice["text"].get<std::string>();
    if (choice["logprobs"].is_null()) continue;
    for (const Json& v : choice["logprobs"]["token_logprobs"]) token_logprobs.push_back(v);
  }
  EXPECT_EQ(text, kPrompt + completion);
  EXPECT_EQ(token_logprobs, lp["token_logprobs"]);
}

// max_tokens 0 with echo: the prompt alone, scored, nothing generated.
TEST(OpenAiLogprobsTest, EchoWithNoTokensScoresThePrompt) {
  Api api(Named("m"), /*with_tokenizer=*/true, /*shaped_logits=*/true);
  const std::vector<int32_t> prompt = *api.tokenizer().Encode(kPrompt, true);
  for (const bool logprobs : {false, true}) {
    Json request{{"model", "m"}, {"prompt", kPrompt}, {"max_tokens", 0}, {"echo", true}};
    if (logprobs) request["logprobs"] = 1;
    const HttpReply reply = api.Post("/v1/completions", request);
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json body = BodyOf(reply);
    EXPECT_EQ(body["choices"][0]["text"], kPrompt);
    EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(body["usage"]["completion_tokens"], 0);
    EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
    const Json lp = body["choices"][0]["logprobs"];
    if (!logprobs) {
      EXPECT_TRUE(lp.is_null());
      continue;
    }
    ASSERT_EQ(lp["token_logprobs"].size(), prompt.size());
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    const int32_t next = FakeStepRunner::NextToken(prompt[0], 0, api.vocab());
    EXPECT_NEAR(lp["token_logprobs"][1].get<double>(), Reference(next, api.vocab())[prompt[1]],
                1e-4);
  }
}

TEST(OpenAiLogprobsTest, OutOfRangeRequestsAreRefusedByField) {
  Api api(Named("m"));
  const Json messages = Json::array({Json{{"role", "user"}, {"content", "x"}}});
  ExpectError(api.Post("/v1/completions", {{"model", "m"}, {"prompt", "x"}, {"logprobs", 21}}), 400,
              "logprobs");
  ExpectError(api.Post("/v1/completions", {{"model", "m"}, {"prompt", "x"}, {"logprobs", -1}}), 400,
              "logprobs");
  ExpectError(
      api.Post("/v1/chat/completions",
               {{"model", "m"}, {"messages", messages}, {"logprobs", true}, {"top_logprobs", 21}}),
      400, "top_logprobs");
  ExpectError(api.Post("/v1/chat/completions",
                       {{"model", "m"}, {"messages", messages}, {"top_logprobs", 2}}),
              400, "top_logprobs");
  ExpectError(api.Post("/v1/completions", {{"model", "m"}, {"prompt", "x"}, {"max_tokens", 0}}),
              400, "max_tokens");
  Api ids_only(Named("m"), /*with_tokenizer=*/false);
  ExpectError(ids_only.Post("/v1/completions",
                            {{"model", "m"}, {"prompt", Json::array({1, 2})}, {"echo", true}}),
              400, "echo");
}

}  // namespace
}  // namespace strata
