// The values, filters, tests and methods of the chat-template Jinja subset, with Python's
// semantics where templates rely on them (str(), truthiness, json.dumps).
#ifndef STRATA_COMMON_CHAT_JINJA_BUILTINS_H_
#define STRATA_COMMON_CHAT_JINJA_BUILTINS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"

namespace strata::jinja {

// A name or key that is not there. Rendering it gives "", testing it gives false, using it
// any other way is an error.
Value Undefined();
bool IsUndefined(const Value& v);

bool Truthy(const Value& v);
// Python's str(): what {{ v }} writes.
std::string ToText(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent) as the `tojson` filter of transformers.
std::string ToJson(const Value& v, int indent);

// json.dumps's other arguments, which `tojson` passes on.
struct JsonFormat {
  int indent = 0;  // 0: none (one line)
  // The separators between items and after keys; empty: json.dumps's defaults for the indent.
  std::string item_separator;
  std::string key_separator;
  bool ensure_ascii = false;  // non-ASCII as \uXXXX escapes (surrogate pairs past U+FFFF)
  bool sort_keys = false;
};
std::string ToJson(const Value& v, const JsonFormat& format);

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args,
                                  const Kwargs& kwargs);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args);
// `self.name(args)` on a string, a dict or a list; NOT_FOUND when there is no such method.
absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args);

// Python's `==` across numbers, strings, lists and dicts.
bool Equal(const Value& a, const Value& b);
// The items of a list, the keys of a dict, the characters of a string.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

}  // namespace strata::jinja

#endif  // STRATA_COMMON_CHAT_JINJA_BUILTINS_H_
