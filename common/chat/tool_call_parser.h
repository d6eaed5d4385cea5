// The tool calls in a model's reply: how the model writes them (ToolCallFormat, chosen per model
// from its chat template or by the operator) and a parser that splits the reply, as it streams
// in, into the text around the calls and the calls themselves.
//
// Hermes (Qwen2.5, Qwen3, Hermes 2 Pro and the plain format): each call is a block
//   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
// DeepSeek-V3 / R1: the calls in one section, each block a json code block
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n
//   {"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>...<｜tool▁calls▁end｜>
// DeepSeek-V3.1: the same section, each block NAME<｜tool▁sep｜>ARGUMENTS
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
//   <｜tool▁call▁end｜><｜tool▁calls▁end｜>
// (either DeepSeek parser reads both kinds of block.)
// GLM-4.5 / 4.6: a block per call, the arguments as key and value pairs
//   <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>
// Kimi-K2: the calls in one section, each with the model's id functions.NAME:INDEX
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
//   <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
//
// A block that is not a well-formed call (its arguments not a JSON object, no name...) is not a
// call: its text stays in the reply, as is, and so do a section's markers when no call in it is
// well-formed. Whitespace next to a call is dropped (it only separates blocks).
#ifndef STRATA_COMMON_CHAT_TOOL_CALL_PARSER_H_
#define STRATA_COMMON_CHAT_TOOL_CALL_PARSER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace strata {

enum class ToolCallFormat {
  kNone,         // the model has no tool-call format Strata reads: tools are refused
  kHermes,       // <tool_call>{"name", "arguments"}</tool_call> blocks
  kDeepSeekV3,   // DeepSeek-V3 / R1: function<｜tool▁sep｜>NAME and a json code block
  kDeepSeekV31,  // DeepSeek-V3.1: NAME<｜tool▁sep｜>ARGUMENTS
  kGlm45,        // GLM-4.5 / 4.6: <tool_call>NAME <arg_key>/<arg_value> pairs</tool_call>
  kKimiK2,       // Kimi-K2: functions.NAME:INDEX<|tool_call_argument_begin|>ARGUMENTS
};

// The names of --tool-call-parser (vLLM's): "hermes", "deepseek_v3", "deepseek_v31", "glm45",
// "kimi_k2", "none", or "auto", which reads the chat template: DeepSeek's markers
// (<｜tool▁calls▁begin｜>) make deepseek_v3 when the calls are json code blocks, deepseek_v31
// otherwise; Kimi's <|tool_calls_section_begin|> kimi_k2; <arg_key> glm45; <tool_call> blocks of
// JSON (not Qwen3-Coder's XML <function=...> ones) hermes, as does a model without a template
// (the plain format writes them); none otherwise. INVALID_ARGUMENT for another name.
absl::StatusOr<ToolCallFormat> ChooseToolCallFormat(absl::string_view name,
                                                    const ChatTemplate& chat_template);
// The --tool-call-parser name of `format`.
absl::string_view ToolCallFormatName(ToolCallFormat format);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text: an object, as json.dumps writes it, or the model's string
  // The model's own id for the call (Kimi-K2's functions.NAME:INDEX, which its template writes
  // back); empty for formats without one.
  std::string id;
};

// A piece of the reply, in order: text outside any call, or a call.
struct ReplyPiece {
  std::string text;
  std::optional<ToolCall> call;
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  // The reply's next text. Returns what is decided: text that cannot be the start of a call
  // any more, and calls whose blocks closed. The rest is held back.
  virtual std::vector<ReplyPiece> Feed(absl::string_view text) = 0;
  // The reply ended: everything held back. A block left open whose body is a whole call is a
  // call; any other is text.
  virtual std::vector<ReplyPiece> Finish() = 0;
};

// A parser of `format` (not kNone). `tools` (the OpenAI request's list, or null) tells GLM's
// parser which arguments are strings: those are kept as written, others read as JSON.
std::unique_ptr<ToolCallParser> NewToolCallParser(
    ToolCallFormat format, const nlohmann::ordered_json& tools = nlohmann::ordered_json());

// What the assistant's turn starts with so that its reply is a call: of `function` when given,
// of any function otherwise. Feed it to the parser before the reply.
std::string ForcedCallPrefix(ToolCallFormat format, const std::optional<std::string>& function);

// The structural tag (xgrammar's JSON, ResponseFormat::StructuralTag) that holds a reply begun
// with ForcedCallPrefix to whole calls: the arguments valid for the function's `parameters`
// schema (any object when it has none; GLM's as <arg_key>/<arg_value> pairs, xgrammar's glm_xml
// style), the block closed, the section closed where the format has one, nothing after it; with
// no `function` any of `tools` (the OpenAI request's list) and, when `parallel`, more whole
// blocks after the first. Null for kNone.
std::optional<std::string> ForcedCallGrammar(ToolCallFormat format,
                                             const nlohmann::ordered_json& tools,
                                             const std::optional<std::string>& function,
                                             bool parallel);

// The whole reply at once.
std::vector<ReplyPiece> ParseToolCalls(
    ToolCallFormat format, absl::string_view reply,
    const nlohmann::ordered_json& tools = nlohmann::ordered_json());

}  // namespace strata

#endif  // STRATA_COMMON_CHAT_TOOL_CALL_PARSER_H_
