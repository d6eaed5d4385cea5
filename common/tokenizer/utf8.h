// UTF-8 helpers and the Unicode character classes the tokenizer pipeline needs, with the exact
// semantics of the Rust code in Hugging Face `tokenizers` (char::is_whitespace, regex `\w`,
// String::from_utf8_lossy).
#ifndef STRATA_COMMON_TOKENIZER_UTF8_H_
#define STRATA_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace strata {
namespace tokenizer_internal {

// The byte length of the UTF-8 character that starts with `lead` (1 for invalid leads).
inline size_t Utf8CharLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the character at `s[pos]` of a valid UTF-8 string and sets `*length` to its size.
char32_t DecodeUtf8(absl::string_view s, size_t pos, size_t* length);

// Appends the UTF-8 encoding of `c` to `out`.
void AppendUtf8(char32_t c, std::string* out);

// Whether `s` is well-formed UTF-8 (no surrogates, overlongs or code points above U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string Utf8Lossy(absl::string_view bytes);

// Whether `bytes` ends with a proper prefix of a well-formed UTF-8 character, that is, bytes
// which more bytes could still complete (Utf8Lossy turns them into U+FFFD for now).
bool EndsWithIncompleteUtf8(absl::string_view bytes);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool IsWhitespace(char32_t c);

// Rust regex `\w` in Unicode mode: Alphabetic, Mark, Decimal_Number, Connector_Punctuation or
// Join_Control.
bool IsWordChar(char32_t c);

// Rust's char::is_numeric: General_Category Nd, Nl or No.
bool IsNumeric(char32_t c);

// General_Category Mark (Mn, Mc, Me), as unicode_normalization's is_combining_mark.
bool IsCombiningMark(char32_t c);

// Appends the full lowercase mapping of `c` (Rust's char::to_lowercase, no context).
void AppendLowercase(char32_t c, std::string* out);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_UTF8_H_
