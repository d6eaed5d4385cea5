#include "common/grammar/xgrammar_vocabulary.h"

#include <algorithm>
#include <exception>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata {

std::vector<std::string> GrammarTokenStrings(const Tokenizer& tokenizer, int64_t vocab_size) {
  const int64_t ids = std::min<int64_t>(vocab_size, tokenizer.vocab_size());
  std::vector<std::string> strings(static_cast<size_t>(ids));
  for (int32_t id = 0; id < ids; ++id) {
    if (tokenizer.IsSpecial(id)) continue;  // control tokens: never text of an output
    if (std::optional<std::string> token = tokenizer.IdToToken(id)) strings[id] = *std::move(token);
  }
  return strings;
}

absl::StatusOr<xgrammar::TokenizerInfo> MakeTokenizerInfo(const GrammarVocabulary& v) {
  if (v.tokenizer == nullptr) {
    return absl::InvalidArgumentError("structured output needs the model's tokenizer");
  }
  std::vector<int32_t> stop;
  for (int id : v.eos_token_ids) {
    if (id >= 0 && id < v.vocab_size) stop.push_back(id);
  }
  if (stop.empty()) {
    return absl::InvalidArgumentError(
        "structured output needs the model's end-of-sequence token (config.json eos_token_id)");
  }
  std::vector<std::string> strings = GrammarTokenStrings(*v.tokenizer, v.vocab_size);
  try {
    // A tiktoken tokenizer's strings are byte-level (IdToToken); otherwise xgrammar's own
    // reading of the decoder (ByteLevel or ByteFallback) and of the Metaspace or Prepend that
    // puts a space before the first word.
    xgrammar::VocabType vocab_type = xgrammar::VocabType::BYTE_LEVEL;
    bool add_prefix_space = false;
    if (v.tokenizer->format() != Tokenizer::Format::kTiktoken) {
      const nlohmann::json metadata =
          nlohmann::json::parse(xgrammar::TokenizerInfo::DetectMetadataFromHF(v.tokenizer_json));
      vocab_type = static_cast<xgrammar::VocabType>(metadata.at("vocab_type").get<int>());
      add_prefix_space = metadata.at("add_prefix_space").get<bool>();
    }
    return xgrammar::TokenizerInfo(
        strings, vocab_type, static_cast<int>(std::max<int64_t>(v.vocab_size, std::ssize(strings))),
        stop, add_prefix_space);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the grammar engine cannot read the tokenizer: ", e.what()));
  }
}

}  // namespace strata
