#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace strata {
namespace tokenizer_internal {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other bytes map
// to U+0100 upwards in byte order.
struct Tables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<char32_t, 256> byte_to_char;
  std::array<int, 256 + 68> char_to_byte;  // -1: not in the alphabet (68 non-printable bytes)
  Tables() {
    char_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(byte_to_char[b], &byte_to_utf8[b]);
      char_to_byte[byte_to_char[b]] = b;
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

}  // namespace

void AppendByteLevel(absl::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char b : bytes) out->append(t.byte_to_utf8[static_cast<unsigned char>(b)]);
}

std::optional<unsigned char> ByteLevelByte(char32_t c) {
  const Tables& t = GetTables();
  if (c >= t.char_to_byte.size() || t.char_to_byte[c] < 0) return std::nullopt;
  return static_cast<unsigned char>(t.char_to_byte[c]);
}

}  // namespace tokenizer_internal
}  // namespace strata
