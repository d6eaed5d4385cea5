#include "services/router/http/openai_tool_calls.h"

namespace strata {

ChatToolCalls::ChatToolCalls(ToolCallFormat format, bool parallel, absl::string_view forced_prefix,
                             const Json& tools)
    : parser_(NewToolCallParser(format, tools)),
      parallel_(parallel),
      random_(std::random_device()()) {
  // The prefix opens a block: nothing of it is decided before the reply's own text.
  if (!forced_prefix.empty()) Deltas(parser_->Feed(forced_prefix));
}

std::vector<Json> ChatToolCalls::Feed(absl::string_view text) {
  return Deltas(parser_->Feed(text));
}

std::vector<Json> ChatToolCalls::Finish() { return Deltas(parser_->Finish()); }

Json ChatToolCalls::content() const {
  if (content_.empty() && called()) return nullptr;
  return content_;
}

std::vector<Json> ChatToolCalls::Deltas(std::vector<ReplyPiece> pieces) {
  std::vector<Json> deltas;
  for (ReplyPiece& piece : pieces) {
    if (!piece.call.has_value()) {
      content_ += piece.text;
      deltas.push_back(Json{{"content", std::move(piece.text)}});
      continue;
    }
    if (!parallel_ && called()) continue;
    const int index = static_cast<int>(calls_.size());
    // A model that names its calls (Kimi-K2) gets its ids back in later turns, as it expects.
    Json call{{"id", piece.call->id.empty() ? NewId() : piece.call->id},
              {"type", "function"},
              {"function", {{"name", piece.call->name}, {"arguments", piece.call->arguments}}}};
    // The name first, then the arguments, as OpenAI streams them.
    deltas.push_back(
        Json{{"tool_calls",
              Json::array({Json{{"index", index},
                                {"id", call["id"]},
                                {"type", "function"},
                                {"function", {{"name", piece.call->name}, {"arguments", ""}}}}})}});
    deltas.push_back(Json{
        {"tool_calls", Json::array({Json{{"index", index},
                                         {"function", {{"arguments", piece.call->arguments}}}}})}});
    calls_.push_back(std::move(call));
  }
  return deltas;
}

std::string ChatToolCalls::NewId() {
  // OpenAI's form: "call_" and 24 letters and digits.
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[random_() % (sizeof(kAlphabet) - 1)];
  return id;
}

}  // namespace strata
