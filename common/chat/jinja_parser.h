// Parses a Jinja template of the subset chat templates use, with the whitespace rules Hugging
// Face renders them by (trim_blocks and lstrip_blocks on, `-` trims by hand).
//
// Supported: text, {{ expr }}, {# comments #}, {% if/elif/else/endif %},
// {% for x in xs %} / {% for k, v in d.items() %} with {% else %}, the loop variable and
// {% break %} / {% continue %}, {% set name = expr %} and {% set ns.attribute = expr %},
// {% macro name(a, b=default) %}...{% endmacro %}. Expressions: literals (strings, numbers,
// true/false/none, lists, dicts, tuples), names, .attribute, [index], [a:b:c] slices, calls,
// filters, `is [not]` tests, not/and/or, comparisons, in/not in, + - * / // % ~, and
// `a if b else c`. Anything else (call blocks, set blocks, include, extends, import, raw, with,
// filter blocks) is an error naming the construct and its line.
#ifndef STRATA_COMMON_CHAT_JINJA_PARSER_H_
#define STRATA_COMMON_CHAT_JINJA_PARSER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/jinja_ast.h"

namespace strata::jinja {

absl::StatusOr<Body> Parse(absl::string_view source);

}  // namespace strata::jinja

#endif  // STRATA_COMMON_CHAT_JINJA_PARSER_H_
