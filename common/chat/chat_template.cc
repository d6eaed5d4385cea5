#include "common/chat/chat_template.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_parser.h"
#include "common/chat/jinja_render.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

// A special token is a string, or an AddedToken object with "content".
std::string TokenText(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

// An assistant message's tool calls as Hermes blocks: {"name", "arguments"} as json.dumps
// writes them (arguments left as they are when they are a string).
std::string PlainToolCalls(const jinja::Value& message) {
  std::string out;
  auto calls = message.find("tool_calls");
  if (calls == message.end() || !calls->is_array()) return out;
  for (const jinja::Value& c : *calls) {
    const jinja::Value& f = c.contains("function") ? c["function"] : c;
    const jinja::Value arguments = f.value("arguments", jinja::Value::object());
    absl::StrAppend(
        &out, out.empty() ? "" : "\n",
        "<tool_call>\n{\"name\": ", jinja::ToJson(f.value("name", jinja::Value("")), 0),
        ", \"arguments\": ",
        arguments.is_string() ? arguments.get<std::string>() : jinja::ToJson(arguments, 0),
        "}\n</tool_call>");
  }
  return out;
}

// The messages with each tool call's object arguments as JSON text (json.dumps), or null when
// no call has object arguments.
jinja::Value ArgumentsAsText(const jinja::Value& messages) {
  jinja::Value out = messages;
  bool changed = false;
  if (!out.is_array()) return nullptr;
  for (jinja::Value& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (jinja::Value& c : m["tool_calls"]) {
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
      jinja::Value& f = c["function"];
      if (f.contains("arguments") && f["arguments"].is_object()) {
        f["arguments"] = jinja::ToJson(f["arguments"], 0);
        changed = true;
      }
    }
  }
  return changed ? out : jinja::Value(nullptr);
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(const std::string& source,
                                                      std::string bos_token,
                                                      std::string eos_token) {
  ASSIGN_OR_RETURN(jinja::Body body, jinja::Parse(source));
  ChatTemplate t;
  t.body_ = std::make_shared<const jinja::Body>(std::move(body));
  t.source_ = source;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDir(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::string path = (dir / "tokenizer_config.json").string();
  nlohmann::json config = nlohmann::json::object();
  if (absl::StatusOr<std::string> text = ReadFileToString(path); text.ok()) {
    config = nlohmann::json::parse(*text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
    }
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  // As transformers loads a tokenizer: chat_template.jinja (Kimi-K2's and GLM-4.6's layout)
  // takes priority over tokenizer_config.json's chat_template.
  std::string source;
  std::string source_path = (dir / "chat_template.jinja").string();
  if (absl::StatusOr<std::string> jinja = ReadFileToString(source_path); jinja.ok()) {
    source = *std::move(jinja);
  } else if (!absl::IsNotFound(jinja.status())) {
    return jinja.status();
  } else {
    source_path = path;
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) return ChatTemplate();  // a model without one
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& named : *it) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          source = named["template"].get<std::string>();
        }
      }
    }
    if (source.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       ": chat_template is neither a string nor a list with a "
                       "\"default\" template"));
    }
  }
  absl::StatusOr<ChatTemplate> t =
      FromSource(source, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source_path, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const jinja::Value& messages,
                                                 bool add_generation_prompt,
                                                 const jinja::Value& variables) const {
  if (body_ == nullptr) {
    std::string out;
    if (variables.is_object() && variables.contains("tools") && jinja::Truthy(variables["tools"])) {
      absl::StrAppend(&out, "tools: ", jinja::ToJson(variables["tools"], 0), "\n");
    }
    for (const auto& m : messages) {
      const std::string content = jinja::ToText(m.value("content", jinja::Value("")));
      const std::string calls = PlainToolCalls(m);
      absl::StrAppend(&out, jinja::ToText(m.value("role", jinja::Value(""))), ": ", content,
                      !content.empty() && !calls.empty() ? "\n" : "", calls, "\n");
    }
    if (add_generation_prompt) out += "assistant:";
    return out;
  }
  jinja::Value context = variables.is_object() ? variables : jinja::Value::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token_;
  context["eos_token"] = eos_token_;
  absl::StatusOr<std::string> rendered = jinja::Render(*body_, context);
  if (rendered.ok()) return rendered;
  // Tool calls' arguments come as objects, as vLLM hands them over and most templates write
  // them (tojson). DeepSeek's own templates add them to strings instead ('...' + arguments),
  // which fails on an object: such a template gets them again as the JSON text the model wrote.
  jinja::Value as_text = ArgumentsAsText(messages);
  if (as_text.is_null()) return rendered;
  context["messages"] = std::move(as_text);
  absl::StatusOr<std::string> retried = jinja::Render(*body_, context);
  return retried.ok() ? retried : rendered;
}

}  // namespace strata
