// A chat request's tools: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, and the
// tool fields of its messages (an assistant's `tool_calls`, a tool's `tool_call_id`), checked
// with errors naming the field.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_TOOLS_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_TOOLS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace strata {

enum class ToolChoice {
  kNone,      // the tools are not offered: a plain reply
  kAuto,      // the model may call tools
  kRequired,  // the reply must be a call
  kFunction,  // the reply must be a call of `function`
};

struct ToolRequest {
  // As sent, for the template: [{"type": "function", "function": {"name", ...}}].
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  ToolChoice choice = ToolChoice::kAuto;
  std::string function;  // kFunction's
  bool parallel = true;  // false: at most one call in the reply
  // Whether the template gets the tools and the reply is parsed for calls.
  bool offered() const { return !tools.empty() && choice != ToolChoice::kNone; }
};

// `tools`, `tool_choice` and `parallel_tool_calls` of `body`. Without tools, tool_choice may
// only be "none" or "auto".
absl::Status ParseToolFields(const nlohmann::ordered_json& body, ToolRequest& tools);

// messages[index]'s tool fields into `message` (its copy for the template): an assistant's
// `tool_calls`, each {"id", "type": "function", "function": {"name", "arguments"}}, the
// arguments' JSON text made an object as tool-calling templates expect (kept as text when it is
// not one); a tool's `tool_call_id`.
absl::Status ParseMessageToolFields(const nlohmann::ordered_json& m, size_t index,
                                    nlohmann::ordered_json& message);

// Whether messages[index] is an assistant's with tool calls (its content may then be absent).
bool HasToolCalls(const nlohmann::ordered_json& m);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_TOOLS_H_
