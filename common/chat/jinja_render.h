// Renders a parsed chat template against a context (messages, add_generation_prompt, special
// tokens...). Errors (raise_exception, an unsupported filter, a type error) name the line.
#ifndef STRATA_COMMON_CHAT_JINJA_RENDER_H_
#define STRATA_COMMON_CHAT_JINJA_RENDER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"

namespace strata::jinja {

// `context` is an object: its keys are the template's global names.
absl::StatusOr<std::string> Render(const Body& body, const Value& context);

}  // namespace strata::jinja

#endif  // STRATA_COMMON_CHAT_JINJA_RENDER_H_
