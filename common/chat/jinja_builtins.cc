#include "common/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace strata::jinja {
namespace {

absl::Status Unsupported(absl::string_view what, absl::string_view name) {
  return absl::InvalidArgumentError(
      absl::StrCat("the ", what, " '", name, "' is not supported by Strata's chat templates"));
}

std::string FloatText(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e16) {
    return absl::StrCat(static_cast<int64_t>(d), ".0");
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.17g", d);
  // The shortest text that reads back the same, as Python's repr.
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, d);
    if (std::strtod(buffer, nullptr) == d) break;
  }
  return buffer;
}

// Python's repr() of a value inside a list or dict.
std::string Repr(const Value& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const char quote =
        s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, quote);
    for (char c : s) {
      if (c == '\\') {
        out += "\\\\";
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == quote) {
        out += '\\', out += c;
      } else {
        out += c;
      }
    }
    return out + quote;
  }
  return ToText(v);
}

// The code point of the UTF-8 sequence at s[i] (advancing i past it); invalid bytes are taken
// one at a time as themselves.
uint32_t NextCodePoint(const std::string& s, size_t& i) {
  const unsigned char c = s[i];
  const size_t extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  bool whole = extra > 0 && i + extra < s.size();
  for (size_t k = 1; whole && k <= extra; ++k) whole = (s[i + k] & 0xC0) == 0x80;
  if (!whole) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3F >> extra);
  for (size_t k = 1; k <= extra; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += extra + 1;
  return cp;
}

