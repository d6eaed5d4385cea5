// Loading a tiktoken tokenizer (Kimi-K2's tiktoken.model + tokenizer_config.json), its errors,
// its lookups, Tokenizer::FromModelDir's choice of files, and the pieces that the Rust-syntax
// regex and the long-text cutting make.  (Exact agreement with tiktoken is
// tokenizer_fixture_test's job, on tests/data/tokenizers/kimi-style.)
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/tiktoken_model.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using tokenizer_internal::ByteRange;
using tokenizer_internal::Regex;
using tokenizer_internal::TiktokenPieces;

std::string FixtureDir() { return std::string(STRATA_TEST_DATA_DIR) + "/tokenizers/kimi-style"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A rank table of the 256 single bytes (rank = byte) and then `extra` lines.
std::string ByteRanks(const std::string& extra = "") {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string text;
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&text, std::string(1, kAlphabet[b >> 2]),
                    std::string(1, kAlphabet[(b & 3) << 4]), "== ", b, "\n");
  }
  return text + extra;
}

absl::Status TiktokenError(const std::string& model, const std::string& config = "{}") {
  return Tokenizer::FromTiktoken(model, config, "m/tiktoken.model", "m/tokenizer_config.json")
      .status();
}

void ExpectError(const absl::Status& status, const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& part : parts) {
    EXPECT_TRUE(absl::StrContains(status.message(), part)) << status << "\n  lacks: " << part;
  }
}

// A fresh directory under the test's temporary directory.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_((fs::path(::testing::TempDir()) / ("tiktoken_test_" + name)).string()) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

TEST(TiktokenLoadTest, KimiStyleDirectory) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(FixtureDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.format(), Tokenizer::Format::kTiktoken);
  EXPECT_TRUE(absl::EndsWith(t.source_name(), "tiktoken.model")) << t.source_name();
  const int32_t first = t.vocab_size() - 256;  // the special tokens follow the ranks
  EXPECT_EQ(t.TokenId("[BOS]"), first);
  EXPECT_EQ(t.TokenId("[EOS]"), first + 1);
  EXPECT_EQ(t.TokenId("<|im_end|>"), first + 2);
  EXPECT_EQ(t.TokenId("[PAD]"), first + 255);
  EXPECT_EQ(t.IdToToken(first + 5), absl::StrCat("<|reserved_token_", first + 5, "|>"));
  EXPECT_TRUE(t.IsSpecial(first));
  EXPECT_TRUE(t.IsSpecial(first + 5));    // reserved
  EXPECT_FALSE(t.IsSpecial(first + 22));  // <think>, marked not special
  EXPECT_FALSE(t.IsSpecial(first - 1));   // a rank
  // Ranks by their byte-level form, as the Hugging Face tokenizer's vocabulary spells them.
  const std::optional<int32_t> space = t.TokenId("\xC4\xA0");  // "Ġ": the byte " "
  ASSERT_TRUE(space.has_value());
  EXPECT_EQ(t.Encode(" ").value(), std::vector<int32_t>{*space});
  EXPECT_EQ(t.IdToToken(*space), "\xC4\xA0");
  EXPECT_FALSE(t.TokenId(" ").has_value());
  // add_special_tokens adds nothing, as Kimi's encode.
  EXPECT_EQ(t.Encode("Hi", true).value(), t.Encode("Hi", false).value());
  EXPECT_FALSE(t.Decode({t.vocab_size()}).ok());
}

TEST(TiktokenLoadTest, FromModelDirPrefersTokenizerJson) {
  TempDir dir("prefers_json");
  WriteFile(dir.File("tiktoken.model"), "not base64 at all\n");
  WriteFile(dir.File("tokenizer.json"),
            ReadFile(std::string(STRATA_TEST_DATA_DIR) + "/tokenizers/qwen2-style/tokenizer.json"));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->format(), Tokenizer::Format::kTokenizerJson);
}

TEST(TiktokenLoadTest, MissingFilesAreNamed) {
  TempDir dir("missing");
  absl::Status none = Tokenizer::FromModelDir(dir.path()).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "tokenizer.json")) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "tiktoken.model")) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), dir.path())) << none;
  // A model without a tokenizer is no error to those that can do without one.
  absl::StatusOr<std::unique_ptr<Tokenizer>> if_any = Tokenizer::FromModelDirIfAny(dir.path());
  ASSERT_TRUE(if_any.ok()) << if_any.status();
  EXPECT_EQ(*if_any, nullptr);

  WriteFile(dir.File("tiktoken.model"), ByteRanks());
  absl::Status no_config = Tokenizer::FromModelDir(dir.path()).status();
  EXPECT_EQ(no_config.code(), absl::StatusCode::kFailedPrecondition) << no_config;
  EXPECT_EQ(Tokenizer::FromModelDirIfAny(dir.path()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_config.message(), dir.File("tokenizer_config.json")))
      << no_config;

  WriteFile(dir.File("tokenizer_config.json"), "{}");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 256 + 256);
  EXPECT_EQ((*tok)->TokenId("<|reserved_token_256|>"), 256);
  EXPECT_EQ((*tok)->Decode({104, 105, 256}).value(), "hi<|reserved_token_256|>");
  EXPECT_EQ((*tok)->Decode({104, 105, 256}, /*skip_special_tokens=*/true).value(), "hi");
}

