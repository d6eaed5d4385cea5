#include "common/chat/tool_call_parser.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/chat/tool_call_formats.h"

namespace strata {
namespace {

using tool_call_internal::CallSyntax;
using tool_call_internal::Json;
using tool_call_internal::SyntaxOf;

bool IsSpace(char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); }

// Where the whitespace that ends text[0, end) begins.
size_t TrailingSpaceStart(absl::string_view text, size_t end) {
  while (end > 0 && IsSpace(text[end - 1])) --end;
  return end;
}

// The length of the longest suffix of `text` that is a proper prefix of `tag`: text that may
// still become the tag.
size_t PartialTagLength(absl::string_view text, absl::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (absl::EndsWith(text, tag.substr(0, n))) return n;
  }
  return 0;
}

// Whether `text` may still grow into `tag` (or is it).
bool MayBecome(absl::string_view text, absl::string_view tag) {
  return absl::StartsWith(tag, text);
}

// Reads any format's calls as the reply streams in. Outside the calls it looks for the first
// marker (the section's, or the call's where calls stand alone); inside a section, between its
// calls, only whitespace, a call or the section's end may come; inside a call it waits for the
// call's end and reads the body. Text that may still be the start of a marker is held back;
// what a marker began (the whitespace before it, the marker) is kept aside until the call is
// known well-formed, and goes out as text when it is not.
class BlockParser : public ToolCallParser {
 public:
  BlockParser(const CallSyntax& syntax, Json tools) : s_(syntax), tools_(std::move(tools)) {}

  std::vector<ReplyPiece> Feed(absl::string_view text) override {
    std::vector<ReplyPiece> out;
    held_.append(text.data(), text.size());
    while (Step(out)) {
    }
    return out;
  }

  std::vector<ReplyPiece> Finish() override {
    std::vector<ReplyPiece> out;
    if (state_ == State::kCall) {
      // A model may end its turn before the call's end marker: a whole call is still a call.
      std::optional<ToolCall> call = s_.parse(held_, tools_);
      if (call.has_value()) {
        out.push_back({"", std::move(call)});
      } else {
        Text(out, absl::StrCat(pending_, held_));
      }
    } else if (state_ == State::kSection && section_calls_ == 0) {
      Text(out, absl::StrCat(pending_, held_));
    } else {
      Text(out, held_);  // after a section's calls, pending_ is whitespace, dropped
    }
    held_.clear();
    pending_.clear();
    state_ = State::kText;
    after_call_ = false;
    return out;
  }

 private:
  enum class State { kText, kSection, kCall };

  bool has_sections() const { return !s_.section_open.empty(); }

  static void Text(std::vector<ReplyPiece>& out, std::string text) {
    if (text.empty()) return;
    if (!out.empty() && !out.back().call.has_value()) {
      out.back().text += text;
    } else {
      out.push_back({std::move(text), std::nullopt});
    }
  }

  // Moves the state on as far as held_ allows; false when it needs more text.
  bool Step(std::vector<ReplyPiece>& out) {
    switch (state_) {
      case State::kText:
        return InText(out);
      case State::kSection:
        return InSection(out);
      case State::kCall:
        return InCall(out);
    }
    return false;
  }

  bool InText(std::vector<ReplyPiece>& out) {
    if (after_call_) {
      // Whitespace after a call only separates it from what follows.
      size_t n = 0;
      while (n < held_.size() && IsSpace(held_[n])) ++n;
      held_.erase(0, n);
      if (held_.empty()) return false;
      after_call_ = false;
    }
    const absl::string_view marker = has_sections() ? s_.section_open : s_.call_open;
    const size_t open = held_.find(marker.data(), 0, marker.size());
    if (open == std::string::npos) {
      // Held back: a tail that may become the marker, and the whitespace before it (dropped if
      // a call follows).
      const size_t keep_from =
          TrailingSpaceStart(held_, held_.size() - PartialTagLength(held_, marker));
      Text(out, held_.substr(0, keep_from));
      held_.erase(0, keep_from);
      return false;
    }
    const size_t space = TrailingSpaceStart(held_, open);
    Text(out, held_.substr(0, space));
    pending_ = held_.substr(space, open + marker.size() - space);
    held_.erase(0, open + marker.size());
    state_ = has_sections() ? State::kSection : State::kCall;
    section_calls_ = 0;
    scanned_ = 0;
    return true;
  }

