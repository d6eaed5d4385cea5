// tokenizer.json pre-tokenizers: ByteLevel, Split, Metaspace, Digits, WhitespaceSplit and
// Sequence, with the semantics of Hugging Face `tokenizers`.
#ifndef STRATA_COMMON_TOKENIZER_PRE_TOKENIZERS_H_
#define STRATA_COMMON_TOKENIZER_PRE_TOKENIZERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_config.h"

namespace strata {
namespace tokenizer_internal {

// A piece of the input on its way to the model.
struct PreToken {
  std::string text;
  // Whether the piece starts at offset 0 of the original input (Metaspace's "first" scheme).
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces, in order; empty pieces are dropped.
  virtual absl::Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

// The pre-tokenizer that `json` describes; nullptr for JSON null.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                absl::string_view where);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_PRE_TOKENIZERS_H_
