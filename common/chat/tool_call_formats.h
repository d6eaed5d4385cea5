// How each tool-call format (tool_call_parser.h) marks its calls and writes a call's body: the
// markers the streaming parser looks for, the reading of one block's body, and the pieces a
// forced call is built from. Internal to common/chat.
#ifndef STRATA_COMMON_CHAT_TOOL_CALL_FORMATS_H_
#define STRATA_COMMON_CHAT_TOOL_CALL_FORMATS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/chat/tool_call_parser.h"
#include "nlohmann/json.hpp"

namespace strata::tool_call_internal {

using Json = nlohmann::ordered_json;

struct CallSyntax {
  // The markers around all the calls of a reply; empty when each call stands alone.
  absl::string_view section_open;
  absl::string_view section_close;
  // The markers around one call.
  absl::string_view call_open;
  absl::string_view call_close;
  // The text between call_open and call_close as a call; nullopt when it is not a well-formed
  // one. `tools`: the request's list (or null).
  std::optional<ToolCall> (*parse)(absl::string_view body, const Json& tools);

  // Forced calls (ForcedCallPrefix, ForcedCallGrammar): a reply made of calls is
  //   first_open lead(name) rest... ARGUMENTS tail [next_open lead(name) rest... ARGUMENTS tail]*
  //   end
  // where ARGUMENTS follow the function's schema in `style` (xgrammar's json_schema style).
  absl::string_view first_open;
  absl::string_view next_open;
  std::string (*lead)(const std::string& name);
  std::vector<Json> rest;  // structural-tag elements between the lead and the arguments
  absl::string_view tail;
  absl::string_view end;
  absl::string_view style;
};

// The syntax of `format`; null for kNone.
const CallSyntax* SyntaxOf(ToolCallFormat format);

}  // namespace strata::tool_call_internal

#endif  // STRATA_COMMON_CHAT_TOOL_CALL_FORMATS_H_
