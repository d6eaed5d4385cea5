#include "common/chat/tool_call_parser.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/chat/jinja_builtins.h"

namespace strata {
namespace {

constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";

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

// A block's body as a call: a JSON object with a non-empty string "name" and "arguments" an
// object (written as json.dumps does, as the templates write them back), a string (kept), or
// absent (no arguments).
std::optional<ToolCall> ParseHermesBody(absl::string_view body) {
  const jinja::Value v = jinja::Value::parse(body.begin(), body.end(), nullptr, false);
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

class HermesParser : public ToolCallParser {
 public:
  std::vector<ReplyPiece> Feed(absl::string_view text) override {
    std::vector<ReplyPiece> out;
    held_.append(text.data(), text.size());
    while (in_block_ ? CloseBlock(out) : OpenBlock(out)) {
    }
    return out;
  }

  std::vector<ReplyPiece> Finish() override {
    std::vector<ReplyPiece> out;
    if (in_block_) {
      std::optional<ToolCall> call = ParseHermesBody(held_);
      if (call.has_value()) {
        out.push_back({"", std::move(call)});
      } else {
        Text(out, absl::StrCat(block_start_, held_));
      }
    } else {
      Text(out, held_);
    }
    held_.clear();
    block_start_.clear();
    in_block_ = false;
    return out;
  }

 private:
  static void Text(std::vector<ReplyPiece>& out, std::string text) {
    if (text.empty()) return;
    if (!out.empty() && !out.back().call.has_value()) {
      out.back().text += text;
    } else {
      out.push_back({std::move(text), std::nullopt});
    }
  }

  // Outside a block: sends the text that cannot start one; true when a block opened.
  bool OpenBlock(std::vector<ReplyPiece>& out) {
    if (after_call_) {
      // Whitespace after a call only separates it from what follows.
      size_t n = 0;
      while (n < held_.size() && IsSpace(held_[n])) ++n;
      held_.erase(0, n);
      if (held_.empty()) return false;
      after_call_ = false;
    }
    const size_t open = held_.find(kOpen.data(), 0, kOpen.size());
    if (open == std::string::npos) {
      // Held back: a tail that may become the tag, and the whitespace before it (dropped if a
      // call follows).
      const size_t keep_from =
          TrailingSpaceStart(held_, held_.size() - PartialTagLength(held_, kOpen));
      Text(out, held_.substr(0, keep_from));
      held_.erase(0, keep_from);
      return false;
    }
    const size_t space = TrailingSpaceStart(held_, open);
    Text(out, held_.substr(0, space));
    block_start_ = held_.substr(space, open + kOpen.size() - space);
    held_.erase(0, open + kOpen.size());
    in_block_ = true;
    scanned_ = 0;
    return true;
  }

  // Inside a block: true when it closed (as a call, or as text when its body is not one).
  bool CloseBlock(std::vector<ReplyPiece>& out) {
    const size_t close = held_.find(kClose.data(), scanned_, kClose.size());
    if (close == std::string::npos) {
      // The tag is not in what was searched; only its start may be in the last bytes.
      scanned_ = held_.size() >= kClose.size() ? held_.size() - kClose.size() + 1 : 0;
      return false;
    }
    std::optional<ToolCall> call = ParseHermesBody(absl::string_view(held_).substr(0, close));
    if (call.has_value()) {
      out.push_back({"", std::move(call)});
      after_call_ = true;
    } else {
      Text(out, absl::StrCat(block_start_, held_.substr(0, close + kClose.size())));
    }
    held_.erase(0, close + kClose.size());
    block_start_.clear();
    in_block_ = false;
    return true;
  }

  std::string held_;         // text not yet decided (inside a block: its body so far)
  std::string block_start_;  // the open block's whitespace before it and its tag
  bool in_block_ = false;
  bool after_call_ = false;  // a call just closed: the whitespace after it is dropped
  size_t scanned_ = 0;       // held_[0, scanned_) holds no closing tag
};

}  // namespace

absl::StatusOr<ToolCallFormat> ChooseToolCallFormat(absl::string_view name,
                                                    const ChatTemplate& chat_template) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "none") return ToolCallFormat::kNone;
  if (name != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tool-call parser '", name, "': auto, hermes or none"));
  }
  if (!chat_template.has_template()) return ToolCallFormat::kHermes;
  const std::string& source = chat_template.source();
  // Qwen3-Coder's templates use <tool_call> blocks too, of XML functions instead of JSON.
  if (absl::StrContains(source, kOpen) && !absl::StrContains(source, "<function=")) {
    return ToolCallFormat::kHermes;
  }
  return ToolCallFormat::kNone;
}

