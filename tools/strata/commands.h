// The `strata` subcommands that run a model in process.
#ifndef STRATA_TOOLS_STRATA_COMMANDS_H_
#define STRATA_TOOLS_STRATA_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/local_engine.h"

namespace strata {

struct LogitsCommandOptions {
  LocalEngineOptions engine;
  std::vector<int32_t> ids;
};

// Prints {"logits": [[...], ...]}: one row per input position, the whole vocabulary.
absl::Status RunLogitsCommand(const LogitsCommandOptions& options, std::ostream& out);

struct GenerateCommandOptions {
  LocalEngineOptions engine;
  std::vector<int32_t> ids;
  GenerateOptions generate;
  std::string prompt;  // instead of `ids`: encoded with the model's tokenizer
};

// Prints {"token_ids": [...], "text": "..."} with the new ids and, when the model has a
// tokenizer, their text.
absl::Status RunGenerateCommand(const GenerateCommandOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_COMMANDS_H_
