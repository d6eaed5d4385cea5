// Typed access to tokenizer.json values with errors that say where the value is:
// "path/tokenizer.json: pre_tokenizer.pretokenizers[1].behavior: must be a string".
#ifndef STRATA_COMMON_TOKENIZER_JSON_CONFIG_H_
#define STRATA_COMMON_TOKENIZER_JSON_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace tokenizer_internal {

using Json = nlohmann::json;

// InvalidArgument "<where>: <what>".
absl::Status ConfigError(absl::string_view where, absl::string_view what);

// "<where>.<key>" and "<where>[<index>]".
std::string FieldPath(absl::string_view where, absl::string_view key);
std::string IndexPath(absl::string_view where, size_t index);

// The member `key` of the object `obj`, or nullptr when it is missing or null.
const Json* FindField(const Json& obj, absl::string_view key);

// A required string member.
absl::StatusOr<std::string> GetString(const Json& obj, absl::string_view key,
                                      absl::string_view where);
// A string member that may be missing or null.
absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& obj, absl::string_view key,
                                                             absl::string_view where);
// A boolean member; `fallback` when it is missing or null.
absl::StatusOr<bool> GetBool(const Json& obj, absl::string_view key, bool fallback,
                             absl::string_view where);
// An integer member in [min, max]; `fallback` when missing or null (required when no fallback).
absl::StatusOr<int64_t> GetInt(const Json& obj, absl::string_view key,
                               std::optional<int64_t> fallback, int64_t min, int64_t max,
                               absl::string_view where);
// A required array member.
absl::StatusOr<const Json*> GetArray(const Json& obj, absl::string_view key,
                                     absl::string_view where);
// The "type" member of a component object (checks that `obj` is an object).
absl::StatusOr<std::string> GetType(const Json& obj, absl::string_view where);

// A string that must hold exactly one character (such as Metaspace's replacement).
absl::StatusOr<char32_t> GetChar(const Json& obj, absl::string_view key, absl::string_view where);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_JSON_CONFIG_H_
