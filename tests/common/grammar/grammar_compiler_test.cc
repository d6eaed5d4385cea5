// GrammarCompiler on a vocabulary small enough to list every allowed token: the masks allow
// exactly the valid continuations, and a complete output ends with the end-of-sequence token.
#include "common/grammar/grammar_compiler.h"

#include <cmath>
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

constexpr int kModelVocab = 30;  // logit rows beyond the tokenizer's ids, as models pad theirs

// Byte-level BPE (GPT-2's alphabet: "Ġ" is a space, "Ċ" a newline).
const std::vector<std::string> kTokens = {
    "<|end|>", "{", "}", "\"",  ":",    ",", "a", "b", "1", "2",  "true", "false",
    "\"a\"",   "Ġ", "x", "{\"", "null", "[", "]", "-", "0", "ĠĠ", "Ċ"};
// Ids of kTokens; kEnd is the end-of-sequence token.
enum Id {
  kEnd,
  kOpen,
  kClose,
  kQuote,
  kColon,
  kComma,
  kA,
  kB,
  kOne,
  kTwo,
  kTrue,
  kFalse,
  kQuotedA,
  kSpace,
  kX,
  kOpenQuote,
  kNull,
  kOpenList,
  kCloseList,
  kMinus,
  kZero
};

std::string TokenizerJson() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 1; id < kTokens.size(); ++id) vocab[kTokens[id]] = id;
  nlohmann::ordered_json byte_level = {{"type", "ByteLevel"},
                                       {"add_prefix_space", false},
                                       {"trim_offsets", true},
                                       {"use_regex", true}};
  return nlohmann::ordered_json{{"version", "1.0"},
                                {"added_tokens",
                                 {{{"id", 0},
                                   {"content", kTokens[0]},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", true}}}},
                                {"normalizer", nullptr},
                                {"pre_tokenizer", byte_level},
                                {"post_processor", nullptr},
                                {"decoder", byte_level},
                                {"model",
                                 {{"type", "BPE"},
                                  {"dropout", nullptr},
                                  {"unk_token", nullptr},
                                  {"continuing_subword_prefix", nullptr},
                                  {"end_of_word_suffix", nullptr},
                                  {"fuse_unk", false},
                                  {"byte_fallback", false},
                                  {"ignore_merges", false},
                                  {"vocab", vocab},
                                  {"merges", nlohmann::ordered_json::array()}}}}
      .dump();
}

class GrammarCompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GrammarCompiler::available()) {
      GTEST_SKIP() << "built without xgrammar (scripts/fetch_xgrammar.sh fetches it)";
    }
    json_ = TokenizerJson();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromJson(json_, "tiny");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    absl::StatusOr<std::unique_ptr<GrammarCompiler>> compiler =
        GrammarCompiler::Create({.tokenizer = tokenizer_.get(),
                                 .tokenizer_json = json_,
                                 .eos_token_ids = {kEnd},
                                 .vocab_size = kModelVocab});
    ASSERT_TRUE(compiler.ok()) << compiler.status();
    compiler_ = *std::move(compiler);
  }

  std::unique_ptr<TokenConstraint> Start(const ResponseFormat& format) {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> grammar = compiler_->Compile(format);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    return grammar.ok() ? (*grammar)->NewConstraint() : nullptr;
  }

  // Takes `tokens` in order, each one allowed.
  static void AcceptAll(TokenConstraint& constraint, std::initializer_list<int> tokens) {
    for (int token : tokens) ASSERT_TRUE(constraint.Accept(token)) << kTokens[token];
  }

  // The tokens the constraint lets through now.
  static std::set<int> Allowed(TokenConstraint& constraint) {
    std::vector<float> logits(kModelVocab, 1.0f);
    constraint.MaskLogits(logits.data(), kModelVocab);
    std::set<int> allowed;
    for (int i = 0; i < kModelVocab; ++i) {
      if (std::isfinite(logits[i])) {
        EXPECT_EQ(logits[i], 1.0f) << "an allowed logit is left as it was";
        allowed.insert(i);
      }
    }
    return allowed;
  }

  std::string json_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GrammarCompiler> compiler_;
};

