// Not a test: prints encoding speed (tokens/s) for every tokenizer fixture on a long mixed
// text, and times inputs built to defeat caching or provoke regex backtracking.
// STRATA_TOKENIZER_BENCH_TEXT=<file> adds a text of your own.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

std::string FixtureDir() { return std::string(STRATA_TEST_DATA_DIR) + "/tokenizers"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// About 200 KB: the fixture test strings, numbered so that words repeat but lines do not.
std::string MixedText() {
  const nlohmann::json expected =
      nlohmann::json::parse(ReadFile(FixtureDir() + "/qwen2-style/expected.json"));
  std::string text;
  for (int round = 0; text.size() < 200000; ++round) {
    for (const auto& c : expected["cases"]) {
      text += c["text"].get<std::string>();
      text += " " + std::to_string(round * 7919 % 100000) + "\n";
    }
  }
  return text;
}

struct Timing {
  size_t tokens = 0;
  double seconds = 0;
};

Timing TimeEncode(const Tokenizer& tok, const std::string& text) {
  Timing t;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (ids.ok()) t.tokens = ids->size();
  return t;
}

TEST(TokenizerBench, LongTexts) {
  const std::string mixed = MixedText();
  std::vector<std::pair<std::string, std::string>> texts = {{"mixed", mixed}};
  if (const char* path = std::getenv("STRATA_TOKENIZER_BENCH_TEXT")) {
    texts.emplace_back(path, ReadFile(path));
  }
  for (const auto& entry : std::filesystem::directory_iterator(FixtureDir())) {
    const std::string name = entry.path().filename().string();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(entry.path().string());
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const auto& [label, text] : texts) {
      const Timing cold = TimeEncode(**tok, text);  // fills the word cache
      const Timing warm = TimeEncode(**tok, text);
      std::cout << name << " / " << label << ": " << text.size() << " bytes -> " << warm.tokens
                << " tokens; cold " << cold.seconds * 1e3 << " ms ("
                << static_cast<int64_t>(cold.tokens / cold.seconds) << " tokens/s), warm "
                << warm.seconds * 1e3 << " ms (" << static_cast<int64_t>(warm.tokens / warm.seconds)
                << " tokens/s)\n";
    }
  }
}

TEST(TokenizerBench, AdversarialInputs) {
  const std::vector<std::string> texts = {
      std::string(100000, ' ') + "x",      // one whitespace run: regex lookahead
      std::string(100000, 'a'),            // one long word: the BPE merge queue
      std::string(50000, '\n') + "\t \t",  // newline rules of the Qwen/o200k patterns
      [] {                                 // many distinct words: no cache hits
        std::string s;
        for (int i = 0; i < 20000; ++i) s += "w" + std::to_string(i * 2654435761u) + " ";
        return s;
      }(),
  };
  for (const char* name :
       {"qwen2-style", "o200k-style", "llama-style", "gpt2-style", "kimi-style"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        Tokenizer::FromModelDir(FixtureDir() + "/" + name);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (size_t i = 0; i < texts.size(); ++i) {
      const Timing t = TimeEncode(**tok, texts[i]);
      std::cout << name << " adversarial " << i << ": " << texts[i].size() << " bytes -> "
                << t.tokens << " tokens in " << t.seconds * 1e3 << " ms\n";
    }
  }
}

}  // namespace
}  // namespace strata
