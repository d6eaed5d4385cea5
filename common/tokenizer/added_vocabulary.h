// The added tokens of tokenizer.json (special tokens such as <|endoftext|> or <s>, and other
// added tokens): id assignment, and splitting input text around them with the matching rules of
// Hugging Face `tokenizers` (leftmost-longest, single_word, lstrip, rstrip, normalized).
#ifndef STRATA_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
#define STRATA_COMMON_TOKENIZER_ADDED_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_config.h"
#include "common/tokenizer/model.h"
#include "common/tokenizer/normalizers.h"

namespace strata {
namespace tokenizer_internal {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A piece of text after splitting around added tokens: [start, end) of the split text, and the
// added token it is, or -1 for ordinary text.
struct Segment {
  size_t start = 0;
  size_t end = 0;
  int32_t token_id = -1;
};

class AddedVocabulary {
 public:
  // From tokenizer.json's "added_tokens" (JSON null or an array).  As tokenizers does, a token
  // whose content is in the model's vocabulary takes that id; the others get ids from the
  // model's vocabulary size upwards, in file order.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> FromJson(const Json& json,
                                                                   const Model& model,
                                                                   const Normalizer* normalizer,
                                                                   absl::string_view where);
  // Tokens with fixed ids (a tiktoken file's special tokens), all matched on the raw input.
  // Each content must be non-empty and unique; `normalized` must be false.
  static std::unique_ptr<AddedVocabulary> FromTokens(
      std::vector<std::pair<int32_t, AddedToken>> tokens);

  // Splits `text` around the tokens whose `normalized` flag equals `normalized`; appends the
  // non-empty segments, which cover `text`.
  void Split(absl::string_view text, bool normalized, std::vector<Segment>* out) const;

  // The string that decoding uses for `id` (the normalized form for normalized tokens), or
  // nullptr when `id` is not an added token.
  const std::string* DecodeForm(int32_t id) const;
  const AddedToken* Find(int32_t id) const;
  std::optional<int32_t> TokenToId(absl::string_view content) const;
  // Whether `token` is the content of a special token (decode's skip_special_tokens test).
  bool IsSpecialContent(absl::string_view token) const { return special_.contains(token); }
  // One more than the largest added id (0 when there are none).
  int32_t id_limit() const { return id_limit_; }

 private:
  // A byte trie over the patterns of one kind of token.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;
      int32_t token_id = -1;
    };
    std::vector<Node> nodes{Node()};
    bool first_byte[256] = {};
    void Insert(absl::string_view pattern, int32_t id);
    // The longest pattern starting at `start`: sets `*end` and returns its id, or -1.
    int32_t LongestAt(absl::string_view text, size_t start, size_t* end) const;
  };

  AddedVocabulary() = default;
  // Fills the tries from by_id_ (and decode_form_), once every token is in.
  void BuildTries();

  absl::flat_hash_map<std::string, int32_t> by_content_;
  absl::flat_hash_map<int32_t, AddedToken> by_id_;
  absl::flat_hash_map<int32_t, std::string> decode_form_;
  absl::flat_hash_set<std::string> special_;
  Trie raw_trie_;         // tokens with normalized == false, matched on the input
  Trie normalized_trie_;  // tokens with normalized == true, matched after normalization
  int32_t id_limit_ = 0;
};

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