TEST_F(GrammarCompilerTest, RegexMasksAllowExactlyTheValidContinuations) {
  std::unique_ptr<TokenConstraint> c = Start(ResponseFormat::Regex("(ab|ba)"));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Allowed(*c), (std::set<int>{kA, kB}));
  EXPECT_FALSE(c->Accept(kX));  // refused, the state unchanged
  ASSERT_TRUE(c->Accept(kA));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kB}));
  ASSERT_TRUE(c->Accept(kB));
  EXPECT_FALSE(c->terminated());
  EXPECT_EQ(Allowed(*c), (std::set<int>{kEnd}));  // complete: only the end may come
  ASSERT_TRUE(c->Accept(kEnd));
  EXPECT_TRUE(c->terminated());
  EXPECT_EQ(Allowed(*c), (std::set<int>{}));
  EXPECT_FALSE(c->Accept(kA));
}

TEST_F(GrammarCompilerTest, SchemaStepsThroughARequiredInteger) {
  const ResponseFormat format = ResponseFormat::JsonSchema(
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  std::unique_ptr<TokenConstraint> c = Start(format);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Allowed(*c), (std::set<int>{kOpen, kOpenQuote}));
  ASSERT_TRUE(c->Accept(kOpen));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kQuote, kQuotedA}));  // "a" is required: no "}"
  EXPECT_FALSE(c->Accept(kClose));
  ASSERT_TRUE(c->Accept(kQuotedA));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kColon}));
  ASSERT_TRUE(c->Accept(kColon));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kSpace}));  // the ": " separator, no other whitespace
  ASSERT_TRUE(c->Accept(kSpace));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kOne, kTwo, kMinus, kZero}));
  ASSERT_TRUE(c->Accept(kOne));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kOne, kTwo, kZero, kClose}));
  ASSERT_TRUE(c->Accept(kClose));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kEnd}));
  ASSERT_TRUE(c->Accept(kEnd));
  EXPECT_TRUE(c->terminated());
}

TEST_F(GrammarCompilerTest, IntegerBoundsAndEnumsNarrowTheMask) {
  std::unique_ptr<TokenConstraint> c = Start(
      ResponseFormat::JsonSchema(R"({"type": "object", "properties": {"a": {"enum": ["b", "x"]},
                          "b": {"type": "integer", "minimum": 1, "maximum": 2}},
                          "required": ["a", "b"]})"));
  ASSERT_NE(c, nullptr);
  AcceptAll(*c, {kOpenQuote, kA, kQuote, kColon, kSpace, kQuote});
  EXPECT_EQ(Allowed(*c), (std::set<int>{kB, kX}));
  AcceptAll(*c, {kX, kQuote, kComma, kSpace, kQuote, kB, kQuote, kColon, kSpace});
  EXPECT_EQ(Allowed(*c), (std::set<int>{kOne, kTwo}));
  ASSERT_TRUE(c->Accept(kTwo));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kClose}));
}

TEST_F(GrammarCompilerTest, JsonObjectTakesAnyObjectAndNothingElse) {
  std::unique_ptr<TokenConstraint> c = Start(ResponseFormat::JsonObject());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Allowed(*c), (std::set<int>{kOpen, kOpenQuote}));
  EXPECT_FALSE(c->Accept(kOpenList));
  EXPECT_FALSE(c->Accept(kTrue));
  ASSERT_TRUE(c->Accept(kOpen));
  ASSERT_TRUE(c->Accept(kClose));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kEnd}));
  // Any property and value.
  std::unique_ptr<TokenConstraint> d = Start(ResponseFormat::JsonObject());
  AcceptAll(*d,
            {kOpenQuote, kX, kQuote, kColon, kSpace, kOpenList, kNull, kCloseList, kClose, kEnd});
  EXPECT_TRUE(d->terminated());
}