  bool InSection(std::vector<ReplyPiece>& out) {
    size_t n = 0;
    while (n < held_.size() && IsSpace(held_[n])) ++n;
    pending_.append(held_, 0, n);
    held_.erase(0, n);
    if (held_.empty()) return false;
    if (absl::StartsWith(held_, s_.call_open)) {
      pending_.append(s_.call_open.data(), s_.call_open.size());
      held_.erase(0, s_.call_open.size());
      state_ = State::kCall;
      scanned_ = 0;
      return true;
    }
    if (absl::StartsWith(held_, s_.section_close)) {
      // The section's markers go with its calls; a section without any is text, as written.
      if (section_calls_ == 0) Text(out, absl::StrCat(pending_, s_.section_close));
      after_call_ = section_calls_ > 0;
      held_.erase(0, s_.section_close.size());
      pending_.clear();
      state_ = State::kText;
      return true;
    }
    if (MayBecome(held_, s_.call_open) || MayBecome(held_, s_.section_close)) return false;
    // Something else: the section is over (its calls stand; without any, its start is text).
    if (section_calls_ == 0) Text(out, pending_);
    pending_.clear();
    state_ = State::kText;
    return true;
  }

  bool InCall(std::vector<ReplyPiece>& out) {
    const size_t close = held_.find(s_.call_close.data(), scanned_, s_.call_close.size());
    if (close == std::string::npos) {
      // The marker is not in what was searched; only its start may be in the last bytes.
      scanned_ = held_.size() >= s_.call_close.size() ? held_.size() - s_.call_close.size() + 1 : 0;
      return false;
    }
    std::optional<ToolCall> call = s_.parse(absl::string_view(held_).substr(0, close), tools_);
    if (call.has_value()) {
      out.push_back({"", std::move(call)});
      ++section_calls_;
      after_call_ = !has_sections();
    } else {
      Text(out, absl::StrCat(pending_, held_.substr(0, close + s_.call_close.size())));
    }
    held_.erase(0, close + s_.call_close.size());
    pending_.clear();
    state_ = has_sections() ? State::kSection : State::kText;
    return true;
  }

  const CallSyntax& s_;
  const Json tools_;
  State state_ = State::kText;
  std::string held_;         // text not yet decided (inside a call: its body so far)
  std::string pending_;      // what began the open section or call: text unless a call comes of it
  int section_calls_ = 0;    // the calls of the open section
  bool after_call_ = false;  // a call (or section) just closed: the whitespace after it goes
  size_t scanned_ = 0;       // held_[0, scanned_) holds no call end
};

struct FormatName {
  ToolCallFormat format;
  absl::string_view name;
};

// vLLM's names (and its older spellings).
constexpr FormatName kNames[] = {
    {ToolCallFormat::kHermes, "hermes"},           {ToolCallFormat::kDeepSeekV3, "deepseek_v3"},
    {ToolCallFormat::kDeepSeekV3, "deepseekv3"},   {ToolCallFormat::kDeepSeekV31, "deepseek_v31"},
    {ToolCallFormat::kDeepSeekV31, "deepseekv31"}, {ToolCallFormat::kGlm45, "glm45"},
    {ToolCallFormat::kKimiK2, "kimi_k2"},          {ToolCallFormat::kNone, "none"},
};

}  // namespace

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  for (const FormatName& n : kNames) {
    if (n.format == format) return n.name;
  }
  return "none";
}

absl::StatusOr<ToolCallFormat> ChooseToolCallFormat(absl::string_view name,
                                                    const ChatTemplate& chat_template) {
  for (const FormatName& n : kNames) {
    if (n.name == name) return n.format;
  }
  if (name != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tool-call parser '", name,
                     "': auto, hermes, deepseek_v3, deepseek_v31, glm45, kimi_k2 or none"));
  }
  if (!chat_template.has_template()) return ToolCallFormat::kHermes;
  const std::string& source = chat_template.source();
  // DeepSeek-V3.2's DSML calls share the section's markers but not its blocks.
  if (absl::StrContains(source, "<｜tool▁calls▁begin｜>") && !absl::StrContains(source, "DSML")) {
    return absl::StrContains(source, "```json") ? ToolCallFormat::kDeepSeekV3
                                                : ToolCallFormat::kDeepSeekV31;
  }
  if (absl::StrContains(source, "<|tool_calls_section_begin|>")) return ToolCallFormat::kKimiK2;
  // GLM's blocks are <tool_call> ones too, of key and value pairs.
  if (absl::StrContains(source, "<arg_key>")) return ToolCallFormat::kGlm45;
  // Qwen3-Coder's templates use <tool_call> blocks too, of XML functions instead of JSON.
  if (absl::StrContains(source, "<tool_call>") && !absl::StrContains(source, "<function=")) {
    return ToolCallFormat::kHermes;
  }
  return ToolCallFormat::kNone;
}