TEST(TiktokenLoadTest, BadRankFilesNameTheLine) {
  ExpectError(TiktokenError(""), {"m/tiktoken.model", "no tokens"});
  ExpectError(TiktokenError(ByteRanks("aGk= 256 extra\n")),
              {"m/tiktoken.model: line 257", "<base64 token> <rank>"});
  ExpectError(TiktokenError(ByteRanks("aGk 256\n")),
              {"m/tiktoken.model: line 257", "\"aGk\" is not valid base64"});
  ExpectError(TiktokenError(ByteRanks("a*k= 256\n")), {"line 257", "not valid base64"});
  ExpectError(TiktokenError(ByteRanks("aGk= -1\n")), {"line 257", "rank \"-1\""});
  ExpectError(TiktokenError(ByteRanks("aGk= 12x\n")), {"line 257", "rank \"12x\""});
  ExpectError(TiktokenError(ByteRanks("aGk= 5\n")),
              {"m/tiktoken.model: line 257", "rank 5 is also the rank of line 6"});
  ExpectError(TiktokenError(ByteRanks("aA== 256\n")),
              {"line 257", "token \"aA==\" is also on line 105 (rank 104)"});
  ExpectError(TiktokenError(ByteRanks("aGk= 257\n")), {"no token has rank 256"});
  // A rank past the line count is refused before anything is sized for it.
  ExpectError(TiktokenError(ByteRanks("aGk= 60000000\n")),
              {"line 257", "rank \"60000000\"", "a rank per line"});
  std::string no_byte = ByteRanks();
  no_byte.erase(0, no_byte.find('\n') + 1);  // byte 0 gone: ranks 1..255
  ExpectError(TiktokenError(no_byte), {"no token has rank 0"});
  ExpectError(TiktokenError(no_byte + "aGk= 0\n"), {"byte 0x00 has no token"});
  // Blank lines and CRLF line ends are fine, as tiktoken's loader reads them.
  EXPECT_TRUE(TiktokenError(absl::StrCat("\n", ByteRanks("aGk= 256\r\n\n"))).ok());
}

TEST(TiktokenLoadTest, BadConfigsNameTheFileAndEntry) {
  ExpectError(TiktokenError(ByteRanks(), "{"), {"m/tokenizer_config.json", "not valid JSON"});
  ExpectError(TiktokenError(ByteRanks(), "[]"), {"m/tokenizer_config.json", "JSON object"});
  ExpectError(TiktokenError(ByteRanks(), R"({"added_tokens_decoder": []})"),
              {"m/tokenizer_config.json: added_tokens_decoder", "id -> token"});
  ExpectError(TiktokenError(ByteRanks(), R"({"added_tokens_decoder": {"x": {}}})"),
              {"added_tokens_decoder.x", "not a token id"});
  ExpectError(TiktokenError(ByteRanks(), R"({"added_tokens_decoder": {"256": "[BOS]"}})"),
              {"added_tokens_decoder.256", "\"content\""});
  ExpectError(TiktokenError(ByteRanks(), R"({"added_tokens_decoder": {"256": {"content": ""}}})"),
              {"added_tokens_decoder.256", "empty"});
  ExpectError(TiktokenError(ByteRanks(), R"({"added_tokens_decoder": {
                  "256": {"content": "[X]"}, "300": {"content": "[X]"}}})"),
              {"\"[X]\" is the content of both 256 and 300"});
  ExpectError(TiktokenError(ByteRanks(), R"({"added_tokens_decoder": {
                  "300": {"content": "<|reserved_token_256|>"}}})"),
              {"is the content of both 256 and 300"});
  // Ids outside the 256 after the ranks play no part, as in Kimi's tokenizer.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromTiktoken(
      ByteRanks(),
      R"({"added_tokens_decoder": {"3": {"content": "[A]"}, "600": {"content": "[B]"},
          "257": {"content": "[C]", "special": false}}})",
      "m", "c");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE((*tok)->TokenId("[A]").has_value());
  EXPECT_FALSE((*tok)->TokenId("[B]").has_value());
  EXPECT_EQ((*tok)->TokenId("[C]"), 257);
  EXPECT_EQ((*tok)->Encode("x[C]y").value(), (std::vector<int32_t>{'x', 257, 'y'}));
  EXPECT_EQ((*tok)->Decode({'x', 257, 258, 'y'}, true).value(), "x[C]y");
}

