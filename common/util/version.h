// Strata's version: the VERSION of the top-level CMake project, its one definition.
#ifndef STRATA_COMMON_UTIL_VERSION_H_
#define STRATA_COMMON_UTIL_VERSION_H_

#include "absl/strings/string_view.h"

namespace strata {

// "MAJOR.MINOR.PATCH", e.g. what the HTTP API's GET /version answers.
absl::string_view StrataVersion();

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_VERSION_H_
