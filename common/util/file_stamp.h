// A file's size and modification time, taken with one stat: what tells a checkpoint file that
// was rewritten from the one a store or a fingerprint was made from.
#ifndef STRATA_COMMON_UTIL_FILE_STAMP_H_
#define STRATA_COMMON_UTIL_FILE_STAMP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

struct FileStamp {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;

  bool operator==(const FileStamp&) const = default;
};

// NOT_FOUND (with the system's reason) when the file cannot be stat'ed.
absl::StatusOr<FileStamp> StampFile(const std::string& path);

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_FILE_STAMP_H_
