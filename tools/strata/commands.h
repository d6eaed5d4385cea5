// The `strata` subcommands that run a model in process.
#ifndef STRATA_TOOLS_STRATA_COMMANDS_H_
#define STRATA_TOOLS_STRATA_COMMANDS_H_

#include <ostream>
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
};

// Prints {"token_ids": [...]} with the new ids.
absl::Status RunGenerateCommand(const GenerateCommandOptions& options, std::ostream& out);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_COMMANDS_H_