std::string JsonString(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (ensure_ascii && c >= 0x80) {
      // As json.dumps: each UTF-16 unit of the character as \uXXXX.
      uint32_t cp = NextCodePoint(s, i);
      --i;
      char buffer[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buffer, sizeof(buffer), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                      0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", cp);
      }
      out += buffer;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void DumpJson(const Value& v, const JsonFormat& f, int depth, std::string& out) {
  const int indent = f.indent;
  const std::string pad = indent > 0 ? "\n" + std::string(indent * (depth + 1), ' ') : "";
  const std::string close = indent > 0 ? "\n" + std::string(indent * depth, ' ') : "";
  const std::string comma = !f.item_separator.empty() ? f.item_separator : indent > 0 ? "," : ", ";
  const std::string colon = !f.key_separator.empty() ? f.key_separator : ": ";
  if (v.is_object()) {
    if (v.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<const std::string*, const Value*>> items;
    for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(&it.key(), &it.value());
    if (f.sort_keys) {
      std::sort(items.begin(), items.end(),
                [](const auto& a, const auto& b) { return *a.first < *b.first; });
    }
    out += "{";
    bool first = true;
    for (const auto& [key, value] : items) {
      if (!first) out += comma;
      first = false;
      out += pad + JsonString(*key, f.ensure_ascii) + colon;
      DumpJson(*value, f, depth + 1, out);
    }
    out += close + "}";
  } else if (v.is_array()) {
    if (v.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out += comma;
      out += pad;
      DumpJson(v[i], f, depth + 1, out);
    }
    out += close + "]";
  } else if (v.is_string()) {
    out += JsonString(v.get<std::string>(), f.ensure_ascii);
  } else if (v.is_number_float()) {
    out += FloatText(v.get<double>());
  } else if (IsUndefined(v)) {
    out += "null";
  } else {
    out += v.dump();
  }
}

std::string Strip(const std::string& s, const Args& args, bool left, bool right) {
  const std::string chars =
      args.empty() || args[0].is_null() ? std::string(" \t\n\r\f\v") : args[0].get<std::string>();
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && chars.find(s[begin]) != std::string::npos) ++begin;
  }
  if (right) {
    while (end > begin && chars.find(s[end - 1]) != std::string::npos) --end;
  }
  return s.substr(begin, end - begin);
}

absl::StatusOr<Value> StringMethod(const std::string& s, const std::string& name,
                                   const Args& args) {
  auto string_arg = [&](size_t i) -> absl::StatusOr<std::string> {
    if (i >= args.size() || !args[i].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("str.", name, " needs a string argument"));
    }
    return args[i].get<std::string>();
  };
  if (name == "strip") return Strip(s, args, true, true);
  if (name == "lstrip") return Strip(s, args, true, false);
  if (name == "rstrip") return Strip(s, args, false, true);
  if (name == "upper") return absl::AsciiStrToUpper(s);
  if (name == "lower") return absl::AsciiStrToLower(s);
  if (name == "startswith" || name == "endswith") {
    auto prefix = string_arg(0);
    if (!prefix.ok()) return prefix.status();
    return name == "startswith"
               ? s.rfind(*prefix, 0) == 0
               : s.size() >= prefix->size() &&
                     s.compare(s.size() - prefix->size(), prefix->size(), *prefix) == 0;
  }
  if (name == "split") {
    Value parts = Value::array();
    if (args.empty() || args[0].is_null()) {
      std::string word;
      for (char c : s + " ") {
        if (std::isspace(static_cast<unsigned char>(c))) {
          if (!word.empty()) parts.push_back(word);
          word.clear();
        } else {
          word += c;
        }
      }
      return parts;
    }
    auto sep = string_arg(0);
    if (!sep.ok()) return sep.status();
    if (sep->empty()) return absl::InvalidArgumentError("str.split: empty separator");
    int64_t max_split =
        args.size() > 1 && args[1].is_number_integer() ? args[1].get<int64_t>() : -1;
    size_t start = 0;
    while (max_split != 0) {
      const size_t at = s.find(*sep, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + sep->size();
      --max_split;
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  if (name == "replace") {
    auto from = string_arg(0);
    auto to = string_arg(1);
    if (!from.ok()) return from.status();
    if (!to.ok()) return to.status();
    return absl::StrReplaceAll(s, {{*from, *to}});
  }
  if (name == "title" || name == "capitalize") {
    std::string out = absl::AsciiStrToLower(s);
    bool start = true;
    for (char& c : out) {
      if (start && std::isalpha(static_cast<unsigned char>(c))) c = absl::ascii_toupper(c);
      start = name == "title" ? !std::isalpha(static_cast<unsigned char>(c)) : false;
    }
    return out;
  }
  return absl::NotFoundError(name);
}

}  // namespace

Value Undefined() { return Value(Value::value_t::discarded); }
bool IsUndefined(const Value& v) { return v.is_discarded(); }

bool Truthy(const Value& v) {
  if (IsUndefined(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();
}

std::string ToText(const Value& v) {
  if (IsUndefined(v)) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return FloatText(v.get<double>());
  if (v.is_number()) return v.dump();
  std::vector<std::string> parts;
  if (v.is_array()) {
    for (const Value& item : v) parts.push_back(Repr(item));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    parts.push_back(absl::StrCat(Repr(Value(it.key())), ": ", Repr(it.value())));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

std::string ToJson(const Value& v, int indent) {
  JsonFormat format;
  format.indent = indent;
  return ToJson(v, format);
}

std::string ToJson(const Value& v, const JsonFormat& format) {
  std::string out;
  DumpJson(v, format, 0, out);
  return out;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (IsUndefined(a) || IsUndefined(b)) return IsUndefined(a) && IsUndefined(b);
  return a == b;
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  std::vector<Value> items;
  if (v.is_array()) {
    items.assign(v.begin(), v.end());
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) items.push_back(it.key());
  } else if (v.is_string()) {
    for (char c : v.get<std::string>()) items.push_back(std::string(1, c));
  } else if (!IsUndefined(v)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot iterate over ", ToText(v)));
  }
  return items;
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args,
                                  const Kwargs& kwargs) {
  if (name == "length" || name == "count") {
    if (v.is_string()) return static_cast<int64_t>(v.get<std::string>().size());
    if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
    return absl::InvalidArgumentError(absl::StrCat("length of ", ToText(v)));
  }
  if (name == "tojson") {
    // transformers' filter: tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False), each handed to json.dumps.
    JsonFormat format;
    if (!args.empty() && args[0].is_number_integer()) format.indent = args[0].get<int>();
    for (const auto& [key, value] : kwargs) {
      if (key == "indent" && value.is_number_integer()) {
        format.indent = value.get<int>();
      } else if (key == "ensure_ascii") {
        format.ensure_ascii = Truthy(value);
      } else if (key == "sort_keys") {
        format.sort_keys = Truthy(value);
      } else if (key == "separators" && value.is_array() && value.size() == 2 &&
                 value[0].is_string() && value[1].is_string()) {
        format.item_separator = value[0].get<std::string>();
        format.key_separator = value[1].get<std::string>();
      } else if (key != "indent" && key != "separators") {
        return absl::InvalidArgumentError(absl::StrCat("tojson has no argument '", key, "'"));
      }
    }
    return ToJson(v, format);
  }
  if (name == "string") return ToText(v);
  if (name == "safe" || name == "e" || name == "escape") return v;
  if (name == "trim") return Strip(ToText(v), args, true, true);
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    return StringMethod(ToText(v), name, {});
  }
  if (name == "int") {
    if (v.is_number()) return static_cast<int64_t>(v.get<double>());
    if (v.is_string()) return static_cast<int64_t>(std::atoll(v.get<std::string>().c_str()));
    return int64_t{0};
  }
  if (name == "default" || name == "d") {
    const bool boolean = args.size() > 1 && Truthy(args[1]);
    if (IsUndefined(v) || (boolean && !Truthy(v))) return args.empty() ? Value("") : args[0];
    return v;
  }
  if (name == "first" || name == "last") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) return Undefined();
    return name == "first" ? items->front() : items->back();
  }
  if (name == "list") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    return Value(*items);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::string s = v.get<std::string>();
      std::reverse(s.begin(), s.end());
      return s;
    }
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value(*items);
  }
  if (name == "join") {
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    std::string out;
    const std::string sep = args.empty() ? "" : ToText(args[0]);
    for (size_t i = 0; i < items->size(); ++i) {
      if (i > 0) out += sep;
      out += ToText((*items)[i]);
    }
    return out;
  }
  if (name == "items") return CallMethod(v, "items", {});
  if (name == "replace" && args.size() == 2) return StringMethod(ToText(v), "replace", args);
  return Unsupported("filter", name);
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args) {
  if (name == "defined") return !IsUndefined(v);
  if (name == "undefined") return IsUndefined(v);
  if (name == "none") return v.is_null();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_number_integer();
  if (name == "float") return v.is_number_float();
  if (name == "boolean") return v.is_boolean();
  if (name == "true") return v.is_boolean() && v.get<bool>();
  if (name == "false") return v.is_boolean() && !v.get<bool>();
  if (name == "mapping") return v.is_object();
  if (name == "sequence" || name == "iterable") {
    return v.is_array() || v.is_string() || v.is_object();
  }
  if (name == "even" || name == "odd") {
    if (!v.is_number_integer()) return false;
    return (v.get<int64_t>() % 2 == 0) == (name == "even");
  }
  if (name == "equalto" || name == "eq" || name == "sameas") {
    return !args.empty() && Equal(v, args[0]);
  }
  return Unsupported("test", name);
}

absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args) {
  if (self.is_string()) return StringMethod(self.get<std::string>(), name, args);
  if (self.is_object()) {
    if (name == "items") {
      Value items = Value::array();
      for (auto it = self.begin(); it != self.end(); ++it) {
        items.push_back(Value::array({it.key(), it.value()}));
      }
      return items;
    }
    if (name == "keys" || name == "values") {
      Value out = Value::array();
      for (auto it = self.begin(); it != self.end(); ++it) {
        out.push_back(name == "keys" ? Value(it.key()) : it.value());
      }
      return out;
    }
    if (name == "get" && !args.empty() && args[0].is_string()) {
      auto it = self.find(args[0].get<std::string>());
      if (it != self.end()) return *it;
      return args.size() > 1 ? args[1] : Value(nullptr);
    }
  }
  return absl::NotFoundError(name);
}

}  // namespace strata::jinja
