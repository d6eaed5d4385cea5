// Checks strata::Tokenizer against what the Python `tokenizers` library (tiktoken for
// kimi-style) computed for the fixtures in tests/data/tokenizers/<name>/ (made by
// scripts/make_tokenizer_fixtures.py and scripts/make_tiktoken_fixture.py): Encode and Decode
// must agree exactly, and streaming decoding must concatenate to Decode.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/streaming_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Json = nlohmann::json;

std::string FixtureRoot() { return std::string(STRATA_TEST_DATA_DIR) + "/tokenizers"; }

std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(FixtureRoot(), error)) {
    if (std::filesystem::exists(entry.path() / "expected.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Shows control characters and non-ASCII bytes in failure messages.
std::string Escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out.size() > 300 ? out.substr(0, 300) + "..." : out;
}

std::string StreamDecode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamingDecoder stream(tok, skip);
  std::string text;
  for (int32_t id : ids) text += stream.Add(id);
  text += stream.Flush();
  return text;
}

// A case's text: "text", or "text_parts" ([piece, count] pairs) for long texts.
std::string CaseText(const Json& c) {
  if (c.contains("text")) return c["text"].get<std::string>();
  std::string text;
  for (const Json& part : c["text_parts"]) {
    const std::string piece = part[0].get<std::string>();
    for (int i = part[1].get<int>(); i > 0; --i) text += piece;
  }
  return text;
}

// Checks one block of expectations ("cases" and "decode_cases") against `tok`.
void CheckExpectations(const Tokenizer& tok, const Json& expected, const std::string& label) {
  ASSERT_TRUE(expected.contains("cases")) << label;
  int case_index = 0;
  for (const Json& c : expected["cases"]) {
    const std::string text = CaseText(c);
    const bool add_special = c["add_special_tokens"].get<bool>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::string where = absl::StrCat(label, " case ", case_index++, " \"", Escape(text),
                                           "\" add_special_tokens=", add_special);
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, add_special);
    ASSERT_TRUE(ids.ok()) << where << ": " << ids.status();
    EXPECT_EQ(*ids, want) << where << "\n  got:  " << absl::StrJoin(*ids, ",")
                          << "\n  want: " << absl::StrJoin(want, ",");
    for (const bool skip : {false, true}) {
      // Long texts leave their decoded text out: it is the text itself.
      const char* key = skip ? "decoded_skip_special" : "decoded";
      const std::string want_text = c.contains(key) ? c[key].get<std::string>() : text;
      absl::StatusOr<std::string> decoded = tok.Decode(want, skip);
      ASSERT_TRUE(decoded.ok()) << where << ": " << decoded.status();
      EXPECT_EQ(*decoded, want_text)
          << where << " skip_special_tokens=" << skip << "\n  got:  " << Escape(*decoded)
          << "\n  want: " << Escape(want_text);
      EXPECT_EQ(StreamDecode(tok, want, skip), want_text)
          << where << " streaming, skip_special_tokens=" << skip;
    }
  }
  int decode_index = 0;
  for (const Json& c : expected["decode_cases"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    const std::string where =
        absl::StrCat(label, " decode case ", decode_index++, " [", absl::StrJoin(ids, ","), "]");
    for (const bool skip : {false, true}) {
      const std::string want_text = c[skip ? "decoded_skip_special" : "decoded"].get<std::string>();
      absl::StatusOr<std::string> decoded = tok.Decode(ids, skip);
      ASSERT_TRUE(decoded.ok()) << where << ": " << decoded.status();
      EXPECT_EQ(*decoded, want_text)
          << where << " skip_special_tokens=" << skip << "\n  got:  " << Escape(*decoded)
          << "\n  want: " << Escape(want_text);
      EXPECT_EQ(StreamDecode(tok, ids, skip), want_text)
          << where << " streaming, skip_special_tokens=" << skip;
    }
  }
}

class TokenizerFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Dir() const { return FixtureRoot() + "/" + GetParam(); }
  Json Expected() const { return Json::parse(ReadFile(Dir() + "/expected.json")); }
};

TEST_P(TokenizerFixtureTest, EncodeAndDecodeMatchPythonTokenizers) {
  const Json expected = Expected();
  // The directory as a model's: tokenizer.json, or tiktoken.model with tokenizer_config.json.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(Dir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->format(), expected["tokenizer"] == "tiktoken.model"
                                  ? Tokenizer::Format::kTiktoken
                                  : Tokenizer::Format::kTokenizerJson);
  EXPECT_EQ((*tok)->vocab_size(), expected["vocab_size"].get<int32_t>());
  CheckExpectations(**tok, expected, GetParam());
}

TEST_P(TokenizerFixtureTest, VariantsMatchPythonTokenizers) {
  const Json expected = Expected();
  if (!expected.contains("variants")) return;  // kimi-style has none
  const Json base = Json::parse(ReadFile(Dir() + "/" + expected["tokenizer"].get<std::string>()));
  for (const Json& variant : expected["variants"]) {
    const std::string label = absl::StrCat(GetParam(), "/", variant["name"].get<std::string>());
    Json patched = base;
    for (const auto& [pointer, value] : variant["set"].items()) {
      patched[Json::json_pointer(pointer)] = value;
    }
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(patched.dump(), label);
    ASSERT_TRUE(tok.ok()) << tok.status();
    CheckExpectations(**tok, variant, label);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerFixtureTest, ::testing::ValuesIn(FixtureNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(TokenizerFixtureListTest, FixturesArePresent) {
  const std::vector<std::string> names = FixtureNames();
  for (const char* name : {"gpt2-style", "qwen2-style", "o200k-style", "llama-style",
                           "metaspace-style", "kimi-style"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
}

}  // namespace
}  // namespace strata
