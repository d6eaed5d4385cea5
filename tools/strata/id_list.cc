#include "tools/strata/id_list.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace strata {

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text) {
  std::vector<int32_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("--ids is empty: give comma-separated token ids");
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    int64_t value;
    if (!absl::SimpleAtoi(part, &value) || value < 0 ||
        value > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: \"", part, "\" is not a non-negative token id"));
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

}  // namespace strata
