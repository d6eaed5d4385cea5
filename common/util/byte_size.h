// Sizes in configuration: "24GiB", "512MiB", "1.5G", "4096" (bytes).
#ifndef STRATA_COMMON_UTIL_BYTE_SIZE_H_
#define STRATA_COMMON_UTIL_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

// A number with an optional unit: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (case-insensitive;
// every unit is binary: 1K = 1024). InvalidArgument naming the text otherwise.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_BYTE_SIZE_H_
