// Loading errors, the lookup API, streaming behaviour and thread safety of strata::Tokenizer.
// (Exact agreement with Python `tokenizers` is tokenizer_fixture_test's job.)
#include "common/tokenizer/tokenizer.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/tokenizer/streaming_decoder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Json = nlohmann::json;

std::string FixturePath(const std::string& name) {
  return std::string(STRATA_TEST_DATA_DIR) + "/tokenizers/" + name + "/tokenizer.json";
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(FixturePath(name));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// A minimal valid BPE tokenizer.json that tests modify.
Json MinimalJson() {
  return Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
              "byte_fallback": false, "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}
  })");
}

absl::Status LoadError(const Json& json, const std::string& name = "test.json") {
  return Tokenizer::FromJson(json.dump(), name).status();
}

TEST(TokenizerLoadTest, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path = "/nonexistent/dir/tokenizer.json";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(tok.status().message(), path)) << tok.status();
}

TEST(TokenizerLoadTest, BadJsonIsInvalidArgumentAndNamesTheSource) {
  for (const char* text : {"", "{", "{\"model\": }", "[1, 2]", "\"just a string\""}) {
    absl::Status status = Tokenizer::FromJson(text, "broken/tokenizer.json").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(status.message(), "broken/tokenizer.json")) << status;
  }
}

TEST(TokenizerLoadTest, UnsupportedModelTypesAreRejectedByName) {
  for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
    Json json = MinimalJson();
    json["model"] = {{"type", type}, {"vocab", Json::array()}};
    absl::Status status = LoadError(json, "models/x/tokenizer.json");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << type;
    EXPECT_TRUE(absl::StrContains(status.message(), "models/x/tokenizer.json")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), type)) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "not supported")) << status;
  }
}

TEST(TokenizerLoadTest, UnsupportedComponentsAreRejectedWithTheirPath) {
  struct Case {
    const char* key;
    Json value;
    const char* expected;
  };
  const Case cases[] = {
      {"normalizer", {{"type", "BertNormalizer"}}, "normalizer"},
      {"normalizer",
       {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Precompiled"}}}}},
       "normalizer.normalizers[1]"},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}, "pre_tokenizer"},
      {"decoder", {{"type", "WordPiece"}}, "decoder"},
      {"post_processor", {{"type", "Mystery"}}, "post_processor"},
  };
  for (const Case& c : cases) {
    Json json = MinimalJson();
    json[c.key] = c.value;
    absl::Status status = LoadError(json);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.value.dump();
    EXPECT_TRUE(absl::StrContains(status.message(), std::string("test.json: ") + c.expected))
        << status;
  }
}

TEST(TokenizerLoadTest, BrokenValuesAreRejected) {
  std::vector<std::pair<std::string, Json>> cases;
  Json json = MinimalJson();
  json["model"]["merges"] = {"a c"};  // "c" is not in the vocabulary
  cases.emplace_back("model.merges[0]", json);
  json = MinimalJson();
  json["model"]["merges"] = {"a b c"};
  cases.emplace_back("model.merges[0]", json);
  json = MinimalJson();
  json["model"]["vocab"]["x"] = -3;
  cases.emplace_back("model.vocab", json);
  json = MinimalJson();
  json["model"]["dropout"] = 0.1;
  cases.emplace_back("model.dropout", json);
  json = MinimalJson();
  json["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"Regex", "(unclosed"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}};
  cases.emplace_back("pre_tokenizer.pattern", json);
  json = MinimalJson();
  json["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"String", " "}}},
                           {"behavior", "Sideways"},
                           {"invert", false}};
  cases.emplace_back("pre_tokenizer.behavior", json);
  json = MinimalJson();
  json["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
                            {"pair", Json::array()},
                            {"special_tokens", Json::object()}};
  cases.emplace_back("post_processor.single[0]", json);
  json = MinimalJson();
  json["version"] = "2.0";
  cases.emplace_back("version", json);
  for (const auto& [where, j] : cases) {
    absl::Status status = LoadError(j);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << where;
    EXPECT_TRUE(absl::StrContains(status.message(), "test.json: " + where)) << status;
  }
}

TEST(TokenizerLoadTest, MinimalTokenizerWorks) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(MinimalJson().dump(), "m");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 3);
  EXPECT_EQ(*(*tok)->Encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(*(*tok)->Encode("aab"), (std::vector<int32_t>{0, 2}));
  // Without unk_token an unknown character is dropped, and its neighbours merge.
  EXPECT_EQ(*(*tok)->Encode("axb"), (std::vector<int32_t>{2}));
  EXPECT_EQ(*(*tok)->Decode({0, 2}), "a ab");  // no decoder: tokens joined with spaces
}

TEST(TokenizerApiTest, LookupsOnQwenStyle) {
  std::unique_ptr<Tokenizer> tok = Load("qwen2-style");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 2000);
  const std::optional<int32_t> im_start = tok->TokenId("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  EXPECT_TRUE(tok->IsSpecial(*im_start));
  EXPECT_EQ(tok->IdToToken(*im_start), "<|im_start|>");
  const std::optional<int32_t> e_acute = tok->TokenId("Ã©");  // byte-level form of "é"
  ASSERT_TRUE(e_acute.has_value());
  EXPECT_FALSE(tok->IsSpecial(*e_acute));
  EXPECT_FALSE(tok->TokenId("no such token").has_value());
  EXPECT_FALSE(tok->IsSpecial(-1));
  EXPECT_FALSE(tok->IdToToken(tok->vocab_size()).has_value());
  // Qwen's post-processor adds nothing.
  EXPECT_EQ(*tok->Encode("Hello", true), *tok->Encode("Hello", false));
}

TEST(TokenizerApiTest, LlamaStyleAddsBos) {
  std::unique_ptr<Tokenizer> tok = Load("llama-style");
  ASSERT_NE(tok, nullptr);
  const int32_t bos = *tok->TokenId("<s>");
  EXPECT_TRUE(tok->IsSpecial(bos));
  std::vector<int32_t> with = *tok->Encode("Hello world", true);
  std::vector<int32_t> without = *tok->Encode("Hello world", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], bos);
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 1, with.end()), without);
  EXPECT_EQ(*tok->Decode(with, /*skip_special_tokens=*/true), "Hello world");
}

