// A whole file into a string: configs, tokenizers, plans and other small files read at start.
#ifndef STRATA_COMMON_UTIL_READ_FILE_H_
#define STRATA_COMMON_UTIL_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace strata {

// NOT_FOUND ("PATH: cannot open") when the file cannot be opened, INVALID_ARGUMENT for a
// directory, DATA_LOSS when reading it fails part way.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_READ_FILE_H_
