// A model's chat template (chat_template.jinja or tokenizer_config.json's `chat_template`),
// rendered the way Hugging Face's apply_chat_template does for the supported Jinja subset
// (jinja_parser.h). A model without one gets the plain format:
//   "<role>: <content>\n" per message, then "assistant:" when a reply is asked for.
#ifndef STRATA_COMMON_CHAT_CHAT_TEMPLATE_H_
#define STRATA_COMMON_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"

namespace strata {

class ChatTemplate {
 public:
  // The plain format.
  ChatTemplate() = default;

  // Parses `source`; bos_token and eos_token are the names templates use for them.
  static absl::StatusOr<ChatTemplate> FromSource(const std::string& source, std::string bos_token,
                                                 std::string eos_token);
  // Reads `model_dir`/tokenizer_config.json: its chat_template (a string, or a list of named
  // templates of which "default" is taken), bos_token and eos_token; `model_dir`/
  // chat_template.jinja, when it exists, is the template instead (as transformers takes it).
  // No template: the plain format. A template outside the subset is an error naming its line.
  static absl::StatusOr<ChatTemplate> FromModelDir(const std::string& model_dir);

  bool has_template() const { return body_ != nullptr; }
  // The template's text ("" for the plain format).
  const std::string& source() const { return source_; }

  // `messages`: [{"role": ..., "content": "..."}, ...]. add_generation_prompt opens the
  // assistant's turn. The keys of `variables` (an object, or null) are further names the
  // template sees, e.g. enable_thinking, or tools (OpenAI's list of
  // {"type": "function", "function": {...}}, as apply_chat_template takes them). A template
  // that fails with the tool calls' arguments as objects is rendered again with them as JSON
  // text (DeepSeek's templates add them to strings).
  absl::StatusOr<std::string> Render(const jinja::Value& messages, bool add_generation_prompt,
                                     const jinja::Value& variables = nullptr) const;

 private:
  std::shared_ptr<const jinja::Body> body_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace strata

#endif  // STRATA_COMMON_CHAT_CHAT_TEMPLATE_H_
