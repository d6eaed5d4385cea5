// The tool calls in a model's reply: how the model writes them (ToolCallFormat, chosen per model
// from its chat template or by the operator) and a parser that splits the reply, as it streams
// in, into the text around the calls and the calls themselves.
//
// Hermes (Qwen2.5, Qwen3, Hermes 2 Pro and the plain format): each call is a block
//   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
// A block whose body is not a JSON object with a string "name" (and "arguments" an object, a
// string or absent) is not a call: its text stays in the reply, as is. Whitespace next to a
// call is dropped (it only separates blocks).
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
  kNone,    // the model has no tool-call format Strata reads: tools are refused
  kHermes,  // <tool_call>{"name", "arguments"}</tool_call> blocks
};

// `name`: "hermes", "none", or "auto": hermes when the template writes <tool_call> blocks of
// JSON (not Qwen3-Coder's XML <function=...> ones) or the model has no template (the plain
// format writes them), none otherwise. INVALID_ARGUMENT for another name.
absl::StatusOr<ToolCallFormat> ChooseToolCallFormat(absl::string_view name,
                                                    const ChatTemplate& chat_template);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text: an object, as json.dumps writes it, or the model's string
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

// A parser of `format` (not kNone).
std::unique_ptr<ToolCallParser> NewToolCallParser(ToolCallFormat format);

// What the assistant's turn starts with so that its reply is a call: of `function` when given,
// of any function otherwise. Feed it to the parser before the reply.
std::string ForcedCallPrefix(ToolCallFormat format, const std::optional<std::string>& function);

// The structural tag (xgrammar's JSON, ResponseFormat::StructuralTag) that holds a reply begun
// with ForcedCallPrefix to whole calls: the arguments valid for the function's `parameters`
// schema (any object when it has none), the block closed, nothing after it; with no `function`
// any of `tools` (the OpenAI request's list) and, when `parallel`, more whole blocks after the
// first. Null for kNone.
std::optional<std::string> ForcedCallGrammar(ToolCallFormat format,
                                             const nlohmann::ordered_json& tools,
                                             const std::optional<std::string>& function,
                                             bool parallel);

// The whole reply at once.
std::vector<ReplyPiece> ParseToolCalls(ToolCallFormat format, absl::string_view reply);

}  // namespace strata

#endif  // STRATA_COMMON_CHAT_TOOL_CALL_PARSER_H_