TEST(TokenizerApiTest, EncodeRejectsInvalidUtf8) {
  std::unique_ptr<Tokenizer> tok = Load("gpt2-style");
  ASSERT_NE(tok, nullptr);
  for (const char* text : {"\xff", "abc\xc3", "\xed\xa0\x80", "\xc0\xaf"}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TokenizerApiTest, DecodeRejectsOutOfRangeIds) {
  std::unique_ptr<Tokenizer> tok = Load("gpt2-style");
  ASSERT_NE(tok, nullptr);
  for (int32_t bad : {-1, tok->vocab_size(), 1 << 30}) {
    absl::StatusOr<std::string> text = tok->Decode(std::vector<int32_t>{5, bad});
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(text.status().message(), "out of range")) << text.status();
  }
}

TEST(TokenizerStreamingTest, HoldsBackSplitCharactersUntilComplete) {
  for (const char* name : {"qwen2-style", "llama-style"}) {
    std::unique_ptr<Tokenizer> tok = Load(name);
    ASSERT_NE(tok, nullptr);
    const std::string text = "Emoji 😀 and 中文 and ꙮ done";
    const std::vector<int32_t> ids = *tok->Encode(text);
    StreamingDecoder stream(*tok);
    std::string joined;
    int non_empty = 0;
    for (int32_t id : ids) {
      const std::string piece = stream.Add(id);
      EXPECT_FALSE(absl::StrContains(piece, "\xEF\xBF\xBD")) << name << ": " << piece;
      non_empty += piece.empty() ? 0 : 1;
      joined += piece;
    }
    EXPECT_GT(non_empty, 4) << name << ": text should arrive while streaming";
    joined += stream.Flush();
    EXPECT_EQ(joined, text) << name;
    EXPECT_EQ(joined, *tok->Decode(ids)) << name;
  }
}

TEST(TokenizerStreamingTest, FlushReleasesAnUnfinishedCharacterAndRestarts) {
  std::unique_ptr<Tokenizer> tok = Load("llama-style");
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = *tok->Encode("ꙮ");  // ▁ <0xEA> <0x99> <0xAE>
  ASSERT_GE(ids.size(), 3u);
  const std::vector<int32_t> cut(ids.begin(), ids.end() - 1);
  StreamingDecoder stream(*tok);
  std::string joined;
  for (int32_t id : cut) joined += stream.Add(id);
  joined += stream.Flush();
  EXPECT_EQ(joined, *tok->Decode(cut));
  // After Flush a new stream starts: its first token is decoded as a first token again.
  std::string again;
  const std::vector<int32_t> hello = *tok->Encode("Hello");
  for (int32_t id : hello) again += stream.Add(id);
  again += stream.Flush();
  EXPECT_EQ(again, "Hello");
}

TEST(TokenizerStreamingTest, SkipsSpecialTokensAndIgnoresBadIds) {
  std::unique_ptr<Tokenizer> tok = Load("qwen2-style");
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = *tok->Encode("<|im_start|>assistant\nSure: 😀<|im_end|>");
  StreamingDecoder stream(*tok, /*skip_special_tokens=*/true);
  std::string joined;
  for (int32_t id : ids) {
    joined += stream.Add(id);
    joined += stream.Add(-5);                 // ignored
    joined += stream.Add(tok->vocab_size());  // ignored
  }
  joined += stream.Flush();
  EXPECT_EQ(joined, *tok->Decode(ids, /*skip_special_tokens=*/true));
  EXPECT_EQ(joined, "assistant\nSure: 😀");
}

TEST(TokenizerConcurrencyTest, ManyThreadsEncodeTheSame) {
  std::unique_ptr<Tokenizer> tok = Load("qwen2-style");
  ASSERT_NE(tok, nullptr);
  std::string text;
  for (int i = 0; i < 50; ++i) {
    text += "Line " + std::to_string(i) + ": the quick brown fox, café 中文 😀\n";
  }
  const std::vector<int32_t> want = *tok->Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text);
        if (!ids.ok() || *ids != want) ++failures[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace strata
