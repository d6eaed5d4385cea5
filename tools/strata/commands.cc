#include "tools/strata/commands.h"

#include <charconv>
#include <string>

#include "common/util/status_macros.h"

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
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(options.engine));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, engine->Generate(options.ids, options.generate));
  std::string text = "{\"token_ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ids[i]);
  }
  text += "]}\n";
  out << text;
  return absl::OkStatus();
}

}  // namespace strata
