// The byte <-> character table of byte-level BPE (GPT-2): every byte is shown as a printable
// character, so that token strings never hold raw bytes.
#ifndef STRATA_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define STRATA_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace strata {
namespace tokenizer_internal {

// Appends the byte-level form of `bytes` (each byte becomes one character) to `out`.
void AppendByteLevel(absl::string_view bytes, std::string* out);

// The byte that character `c` stands for, if `c` is in the byte-level alphabet.
std::optional<unsigned char> ByteLevelByte(char32_t c);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_BYTE_LEVEL_H_
