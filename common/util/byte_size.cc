#include "common/util/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a size (use e.g. 24GiB, 512MiB or a number of bytes)"));
  };
  std::string s(absl::StripAsciiWhitespace(text));
  size_t split = 0;
  while (split < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[split])) || s[split] == '.')) {
    ++split;
  }
  double number = 0;
  if (split == 0 || !absl::SimpleAtod(s.substr(0, split), &number)) return bad();
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(split)));
  struct Unit {
    const char* name;
    int shift;
  };
  static constexpr Unit kUnits[] = {{"", 0},     {"b", 0},   {"k", 10},   {"kb", 10}, {"kib", 10},
                                    {"m", 20},   {"mb", 20}, {"mib", 20}, {"g", 30},  {"gb", 30},
                                    {"gib", 30}, {"t", 40},  {"tb", 40},  {"tib", 40}};
  int shift = -1;
  for (const Unit& u : kUnits) {
    if (unit == u.name) shift = u.shift;
  }
  if (shift < 0) return bad();
  const double bytes = number * std::ldexp(1.0, shift);
  if (!(bytes >= 0) || bytes > 9.0e18) return bad();
  return static_cast<uint64_t>(bytes + 0.5);
}

}  // namespace strata
