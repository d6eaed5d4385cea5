#include "common/util/version.h"

// Defined for this file only (common/CMakeLists.txt), so that a new version rebuilds one file.
#ifndef STRATA_VERSION
#error "STRATA_VERSION is set by the build from the CMake project's VERSION"
#endif

namespace strata {

absl::string_view StrataVersion() { return STRATA_VERSION; }

}  // namespace strata
