// Parser for the safetensors container: an 8-byte little-endian header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the tensor bytes.
#ifndef STRATA_COMMON_MODEL_SAFETENSORS_H_
#define STRATA_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace strata {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // As written in the header, e.g. "BF16".
  std::vector<int64_t> shape;
  // Byte range of the tensor within the file (already offset past the header).
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Upper bound on the JSON header, as the reference implementation enforces.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Parses and validates the header of a complete safetensors file held in `file`. Every
// entry's byte range lies inside the file, matches its dtype and shape, and overlaps no other.
// Errors name `file_name` and, where one is at fault, the tensor.
absl::StatusOr<std::vector<SafetensorsEntry>> ParseSafetensors(absl::Span<const uint8_t> file,
                                                               absl::string_view file_name);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_SAFETENSORS_H_
