#include "common/model/safetensors.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Json = nlohmann::json;

// Element sizes of every dtype the format defines; a tensor of any of them may be present
// in a valid file, even where the model only reads float types.
int ElementBits(absl::string_view dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E5M2" ||
      dtype == "F8_E4M3" || dtype == "F8_E8M0") {
    return 8;
  }
  if (dtype == "I16" || dtype == "U16" || dtype == "F16" || dtype == "BF16") return 16;
  if (dtype == "I32" || dtype == "U32" || dtype == "F32") return 32;
  if (dtype == "I64" || dtype == "U64" || dtype == "F64") return 64;
  if (dtype == "F4") return 4;
  return 0;
}

absl::Status EntryError(absl::string_view file_name, absl::string_view tensor,
                        absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file_name, ": tensor '", tensor, "': ", what));
}

absl::StatusOr<SafetensorsEntry> ParseEntry(absl::string_view file_name, const std::string& name,
                                            const Json& value, uint64_t data_begin,
                                            uint64_t data_size) {
  if (!value.is_object()) return EntryError(file_name, name, "header entry is not an object");
  SafetensorsEntry entry;
  entry.name = name;

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    return EntryError(file_name, name, "missing or non-string \"dtype\"");
  }
  entry.dtype = dtype_it->get<std::string>();
  const int bits = ElementBits(entry.dtype);
  if (bits == 0) return EntryError(file_name, name, absl::StrCat("unknown dtype ", entry.dtype));

  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    return EntryError(file_name, name, "missing or non-array \"shape\"");
  }
  // Element count, guarded against overflow by bounding it by the data size in bits.
  const uint64_t max_elements = data_size * 8 / static_cast<uint64_t>(bits) + 1;
  uint64_t elements = 1;
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_unsigned()) {
      return EntryError(file_name, name, "shape holds a value that is not a non-negative integer");
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return EntryError(file_name, name, "shape dimension too large");
    }
    entry.shape.push_back(static_cast<int64_t>(d));
    if (d != 0 && elements > max_elements / d) {
      elements = max_elements + 1;  // saturate: already too large for the file
    } else {
      elements *= d;
    }
  }
  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return EntryError(file_name, name, "\"data_offsets\" must be two non-negative integers");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) return EntryError(file_name, name, "data_offsets begin after they end");
  if (end > data_size) {
    return EntryError(file_name, name,
                      absl::StrCat("data_offsets [", begin, ", ", end,
                                   ") run past the end of the data (", data_size, " bytes)"));
  }
  if (elements > max_elements) {
    return EntryError(file_name, name, "shape describes more data than the file holds");
  }

  const uint64_t expected_bytes = (elements * static_cast<uint64_t>(bits) + 7) / 8;
  if (end - begin != expected_bytes) {
    return EntryError(
        file_name, name,
        absl::StrCat("holds ", end - begin, " bytes but shape [", absl::StrJoin(entry.shape, ", "),
                     "] of ", entry.dtype, " needs ", expected_bytes));
  }
  entry.begin = data_begin + begin;
  entry.end = data_begin + end;
  return entry;
}

}  // namespace

absl::StatusOr<std::vector<SafetensorsEntry>> ParseSafetensors(absl::Span<const uint8_t> file,
                                                               absl::string_view file_name) {
  if (file.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": truncated: ", file.size(),
                                                   " bytes, shorter than the header "
                                                   "length field"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[i];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": header length ", header_len,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_len > file.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": header length ", header_len,
                                                   " runs past the end of the file (", file.size(),
                                                   " bytes)"));
  }
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  Json header = Json::parse(header_begin, header_begin + header_len, /*cb=*/nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": header is not valid JSON"));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": header is not a JSON object"));
  }

  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = file.size() - data_begin;
  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_name, ": __metadata__ is not an object"));
      }
      continue;
    }
    auto entry = ParseEntry(file_name, name, value, data_begin, data_size);
    if (!entry.ok()) return entry.status();
    entries.push_back(*std::move(entry));
  }

  // Overlap check over the byte ranges, in order; empty tensors occupy nothing.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return EntryError(file_name, by_offset[i]->name,
                        absl::StrCat("data overlaps tensor '", by_offset[i - 1]->name, "'"));
    }
  }
  return entries;
}

}  // namespace strata
