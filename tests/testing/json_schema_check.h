// A JSON Schema check for the keywords the structured-output tests use (type, properties,
// required, additionalProperties false, enum, const, minimum, maximum, minLength, maxLength,
// pattern, items, minItems, maxItems), written from the specification and independent of the
// grammar engine that made the output.
#ifndef STRATA_TESTS_TESTING_JSON_SCHEMA_CHECK_H_
#define STRATA_TESTS_TESTING_JSON_SCHEMA_CHECK_H_

#include <algorithm>
#include <regex>
#include <string>

#include "nlohmann/json.hpp"

namespace strata::testing {

// Unicode code points of UTF-8 text (what JSON Schema's string lengths count).
inline size_t CodePoints(const std::string& text) {
  return static_cast<size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

inline bool HasType(const nlohmann::json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && value.get<double>() == static_cast<int64_t>(value));
  }
  return false;
}

// Why `value` does not satisfy `schema` (the first reason found, at `path`); empty when it does.
inline std::string SchemaViolation(const nlohmann::json& schema, const nlohmann::json& value,
                                   const std::string& path = "$") {
  auto fail = [&](const std::string& what) { return path + ": " + what; };
  if (schema.contains("type") && !HasType(value, schema["type"].get<std::string>())) {
    return fail("not of type " + schema["type"].get<std::string>());
  }
  if (schema.contains("const") && value != schema["const"]) return fail("not the const");
  if (schema.contains("enum")) {
    const nlohmann::json& options = schema["enum"];
    if (std::find(options.begin(), options.end(), value) == options.end()) {
      return fail("not one of the enum");
    }
  }
  if (value.is_number()) {
    const double x = value.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return fail("< minimum");
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return fail("> maximum");
  }
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (schema.contains("minLength") && CodePoints(s) < schema["minLength"].get<size_t>()) {
      return fail("shorter than minLength");
    }
    if (schema.contains("maxLength") && CodePoints(s) > schema["maxLength"].get<size_t>()) {
      return fail("longer than maxLength");
    }
    // Unanchored, as the specification has it (the tests' patterns anchor themselves).
    if (schema.contains("pattern") &&
        !std::regex_search(s, std::regex(schema["pattern"].get<std::string>()))) {
      return fail("does not match the pattern");
    }
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) {
      return fail("fewer than minItems");
    }
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) {
      return fail("more than maxItems");
    }
    if (schema.contains("items")) {
      for (size_t i = 0; i < value.size(); ++i) {
        std::string why =
            SchemaViolation(schema["items"], value[i], path + "[" + std::to_string(i) + "]");
        if (!why.empty()) return why;
      }
    }
  }
  if (value.is_object()) {
    const nlohmann::json properties = schema.value("properties", nlohmann::json::object());
    for (const auto& name : schema.value("required", nlohmann::json::array())) {
      if (!value.contains(name.get<std::string>())) {
        return fail("lacks required " + name.get<std::string>());
      }
    }
    for (const auto& [name, item] : value.items()) {
      if (properties.contains(name)) {
        std::string why = SchemaViolation(properties[name], item, path + "." + name);
        if (!why.empty()) return why;
      } else if (schema.contains("additionalProperties") &&
                 schema["additionalProperties"] == false) {
        return fail("has additional property " + name);
      }
    }
  }
  return "";
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_JSON_SCHEMA_CHECK_H_
