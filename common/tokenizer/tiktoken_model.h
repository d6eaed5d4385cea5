// The pieces of a tiktoken tokenizer (Kimi-K2's tiktoken.model): the rank table and its BPE,
// the pre-tokenizer that keeps only a pattern's matches, and the cutting of long texts that
// Kimi's tokenization_kimi.py does before handing them to tiktoken.
#ifndef STRATA_COMMON_TOKENIZER_TIKTOKEN_MODEL_H_
#define STRATA_COMMON_TOKENIZER_TIKTOKEN_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/model.h"
#include "common/tokenizer/pre_tokenizers.h"

namespace strata {
namespace tokenizer_internal {

// Kimi's pat_str (tokenization_kimi.py), in the Rust regex syntax tiktoken compiles it with
// (Regex::CompileRust translates its class intersections).
extern const char kKimiPattern[];

// tiktoken's BPE over a rank table: ids are ranks.  A piece that is itself in the table is one
// token; otherwise, starting from its bytes, the adjacent pair whose concatenation has the
// lowest rank is merged (the leftmost of equal ones) until no pair is in the table.
class TiktokenModel : public Model {
 public:
  // Parses a tiktoken file: one "<base64 of the token's bytes> <rank>" line per token.  The
  // ranks must be 0 to N-1 for N tokens (the special tokens take the ids after them), and
  // every single byte must be a token.  Errors name `source` and the line.
  static absl::StatusOr<std::unique_ptr<TiktokenModel>> FromText(absl::string_view text,
                                                                 absl::string_view source);

  absl::Status Tokenize(absl::string_view word, std::vector<int32_t>* ids) const override;
  // Tokens by their byte-level form (GPT-2's byte-to-character table), as Kimi's Hugging Face
  // tokenizer spells them in its vocabulary.
  std::optional<int32_t> TokenToId(absl::string_view token) const override;
  const std::string* IdToToken(int32_t id) const override;
  size_t vocab_count() const override { return bytes_.size(); }
  int32_t id_limit() const override { return static_cast<int32_t>(bytes_.size()); }

  // The bytes of token `id`, or nullptr outside the table.
  const std::string* IdToBytes(int32_t id) const;

 private:
  TiktokenModel() = default;

  // The rank of `bytes`, or -1.
  int32_t Rank(absl::string_view bytes) const;

  absl::flat_hash_map<std::string, int32_t> ranks_;     // token bytes -> rank
  absl::flat_hash_map<std::string, int32_t> by_token_;  // byte-level form -> rank
  std::vector<std::string> bytes_;                      // rank -> token bytes
  std::vector<std::string> tokens_;                     // rank -> byte-level form
};

// A pre-tokenizer that keeps the matches of `pattern` (Rust syntax) and drops the text between
// them, as tiktoken's encode does.
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeTiktokenPreTokenizer(absl::string_view pattern);

// The pieces tokenization_kimi.py encodes one by one: `text` (valid UTF-8) cut every 400,000
// characters, and each part cut where a run of whitespace or of non-whitespace characters
// (Python's str.isspace) would grow past 25,000 characters.  Empty text has no pieces.
std::vector<absl::string_view> TiktokenPieces(absl::string_view text);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_TIKTOKEN_MODEL_H_
