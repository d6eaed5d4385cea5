#include "common/tokenizer/json_config.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace strata {
namespace tokenizer_internal {

absl::Status ConfigError(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

std::string FieldPath(absl::string_view where, absl::string_view key) {
  return absl::StrCat(where, ".", key);
}

std::string IndexPath(absl::string_view where, size_t index) {
  return absl::StrCat(where, "[", index, "]");
}

const Json* FindField(const Json& obj, absl::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return (it == obj.end() || it->is_null()) ? nullptr : &*it;
}

absl::StatusOr<std::string> GetString(const Json& obj, absl::string_view key,
                                      absl::string_view where) {
  const Json* v = FindField(obj, key);
  if (v == nullptr) return ConfigError(FieldPath(where, key), "is missing");
  if (!v->is_string()) return ConfigError(FieldPath(where, key), "must be a string");
  return v->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& obj, absl::string_view key,
                                                             absl::string_view where) {
  const Json* v = FindField(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return ConfigError(FieldPath(where, key), "must be a string or null");
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<bool> GetBool(const Json& obj, absl::string_view key, bool fallback,
                             absl::string_view where) {
  const Json* v = FindField(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return ConfigError(FieldPath(where, key), "must be true or false");
  return v->get<bool>();
}

absl::StatusOr<int64_t> GetInt(const Json& obj, absl::string_view key,
                               std::optional<int64_t> fallback, int64_t min, int64_t max,
                               absl::string_view where) {
  const Json* v = FindField(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return ConfigError(FieldPath(where, key), "is missing");
  }
  if (!v->is_number_integer()) return ConfigError(FieldPath(where, key), "must be an integer");
  const int64_t value = v->get<int64_t>();
  if (value < min || value > max) {
    return ConfigError(FieldPath(where, key),
                       absl::StrCat("must be in [", min, ", ", max, "], got ", value));
  }
  return value;
}

absl::StatusOr<const Json*> GetArray(const Json& obj, absl::string_view key,
                                     absl::string_view where) {
  const Json* v = FindField(obj, key);
  if (v == nullptr) return ConfigError(FieldPath(where, key), "is missing");
  if (!v->is_array()) return ConfigError(FieldPath(where, key), "must be an array");
  return v;
}

absl::StatusOr<std::string> GetType(const Json& obj, absl::string_view where) {
  if (!obj.is_object()) return ConfigError(where, "must be an object or null");
  return GetString(obj, "type", where);
}

absl::StatusOr<char32_t> GetChar(const Json& obj, absl::string_view key, absl::string_view where) {
  absl::StatusOr<std::string> s = GetString(obj, key, where);
  if (!s.ok()) return s.status();
  size_t length = 0;
  if (s->empty() || !IsValidUtf8(*s) || (DecodeUtf8(*s, 0, &length), length != s->size())) {
    return ConfigError(FieldPath(where, key), "must be a single character");
  }
  return DecodeUtf8(*s, 0, &length);
}

}  // namespace tokenizer_internal
}  // namespace strata
