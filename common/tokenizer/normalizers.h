// tokenizer.json normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Prepend, Replace
// and Sequence, with the semantics of Hugging Face `tokenizers` (offsets are not tracked).
#ifndef STRATA_COMMON_TOKENIZER_NORMALIZERS_H_
#define STRATA_COMMON_TOKENIZER_NORMALIZERS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_config.h"
#include "common/tokenizer/regex.h"

namespace strata {
namespace tokenizer_internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place.
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// The normalizer that `json` describes; nullptr for JSON null.  `where` names the value in
// error messages ("file: normalizer").
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json,
                                                            absl::string_view where);

// The "pattern" member of `obj`: {"String": literal} or {"Regex": pattern}, as the Replace
// normalizer, the Split pre-tokenizer and the Replace decoder store it.
absl::StatusOr<std::unique_ptr<Regex>> ParsePattern(const Json& obj, absl::string_view where);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_NORMALIZERS_H_
