#include "common/chat/tool_call_formats.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/chat/jinja_builtins.h"

namespace strata::tool_call_internal {
namespace {

using absl::StripAsciiWhitespace;

// A function's name as the formats without JSON around it write it: one word, no markup.
bool IsName(absl::string_view name) {
  return !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '<' || c == '>';
  });
}

// Arguments written as a JSON object, as json.dumps writes it (the form every parser answers
// with); nullopt for anything else.
std::optional<std::string> ObjectArguments(absl::string_view text) {
  const Json v = Json::parse(text.begin(), text.end(), nullptr, false);
  if (v.is_discarded() || !v.is_object()) return std::nullopt;
  return jinja::ToJson(v, 0);
}

std::optional<ToolCall> NamedCall(absl::string_view name, absl::string_view arguments,
                                  std::string id = "") {
  if (!IsName(name)) return std::nullopt;
  std::optional<std::string> object = ObjectArguments(arguments);
  if (!object.has_value()) return std::nullopt;
  return ToolCall{std::string(name), *std::move(object), std::move(id)};
}

// {"name": "...", "arguments": ...}: "arguments" an object (written as json.dumps does, as the
// templates write them back), a string (kept), or absent (no arguments).
std::optional<ToolCall> ParseHermes(absl::string_view body, const Json&) {
  const Json v = Json::parse(body.begin(), body.end(), nullptr, false);
  if (v.is_discarded() || !v.is_object()) return std::nullopt;
  auto name = v.find("name");
  if (name == v.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  ToolCall call;
  call.name = name->get<std::string>();
  auto arguments = v.find("arguments");
  if (arguments == v.end()) {
    call.arguments = "{}";
  } else if (arguments->is_object()) {
    call.arguments = jinja::ToJson(*arguments, 0);
  } else if (arguments->is_string()) {
    call.arguments = arguments->get<std::string>();
  } else {
    return std::nullopt;
  }
  return call;
}

constexpr absl::string_view kDeepSeekSep = "<｜tool▁sep｜>";

// V3 / R1: TYPE<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n``` (TYPE is "function"); V3.1:
// NAME<｜tool▁sep｜>ARGUMENTS. Either is read whichever model wrote it.
std::optional<ToolCall> ParseDeepSeek(absl::string_view body, const Json&) {
  const size_t sep = body.find(kDeepSeekSep);
  if (sep == absl::string_view::npos) return std::nullopt;
  const absl::string_view after = body.substr(sep + kDeepSeekSep.size());
  constexpr absl::string_view kFence = "```json";
  if (const size_t fence = after.find(kFence); fence != absl::string_view::npos) {
    absl::string_view arguments = StripAsciiWhitespace(after.substr(fence + kFence.size()));
    if (absl::ConsumeSuffix(&arguments, "```")) {
      std::optional<ToolCall> call =
          NamedCall(StripAsciiWhitespace(after.substr(0, fence)), arguments);
      if (call.has_value()) return call;
    }
  }
  return NamedCall(StripAsciiWhitespace(body.substr(0, sep)), StripAsciiWhitespace(after));
}

// Whether `tools` declares the argument `key` of `function` a string (vLLM's test: the
// property's "type" is "string").
bool IsStringArgument(const Json& tools, absl::string_view function, const std::string& key) {
  if (!tools.is_array()) return false;
  for (const Json& tool : tools) {
    const Json* f = tool.is_object() && tool.contains("function") ? &tool["function"] : nullptr;
    if (f == nullptr || !f->is_object() || f->value("name", "") != function) continue;
    const Json parameters = f->value("parameters", Json::object());
    if (!parameters.is_object() || !parameters.contains("properties") ||
        !parameters["properties"].is_object() || !parameters["properties"].contains(key)) {
      return false;
    }
    const Json& property = parameters["properties"][key];
    return property.is_object() && property.value("type", Json()) == Json("string");
  }
  return false;
}

// A GLM value of an argument that is not declared a string: JSON when it reads as JSON, Python's
// True / False / None (which the model may write) as JSON's, the text itself otherwise.
Json GlmValue(absl::string_view text) {
  const Json v = Json::parse(text.begin(), text.end(), nullptr, false);
  if (!v.is_discarded()) return v;
  if (text == "True") return true;
  if (text == "False") return false;
  if (text == "None") return nullptr;
  return std::string(text);
}

// NAME, then <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> pairs, whitespace between.
// String arguments (by the tools' schemas) are kept as written; the others are read as JSON.
std::optional<ToolCall> ParseGlm(absl::string_view body, const Json& tools) {
  constexpr absl::string_view kKeyOpen = "<arg_key>", kKeyClose = "</arg_key>";
  constexpr absl::string_view kValueOpen = "<arg_value>", kValueClose = "</arg_value>";
  const size_t name_end = std::min(body.find('\n'), body.find(kKeyOpen));
  const absl::string_view name = StripAsciiWhitespace(body.substr(0, name_end));
  if (!IsName(name)) return std::nullopt;
  absl::string_view rest = name_end == absl::string_view::npos ? "" : body.substr(name_end);
  Json arguments = Json::object();
  while (!(rest = absl::StripLeadingAsciiWhitespace(rest)).empty()) {
    if (!absl::ConsumePrefix(&rest, kKeyOpen)) return std::nullopt;
    const size_t key_end = rest.find(kKeyClose);
    if (key_end == absl::string_view::npos) return std::nullopt;
    const std::string key(StripAsciiWhitespace(rest.substr(0, key_end)));
    rest = absl::StripLeadingAsciiWhitespace(rest.substr(key_end + kKeyClose.size()));
    if (!absl::ConsumePrefix(&rest, kValueOpen)) return std::nullopt;
    const size_t value_end = rest.find(kValueClose);
    if (value_end == absl::string_view::npos) return std::nullopt;
    const absl::string_view value = rest.substr(0, value_end);
    rest.remove_prefix(value_end + kValueClose.size());
    arguments[key] = IsStringArgument(tools, name, key) ? Json(std::string(value))
                                                        : GlmValue(StripAsciiWhitespace(value));
  }
  return ToolCall{std::string(name), jinja::ToJson(arguments, 0), ""};
}

// functions.NAME:INDEX<|tool_call_argument_begin|>ARGUMENTS: the id is kept (the template
// writes it back), the name is what stands between the id's last '.' and its ':' (vLLM's).
std::optional<ToolCall> ParseKimi(absl::string_view body, const Json&) {
  constexpr absl::string_view kArguments = "<|tool_call_argument_begin|>";
  const size_t at = body.find(kArguments);
  if (at == absl::string_view::npos) return std::nullopt;
  const absl::string_view id = StripAsciiWhitespace(body.substr(0, at));
  const size_t index = id.rfind(':');
  if (index == absl::string_view::npos || index + 1 == id.size() ||
      !std::all_of(id.begin() + index + 1, id.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
    return std::nullopt;
  }
  absl::string_view name = id.substr(0, id.find(':'));
  name = name.substr(name.rfind('.') + 1);
  return NamedCall(name, StripAsciiWhitespace(body.substr(at + kArguments.size())),
                   std::string(id));
}

Json Literal(absl::string_view value) {
  return {{"type", "const_string"}, {"value", std::string(value)}};
}

std::string HermesLead(const std::string& name) {
  // The name as the templates write it: a JSON string.
  return absl::StrCat("{\"name\": ", jinja::ToJson(jinja::Value(name), 0), ", \"arguments\": ");
}
std::string DeepSeekV3Lead(const std::string& name) { return absl::StrCat(name, "\n```json\n"); }
std::string DeepSeekV31Lead(const std::string& name) { return absl::StrCat(name, kDeepSeekSep); }
std::string GlmLead(const std::string& name) { return absl::StrCat(name, "\n"); }
// Kimi's index counts the conversation's calls; the grammar leaves it to the model.
std::string KimiLead(const std::string& name) { return absl::StrCat("functions.", name, ":"); }

}  // namespace

const CallSyntax* SyntaxOf(ToolCallFormat format) {
  static const CallSyntax kHermes = {
      .call_open = "<tool_call>",
      .call_close = "</tool_call>",
      .parse = ParseHermes,
      .first_open = "<tool_call>\n",
      .next_open = "\n<tool_call>\n",
      .lead = HermesLead,
      .tail = "}\n</tool_call>",
      .style = "json",
  };
  // The V3 template puts a newline between calls, V3.1's nothing.
  static const CallSyntax kDeepSeekV3 = {
      .section_open = "<｜tool▁calls▁begin｜>",
      .section_close = "<｜tool▁calls▁end｜>",
      .call_open = "<｜tool▁call▁begin｜>",
      .call_close = "<｜tool▁call▁end｜>",
      .parse = ParseDeepSeek,
      .first_open = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
      .next_open = "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
      .lead = DeepSeekV3Lead,
      .tail = "\n```<｜tool▁call▁end｜>",
      .end = "<｜tool▁calls▁end｜>",
      .style = "json",
  };
  // V3.1's markers are V3's; its blocks and what separates them differ.
  static const CallSyntax kDeepSeekV31 = [] {
    CallSyntax s = kDeepSeekV3;
    s.first_open = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
    s.next_open = "<｜tool▁call▁begin｜>";
    s.lead = DeepSeekV31Lead;
    s.tail = "<｜tool▁call▁end｜>";
    return s;
  }();
  // The template writes each pair on its lines and the block's end on its own; the arguments'
  // grammar (glm_xml) takes the newline before the end, and a call without arguments has one
  // newline only.
  static const CallSyntax kGlm = {
      .call_open = "<tool_call>",
      .call_close = "</tool_call>",
      .parse = ParseGlm,
      .first_open = "<tool_call>",
      .next_open = "\n<tool_call>",
      .lead = GlmLead,
      .tail = "</tool_call>",
      .style = "glm_xml",
  };
  static const CallSyntax kKimi = {
      .section_open = "<|tool_calls_section_begin|>",
      .section_close = "<|tool_calls_section_end|>",
      .call_open = "<|tool_call_begin|>",
      .call_close = "<|tool_call_end|>",
      .parse = ParseKimi,
      .first_open = "<|tool_calls_section_begin|><|tool_call_begin|>",
      .next_open = "<|tool_call_begin|>",
      .lead = KimiLead,
      .rest = {Json{{"type", "regex"}, {"pattern", "[0-9]+"}},
               Literal("<|tool_call_argument_begin|>")},
      .tail = "<|tool_call_end|>",
      .end = "<|tool_calls_section_end|>",
      .style = "json",
  };
  switch (format) {
    case ToolCallFormat::kNone:
      return nullptr;
    case ToolCallFormat::kHermes:
      return &kHermes;
    case ToolCallFormat::kDeepSeekV3:
      return &kDeepSeekV3;
    case ToolCallFormat::kDeepSeekV31:
      return &kDeepSeekV31;
    case ToolCallFormat::kGlm45:
      return &kGlm;
    case ToolCallFormat::kKimiK2:
      return &kKimi;
  }
  return nullptr;
}

}  // namespace strata::tool_call_internal