TEST(TiktokenBpeTest, MergesTheLowestRankFirst) {
  // "ab" (256) before "bc" (257): "abc" -> "ab" + "c"; "bcd" needs "bc" + "d" (258 ranks "bcd").
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromTiktoken(ByteRanks("YWI= 256\nYmM= 257\nYmNk 258\n"), "{}", "m", "c");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("abc").value(), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ((*tok)->Encode("abcd").value(), (std::vector<int32_t>{256, 'c', 'd'}));
  EXPECT_EQ((*tok)->Encode("bcd").value(), (std::vector<int32_t>{258}));  // a whole token
  EXPECT_EQ((*tok)->Encode("xbcd").value(), (std::vector<int32_t>{'x', 258}));
  EXPECT_EQ((*tok)->Encode("abab").value(), (std::vector<int32_t>{256, 256}));
}

// Kimi's pattern repeats lookahead groups over letters: the longest runs it sees (25,000
// characters) must not run out of regex stack.
TEST(TiktokenBpeTest, LongestLetterRunsEncodeAndDecodeBack) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(FixtureDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::string hangul, mixed_case, marks;
  for (int i = 0; i < 25'000; ++i) hangul += "가";
  for (int i = 0; i < 12'500; ++i) mixed_case += "Aa";
  for (int i = 0; i < 12'500; ++i) marks += "e\xCC\x81";  // e + combining acute
  for (const std::string& text : {hangul, mixed_case, marks, hangul + " " + mixed_case}) {
    absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ((*tok)->Decode(*ids).value(), text);
  }
}

TEST(RustRegexTest, TranslatesIntersectionsAndScripts) {
  absl::StatusOr<std::unique_ptr<Regex>> letters = Regex::CompileRust(R"([\p{L}&&[^\p{Han}]]+)");
  ASSERT_TRUE(letters.ok()) << letters.status();
  std::vector<ByteRange> found;
  ASSERT_TRUE((*letters)->FindAll("ab中cd", &found).ok());
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].end, 2u);
  EXPECT_EQ(found[1].start, 5u);

  // Script, not Script_Extensions: "、" is Common (its extensions include Han).
  absl::StatusOr<std::unique_ptr<Regex>> han = Regex::CompileRust(R"([\p{Han}]+)");
  ASSERT_TRUE(han.ok()) << han.status();
  found.clear();
  ASSERT_TRUE((*han)->FindAll("中文、世界", &found).ok());
  EXPECT_EQ(found.size(), 2u);

  absl::StatusOr<std::unique_ptr<Regex>> both = Regex::CompileRust(R"([a-z&&[aeiou]]+)");
  ASSERT_TRUE(both.ok()) << both.status();
  found.clear();
  ASSERT_TRUE((*both)->FindAll("xaeyou", &found).ok());
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].start, 1u);
  EXPECT_EQ(found[0].end, 3u);

  EXPECT_TRUE(Regex::CompileRust(tokenizer_internal::kKimiPattern).ok());
  for (const char* bad : {"[a[b]]", "[^a&&b]", "[[a]&&b]", "[a&&[b[c]]]", "[abc", "\\p{Nope}",
                          "[a-z--b]", "[a~~b]"}) {
    absl::Status status = Regex::CompileRust(bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(status.message(), bad)) << status;
  }
}

TEST(TiktokenPiecesTest, CutsLongRunsAndLongTexts) {
  EXPECT_TRUE(TiktokenPieces("").empty());
  EXPECT_EQ(TiktokenPieces("a b"), std::vector<absl::string_view>{"a b"});
  const std::string run(25'000, 'a');
  EXPECT_EQ(TiktokenPieces(run).size(), 1u);
  const std::string longer = run + "aa " + run;
  const std::vector<absl::string_view> pieces = TiktokenPieces(longer);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), 25'000u);
  EXPECT_EQ(pieces[1], "aa " + run);
  // Characters, not bytes; U+3000 is whitespace to Python.
  std::string han;
  for (int i = 0; i < 25'001; ++i) han += "中";
  EXPECT_EQ(TiktokenPieces(han).size(), 2u);
  std::string spaces;
  for (int i = 0; i < 25'001; ++i) spaces += "\xE3\x80\x80";
  EXPECT_EQ(TiktokenPieces(spaces + "x").size(), 2u);
  // Every 400,000 characters, even inside a short run.
  std::string text;
  while (text.size() < 400'010) text += "abcd ";
  const std::vector<absl::string_view> parts = TiktokenPieces(text);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].size(), 400'000u);
}

}  // namespace
}  // namespace strata
