#include "services/router/http/openai_tools.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "services/router/http/openai_request.h"

namespace strata {
namespace {

bool Present(const Json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// One entry of `tools`: {"type": "function", "function": {"name", "description",
// "parameters", "strict"}}; returns its name.
absl::Status CheckTool(const Json& tool, size_t i, std::string& name) {
  const std::string at = absl::StrCat("tools[", i, "]");
  if (!tool.is_object() || !tool.contains("type") || tool["type"] != Json("function")) {
    return BadParam(at, absl::StrCat("'", at,
                                     "' must be {\"type\": \"function\", \"function\": {...}}: "
                                     "function tools only"));
  }
  const std::string fn = at + ".function";
  if (!tool.contains("function") || !tool["function"].is_object()) {
    return BadParam(fn, absl::StrCat("'", fn, "' must be an object with a 'name'"));
  }
  const Json& f = tool["function"];
  if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
    return BadParam(fn + ".name", absl::StrCat("'", fn, ".name' must be a non-empty string"));
  }
  name = f["name"].get<std::string>();
  if (Present(f, "description") && !f["description"].is_string()) {
    return BadParam(fn + ".description", "a function's 'description' must be a string");
  }
  if (Present(f, "parameters") && !f["parameters"].is_object()) {
    return BadParam(fn + ".parameters",
                    "a function's 'parameters' must be a JSON schema (an object)");
  }
  if (Present(f, "strict") && !f["strict"].is_boolean()) {
    return BadParam(fn + ".strict", "a function's 'strict' must be a boolean");
  }
  return absl::OkStatus();
}

absl::Status ParseToolChoice(const Json& choice, const absl::flat_hash_set<std::string>& names,
                             ToolRequest& tools) {
  if (choice.is_string()) {
    const std::string value = choice.get<std::string>();
    if (value == "none") {
      tools.choice = ToolChoice::kNone;
    } else if (value == "auto") {
      tools.choice = ToolChoice::kAuto;
    } else if (value == "required") {
      tools.choice = ToolChoice::kRequired;
    } else {
      return BadParam(
          "tool_choice",
          absl::StrCat("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}, not \"",
                       value, "\""));
    }
  } else if (choice.is_object() && choice.contains("type") && choice["type"] == Json("function") &&
             choice.contains("function") && choice["function"].is_object() &&
             choice["function"].contains("name") && choice["function"]["name"].is_string()) {
    tools.choice = ToolChoice::kFunction;
    tools.function = choice["function"]["name"].get<std::string>();
    if (!names.contains(tools.function)) {
      return BadParam("tool_choice", absl::StrCat("'tool_choice' names the function '",
                                                  tools.function, "', which 'tools' lacks"));
    }
  } else {
    return BadParam("tool_choice",
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (tools.tools.empty() && tools.choice != ToolChoice::kNone &&
      tools.choice != ToolChoice::kAuto) {
    return BadParam("tool_choice", "'tool_choice' asks for a call, but there are no 'tools'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseToolFields(const Json& body, ToolRequest& tools) {
  absl::flat_hash_set<std::string> names;
  if (Present(body, "tools")) {
    const Json& list = body["tools"];
    if (!list.is_array()) return BadParam("tools", "'tools' must be a list of function tools");
    for (size_t i = 0; i < list.size(); ++i) {
      std::string name;
      RETURN_IF_ERROR(CheckTool(list[i], i, name));
      if (!names.insert(name).second) {
        return BadParam(absl::StrCat("tools[", i, "].function.name"),
                        absl::StrCat("the function '", name, "' is defined twice"));
      }
    }
    tools.tools = list;
  }
  if (Present(body, "tool_choice"))
    RETURN_IF_ERROR(ParseToolChoice(body["tool_choice"], names, tools));
  if (Present(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean()) {
      return BadParam("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    }
    tools.parallel = body["parallel_tool_calls"].get<bool>();
  }
  return absl::OkStatus();
}

bool HasToolCalls(const Json& m) {
  return m.is_object() && m.value("role", Json()) == Json("assistant") && Present(m, "tool_calls");
}

absl::Status ParseMessageToolFields(const Json& m, size_t index, Json& message) {
  const std::string at = absl::StrCat("messages[", index, "]");
  if (Present(m, "tool_call_id") && !m["tool_call_id"].is_string()) {
    return BadParam(at + ".tool_call_id", "'tool_call_id' must be a string");
  }
  if (!Present(m, "tool_calls")) return absl::OkStatus();
  if (m["role"] != Json("assistant")) {
    return BadParam(at + ".tool_calls", "only assistant messages carry 'tool_calls'");
  }
  const Json& calls = m["tool_calls"];
  if (!calls.is_array()) return BadParam(at + ".tool_calls", "'tool_calls' must be a list");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string call = absl::StrCat(at, ".tool_calls[", i, "]");
    const Json& c = calls[i];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
      return BadParam(call,
                      "each tool call must be {\"id\", \"type\": \"function\", "
                      "\"function\": {\"name\", \"arguments\"}}");
    }
    if (Present(c, "type") && c["type"] != Json("function")) {
      return BadParam(call + ".type", "tool calls are of type \"function\"");
    }
    if (Present(c, "id") && !c["id"].is_string()) {
      return BadParam(call + ".id", "a tool call's 'id' must be a string");
    }
    const Json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string()) {
      return BadParam(call + ".function.name", "a tool call's function needs a string 'name'");
    }
    if (Present(f, "arguments") && !f["arguments"].is_string() && !f["arguments"].is_object()) {
      return BadParam(call + ".function.arguments",
                      "a tool call's 'arguments' must be JSON text (a string)");
    }
    // As vLLM hands them to templates: the arguments as an object, which they write with
    // tojson (Qwen3's also takes text, as is).
    Json& arguments = message["tool_calls"][i]["function"]["arguments"];
    if (arguments.is_string()) {
      const std::string text = arguments.get<std::string>();
      Json parsed = Json::parse(text, nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) arguments = std::move(parsed);
    } else if (arguments.is_null()) {
      arguments = Json::object();
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
