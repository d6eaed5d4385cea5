// tokenizer.json decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder
// and Sequence, with the semantics of Hugging Face `tokenizers` (Decoder::decode_chain).
#ifndef STRATA_COMMON_TOKENIZER_DECODERS_H_
#define STRATA_COMMON_TOKENIZER_DECODERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_config.h"

namespace strata {
namespace tokenizer_internal {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings; the decoded text is the concatenation of the result.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
  // Whether text decoded from tokens that end with `last_token` may still change when more
  // tokens follow, beyond an incomplete UTF-8 character (which shows as a trailing U+FFFD):
  // a ByteFallback run of <0xNN> tokens is valid or not only as a whole.
  virtual bool HoldsBack(absl::string_view last_token) const { return false; }
};

// The decoder that `json` describes; nullptr for JSON null.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& json, absl::string_view where);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_DECODERS_H_
