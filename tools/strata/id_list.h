// Parsing of token id lists given on the command line ("1,2,3").
#ifndef STRATA_TOOLS_STRATA_ID_LIST_H_
#define STRATA_TOOLS_STRATA_ID_LIST_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_ID_LIST_H_
