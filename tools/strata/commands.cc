#include "tools/strata/commands.h"

#include <charconv>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

// Shortest text that reads back as the same float32.
void AppendFloat(float value, std::string& out) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, end);
}

}  // namespace

absl::Status RunLogitsCommand(const LogitsCommandOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(options.engine));
  ASSIGN_OR_RETURN(Tensor logits, engine->Logits(options.ids));
  std::string text = "{\"logits\": [";
  for (int64_t r = 0; r < logits.rows(); ++r) {
    text += r == 0 ? "[" : ", [";
    for (int64_t v = 0; v < logits.cols(); ++v) {
      if (v > 0) text += ", ";
      AppendFloat(logits.row(r)[v], text);
    }
    text += "]";
  }
  text += "]}\n";
  out << text;
  return absl::OkStatus();
}

absl::Status RunGenerateCommand(const GenerateCommandOptions& options, std::ostream& out) {
  // The model's tokenizer, when it has one: for --prompt, and to print the text.
  std::unique_ptr<Tokenizer> tokenizer;
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded =
      Tokenizer::FromModelDir(options.engine.model_dir);
  if (loaded.ok()) {
    tokenizer = *std::move(loaded);
  } else if (!absl::IsNotFound(loaded.status())) {
    return loaded.status();
  }
  std::vector<int32_t> prompt = options.ids;
  if (!options.prompt.empty()) {
    if (!prompt.empty()) return absl::InvalidArgumentError("give --prompt or --ids, not both");
    if (tokenizer == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--prompt needs the model's tokenizer: ", loaded.status().message()));
    }
    ASSIGN_OR_RETURN(prompt, tokenizer->Encode(options.prompt, /*add_special_tokens=*/true));
  }
  if (prompt.empty()) return absl::InvalidArgumentError("--prompt or --ids is required");
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(options.engine));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, engine->Generate(prompt, options.generate));
  nlohmann::json json;
  json["token_ids"] = ids;
  if (tokenizer != nullptr) {
    ASSIGN_OR_RETURN(json["text"], tokenizer->Decode(ids, /*skip_special_tokens=*/true));
  }
  out << json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return absl::OkStatus();
}

}  // namespace strata
