#include "common/tokenizer/utf8.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

namespace strata {
namespace tokenizer_internal {
namespace {

// The well-formed continuation of a lead byte (Unicode Table 3-7): how many bytes follow it
// and the range allowed for the first of them (the others are always 0x80..0xBF).
struct LeadInfo {
  int continuation_bytes;  // -1: not a valid lead byte
  unsigned char first_lo;
  unsigned char first_hi;
};

LeadInfo Lead(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

// How many bytes after a lead byte at `pos` continue it correctly (at most info.continuation).
int MatchedContinuation(absl::string_view s, size_t pos, const LeadInfo& info) {
  int k = 0;
  for (size_t j = pos + 1; k < info.continuation_bytes && j < s.size(); ++j, ++k) {
    const auto c = static_cast<unsigned char>(s[j]);
    const unsigned char lo = k == 0 ? info.first_lo : 0x80;
    const unsigned char hi = k == 0 ? info.first_hi : 0xBF;
    if (c < lo || c > hi) break;
  }
  return k;
}

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

char32_t DecodeUtf8(absl::string_view s, size_t pos, size_t* length) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const size_t n = Utf8CharLength(b0);
  *length = n;
  if (n == 1) return b0;
  char32_t c = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) c = (c << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  return c;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const LeadInfo info = Lead(b);
    if (info.continuation_bytes < 0 || MatchedContinuation(s, i, info) != info.continuation_bytes) {
      return false;
    }
    i += 1 + info.continuation_bytes;
  }
  return true;
}

std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    const LeadInfo info = Lead(b);
    if (info.continuation_bytes < 0) {
      out.append(kReplacement.data(), kReplacement.size());
      ++i;
      continue;
    }
    const int k = MatchedContinuation(s, i, info);
    if (k == info.continuation_bytes) {
      out.append(s.data() + i, 1 + k);
    } else {
      out.append(kReplacement.data(),
                 kReplacement.size());  // one for the maximal subpart: the lead and what matched
    }
    i += 1 + k;
  }
  return out;
}

bool EndsWithIncompleteUtf8(absl::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t pos = n - back;
    const auto b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) return false;
    if (b < 0xC0) continue;  // a continuation byte: look further back for the lead
    const LeadInfo info = Lead(b);
    if (info.continuation_bytes < 0) return false;
    const int k = MatchedContinuation(s, pos, info);
    return k == static_cast<int>(back) - 1 && k < info.continuation_bytes;
  }
  return false;
}

bool IsWhitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool IsWordChar(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  return (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

bool IsNumeric(char32_t c) {
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & (U_GC_ND_MASK | U_GC_NL_MASK | U_GC_NO_MASK)) !=
         0;
}

bool IsCombiningMark(char32_t c) {
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_M_MASK) != 0;
}

void AppendLowercase(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c));
    return;
  }
  UChar src[2];
  int32_t src_len = 0;
  U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(c));
  UChar dst[8];
  UErrorCode status = U_ZERO_ERROR;
  const int32_t len = u_strToLower(dst, 8, src, src_len, "", &status);
  if (U_FAILURE(status)) {
    AppendUtf8(c, out);
    return;
  }
  for (int32_t i = 0; i < len;) {
    UChar32 lc;
    U16_NEXT(dst, i, len, lc);
    AppendUtf8(static_cast<char32_t>(lc), out);
  }
}

}  // namespace tokenizer_internal
}  // namespace strata
