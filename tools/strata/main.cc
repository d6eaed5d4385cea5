// strata: the command-line tool. Subcommands:
//   strata logits   --model DIR --ids 1,2,3
//   strata generate --model DIR --ids 1,2,3 --max-new-tokens N [--temperature T ...]
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "tools/strata/commands.h"
#include "tools/strata/id_list.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, ids, "", "Prompt token ids, comma-separated");
ABSL_FLAG(int, max_new_tokens, 16, "Tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 is greedy");
ABSL_FLAG(int, top_k, 0, "Sample among the k most likely tokens; 0 keeps all");
ABSL_FLAG(double, top_p, 1.0, "Sample from the smallest set with this probability mass");
ABSL_FLAG(uint64_t, seed, 0, "Random seed for sampling");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past the end-of-sequence token");
ABSL_FLAG(double, router_temperature, 1.0, "Softmax temperature of the MoE gate");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 uses every hardware thread");
ABSL_FLAG(int, kv_block_size, 32, "Token slots per paged KV-cache block");
ABSL_FLAG(int64_t, kv_cache_mb, 1024, "Upper bound on KV-cache memory, MiB");
ABSL_FLAG(int, prefill_chunk, 512, "Prompt tokens per forward step");

namespace {

constexpr char kUsage[] =
    "strata <command> [flags]\n"
    "commands:\n"
    "  logits    --model DIR --ids 1,2,3   logits of every position, as JSON\n"
    "  generate  --model DIR --ids 1,2,3 [--max-new-tokens N] [--temperature T]\n"
    "            [--top-k K] [--top-p P] [--seed S]   new token ids, as JSON\n";

absl::StatusOr<strata::LocalEngineOptions> EngineOptionsFromFlags() {
  strata::LocalEngineOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  if (options.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_mb) << 20;
  options.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk);
  options.router_temperature = static_cast<float>(absl::GetFlag(FLAGS_router_temperature));
  return options;
}

absl::Status Run(const std::string& command) {
  if (command != "logits" && command != "generate") {
    return absl::InvalidArgumentError(absl::StrCat("unknown command \"", command, "\"\n", kUsage));
  }
  auto engine = EngineOptionsFromFlags();
  if (!engine.ok()) return engine.status();
  auto ids = strata::ParseIdList(absl::GetFlag(FLAGS_ids));
  if (!ids.ok()) return ids.status();
  if (command == "logits") {
    return strata::RunLogitsCommand({*engine, *ids}, std::cout);
  }
  if (command == "generate") {
    strata::GenerateCommandOptions options{*engine, *ids, {}};
    options.generate.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
    options.generate.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
    options.generate.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
    options.generate.sampling.top_k = absl::GetFlag(FLAGS_top_k);
    options.generate.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
    options.generate.sampling.seed = absl::GetFlag(FLAGS_seed);
    return strata::RunGenerateCommand(options, std::cout);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown command \"", command, "\"\n", kUsage));
}

// Accepts --max-new-tokens as well as --max_new_tokens: dashes in a flag's name (not its
// value) become underscores before Abseil parses it.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& arg = out[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t j = 2; j < name_end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  std::vector<char*> normalized_argv;
  for (std::string& arg : normalized) normalized_argv.push_back(arg.data());
  std::vector<char*> args =
      absl::ParseCommandLine(static_cast<int>(normalized_argv.size()), normalized_argv.data());
  if (args.size() != 2) {
    std::cerr << kUsage;
    return 2;
  }
  absl::Status status = Run(args[1]);
  if (!status.ok()) {
    std::cerr << "strata " << args[1] << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}
