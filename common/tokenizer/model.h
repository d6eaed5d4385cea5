// The model step of encoding (one pre-token to ids) and the vocabulary behind it, shared by the
// BPE model of tokenizer.json and the rank-based BPE of a tiktoken file.
#ifndef STRATA_COMMON_TOKENIZER_MODEL_H_
#define STRATA_COMMON_TOKENIZER_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {
namespace tokenizer_internal {

class Model {
 public:
  virtual ~Model() = default;

  // Appends the ids of `word` (one pre-token) to `ids`.
  virtual absl::Status Tokenize(absl::string_view word, std::vector<int32_t>* ids) const = 0;

  // Lookups by token string (the form the vocabulary stores, e.g. byte-level characters).
  virtual std::optional<int32_t> TokenToId(absl::string_view token) const = 0;
  // The token of `id`, or nullptr for ids that the vocabulary does not use.
  virtual const std::string* IdToToken(int32_t id) const = 0;
  // The number of vocabulary entries.
  virtual size_t vocab_count() const = 0;
  // One more than the largest id of the vocabulary.
  virtual int32_t id_limit() const = 0;
};

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_MODEL_H_
