// A chat reply with tools offered, in the shape of an OpenAI answer: the model's text through
// the model's tool-call parser into the message's `content` and `tool_calls`, or into stream
// deltas ({"content"}, then per call {"tool_calls": [{"index", "id", "type", "function":
// {"name", "arguments": ""}}]} and {"tool_calls": [{"index", "function": {"arguments"}}]}).
// A call goes out once its block has closed, its arguments in one piece.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_TOOL_CALLS_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_TOOL_CALLS_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/chat/tool_call_parser.h"
#include "services/router/http/openai_request.h"

namespace strata {

class ChatToolCalls {
 public:
  // `parallel` false keeps the first call only (as vLLM does: the later ones are dropped).
  // `forced_prefix`: what the assistant's turn was started with (ForcedCallPrefix), the reply's
  // beginning for the parser. `tools`: the request's (NewToolCallParser).
  ChatToolCalls(ToolCallFormat format, bool parallel, absl::string_view forced_prefix,
                const Json& tools = Json());

  // The stream deltas that may go out after the reply's next `text`, in order.
  std::vector<Json> Feed(absl::string_view text);
  // The reply ended: the deltas of everything held back.
  std::vector<Json> Finish();

  bool called() const { return !calls_.empty(); }
  // The message's content: the text outside the calls; null when it is empty and calls were
  // made.
  Json content() const;
  // The message's tool_calls: [{"id": "call_...", "type": "function", "function": {"name",
  // "arguments"}}], the id the model's own where its format has one (Kimi-K2's).
  const Json& tool_calls() const { return calls_; }

 private:
  std::vector<Json> Deltas(std::vector<ReplyPiece> pieces);
  std::string NewId();

  std::unique_ptr<ToolCallParser> parser_;
  bool parallel_;
  std::string content_;
  Json calls_ = Json::array();
  std::mt19937_64 random_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_TOOL_CALLS_H_