TEST_F(GrammarCompilerTest, ChoiceAllowsOnlyTheChoices) {
  std::unique_ptr<TokenConstraint> c = Start(ResponseFormat::Choice({"true", "false"}));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Allowed(*c), (std::set<int>{kTrue, kFalse}));
  ASSERT_TRUE(c->Accept(kFalse));
  EXPECT_EQ(Allowed(*c), (std::set<int>{kEnd}));
}

TEST_F(GrammarCompilerTest, PaddedLogitRowsAreNeverAllowed) {
  std::unique_ptr<TokenConstraint> c = Start(ResponseFormat::JsonObject());
  ASSERT_NE(c, nullptr);
  for (int token : Allowed(*c)) EXPECT_LT(token, static_cast<int>(kTokens.size()));
}

TEST_F(GrammarCompilerTest, InvalidFormatsAreRefusedWithTheEnginesMessage) {
  for (const ResponseFormat& bad :
       {ResponseFormat::JsonSchema("{not json"),
        ResponseFormat::JsonSchema(R"({"type": "integer", "minimum": 5, "maximum": 1})"),
        ResponseFormat::Regex("(ab")}) {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> compiled = compiler_->Compile(bad);
    EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.json_schema << bad.regex;
    EXPECT_FALSE(compiled.status().message().empty());
  }
}

TEST_F(GrammarCompilerTest, CompiledGrammarsAreCachedByFormat) {
  const ResponseFormat format = ResponseFormat::Regex("a+");
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> first = compiler_->Compile(format);
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> second = compiler_->Compile(format);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(compiler_->cache_stats().hits, 1);
  // Each request gets its own state.
  std::unique_ptr<TokenConstraint> a = (*first)->NewConstraint(), b = (*first)->NewConstraint();
  ASSERT_TRUE(a->Accept(kA));
  ASSERT_TRUE(a->Accept(kEnd));
  EXPECT_TRUE(a->terminated());
  EXPECT_FALSE(b->terminated());
  EXPECT_EQ(Allowed(*b), (std::set<int>{kA}));
}

// A tiktoken tokenizer (Kimi's) has no tokenizer.json: its byte-level token strings are enough.
TEST(GrammarVocabularyTest, TiktokenVocabularyStepsThroughItsOwnEncoding) {
  if (!GrammarCompiler::available()) GTEST_SKIP() << "built without xgrammar";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromModelDir(std::string(STRATA_TEST_DATA_DIR) + "/tokenizers/kimi-style");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::optional<int32_t> eos = (*tokenizer)->TokenId("[EOS]");
  ASSERT_TRUE(eos.has_value());
  absl::StatusOr<std::unique_ptr<GrammarCompiler>> compiler =
      GrammarCompiler::Create({.tokenizer = tokenizer->get(),
                               .tokenizer_json = "",  // there is none
                               .eos_token_ids = {*eos},
                               .vocab_size = (*tokenizer)->vocab_size() + 64});
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  for (const auto& [format, text] :
       {std::pair{ResponseFormat::JsonObject(), std::string("{\"城市\": \"北京\", \"n\": [1, 2]}")},
        std::pair{ResponseFormat::Regex("(中文|abc) [0-9]+"), std::string("中文 12")}}) {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> grammar =
        (*compiler)->Compile(format);
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    std::unique_ptr<TokenConstraint> constraint = (*grammar)->NewConstraint();
    absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (int32_t id : *ids) {
      ASSERT_TRUE(constraint->Accept(id)) << text << ": " << *(*tokenizer)->IdToToken(id);
    }
    EXPECT_FALSE(constraint->Accept(*eos - 1)) << text;  // the last rank: not a continuation
    ASSERT_TRUE(constraint->Accept(*eos)) << text;
    EXPECT_TRUE(constraint->terminated()) << text;
  }
}

TEST(GrammarVocabularyTest, NeedsAnEndOfSequenceToken) {
  if (!GrammarCompiler::available()) GTEST_SKIP() << "built without xgrammar";
  const std::string json = TokenizerJson();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromJson(json, "tiny");
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(GrammarCompiler::Create({.tokenizer = tokenizer->get(),
                                     .tokenizer_json = json,
                                     .eos_token_ids = {},
                                     .vocab_size = kModelVocab})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