std::unique_ptr<ToolCallParser> NewToolCallParser(ToolCallFormat format) {
  if (format == ToolCallFormat::kHermes) return std::make_unique<HermesParser>();
  return nullptr;
}

std::string ForcedCallPrefix(ToolCallFormat format, const std::optional<std::string>& function) {
  if (format != ToolCallFormat::kHermes) return "";
  if (!function.has_value()) return absl::StrCat(kOpen, "\n");
  // The name as the templates write it: a JSON string.
  return absl::StrCat(kOpen, "\n{\"name\": ", jinja::ToJson(jinja::Value(*function), 0),
                      ", \"arguments\": ");
}

namespace {

// Ordered: a schema's properties keep the order the client wrote them in.
using Json = nlohmann::ordered_json;

Json Literal(std::string value) { return {{"type", "const_string"}, {"value", std::move(value)}}; }

// One function's call after `lead`: the arguments for its schema, then the block's end.
Json CallAfter(std::string lead, const Json& function) {
  Json schema = function.contains("parameters") && function["parameters"].is_object()
                    ? function["parameters"]
                    : Json{{"type", "object"}};
  Json elements = Json::array();
  if (!lead.empty()) elements.push_back(Literal(std::move(lead)));
  // At most one whitespace character where JSON allows any: a model free to put any amount
  // there can spend its whole budget on spaces (as response_format's schemas allow none).
  elements.push_back(
      {{"type", "json_schema"}, {"json_schema", std::move(schema)}, {"max_whitespace_cnt", 1}});
  elements.push_back(Literal(absl::StrCat("}\n", kClose)));
  return {{"type", "sequence"}, {"elements", std::move(elements)}};
}

std::string NameField(const std::string& name) {
  return absl::StrCat("{\"name\": ", jinja::ToJson(jinja::Value(name), 0), ", \"arguments\": ");
}

}  // namespace

std::optional<std::string> ForcedCallGrammar(ToolCallFormat format, const Json& tools,
                                             const std::optional<std::string>& function,
                                             bool parallel) {
  if (format != ToolCallFormat::kHermes) return std::nullopt;
  Json any_call = {{"type", "or"}, {"elements", Json::array()}};
  for (const Json& tool : tools) {
    const Json& f = tool["function"];
    const std::string name = f.value("name", "");
    if (function.has_value()) {
      // The prefix wrote the name: the arguments come next.
      if (name == *function) {
        return Json{{"type", "structural_tag"}, {"format", CallAfter("", f)}}.dump();
      }
      continue;
    }
    any_call["elements"].push_back(CallAfter(NameField(name), f));
  }
  if (function.has_value() || any_call["elements"].empty()) return std::nullopt;
  Json grammar = any_call["elements"].size() == 1 ? any_call["elements"][0] : any_call;
  if (parallel) {
    // The prefix opened the first block; later ones open themselves.
    Json more = {{"type", "sequence"},
                 {"elements", {Literal(absl::StrCat("\n", kOpen, "\n")), grammar}}};
    grammar = {{"type", "sequence"},
               {"elements", {grammar, {{"type", "star"}, {"content", std::move(more)}}}}};
  }
  return Json{{"type", "structural_tag"}, {"format", std::move(grammar)}}.dump();
}

std::vector<ReplyPiece> ParseToolCalls(ToolCallFormat format, absl::string_view reply) {
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(format);
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