std::unique_ptr<ToolCallParser> NewToolCallParser(ToolCallFormat format, const Json& tools) {
  const CallSyntax* syntax = SyntaxOf(format);
  if (syntax == nullptr) return nullptr;
  return std::make_unique<BlockParser>(*syntax, tools);
}

std::string ForcedCallPrefix(ToolCallFormat format, const std::optional<std::string>& function) {
  const CallSyntax* syntax = SyntaxOf(format);
  if (syntax == nullptr) return "";
  if (!function.has_value()) return std::string(syntax->first_open);
  return absl::StrCat(syntax->first_open, syntax->lead(*function));
}

namespace {

Json Literal(absl::string_view value) {
  return {{"type", "const_string"}, {"value", std::string(value)}};
}

// One function's call after `lead` (empty when the prefix wrote it): the rest of the lead, the
// arguments for its schema, then the block's end.
Json CallAfter(const CallSyntax& syntax, std::string lead, const Json& function) {
  Json schema = function.contains("parameters") && function["parameters"].is_object()
                    ? function["parameters"]
                    : Json{{"type", "object"}};
  Json elements = Json::array();
  if (!lead.empty()) elements.push_back(Literal(lead));
  for (const Json& element : syntax.rest) elements.push_back(element);
  // At most one whitespace character where JSON allows any: a model free to put any amount
  // there can spend its whole budget on spaces (as response_format's schemas allow none).
  Json arguments = {
      {"type", "json_schema"}, {"json_schema", std::move(schema)}, {"max_whitespace_cnt", 1}};
  if (syntax.style != "json") arguments["style"] = std::string(syntax.style);
  elements.push_back(std::move(arguments));
  elements.push_back(Literal(syntax.tail));
  return {{"type", "sequence"}, {"elements", std::move(elements)}};
}

// `grammar`, then the section's end where the format has one.
Json Ended(const CallSyntax& syntax, Json grammar) {
  if (syntax.end.empty()) return grammar;
  if (grammar["type"] == "sequence" && grammar["elements"].size() > 0) {
    grammar["elements"].push_back(Literal(syntax.end));
    return grammar;
  }
  return {{"type", "sequence"}, {"elements", {std::move(grammar), Literal(syntax.end)}}};
}

}  // namespace

std::optional<std::string> ForcedCallGrammar(ToolCallFormat format, const Json& tools,
                                             const std::optional<std::string>& function,
                                             bool parallel) {
  const CallSyntax* syntax = SyntaxOf(format);
  if (syntax == nullptr) return std::nullopt;
  Json any_call = {{"type", "or"}, {"elements", Json::array()}};
  for (const Json& tool : tools) {
    const Json& f = tool["function"];
    const std::string name = f.value("name", "");
    if (function.has_value()) {
      // The prefix wrote the lead: the arguments come next.
      if (name == *function) {
        return Json{{"type", "structural_tag"},
                    {"format", Ended(*syntax, CallAfter(*syntax, "", f))}}
            .dump();
      }
      continue;
    }
    any_call["elements"].push_back(CallAfter(*syntax, syntax->lead(name), f));
  }
  if (function.has_value() || any_call["elements"].empty()) return std::nullopt;
  Json grammar = any_call["elements"].size() == 1 ? any_call["elements"][0] : any_call;
  if (parallel) {
    // The prefix opened the first block; later ones open themselves.
    Json more = {{"type", "sequence"}, {"elements", {Literal(syntax->next_open), grammar}}};
    grammar = {{"type", "sequence"},
               {"elements", {grammar, {{"type", "star"}, {"content", std::move(more)}}}}};
  }
  return Json{{"type", "structural_tag"}, {"format", Ended(*syntax, std::move(grammar))}}.dump();
}

std::vector<ReplyPiece> ParseToolCalls(ToolCallFormat format, absl::string_view reply,
                                       const Json& tools) {
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(format, tools);
  if (parser == nullptr) return {{std::string(reply), std::nullopt}};
  std::vector<ReplyPiece> out = parser->Feed(reply);
  for (ReplyPiece& piece : parser->Finish()) {
    if (!piece.call.has_value() && !out.empty() && !out.back().call.has_value()) {
      out.back().text += piece.text;
    } else {
      out.push_back(std::move(piece));
    }
  }
  return out;
}

}  // namespace strata
