#include "tools/strata/quantize_command.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/strata/eval_command.h"
#include "tools/strata/plan_command.h"

namespace strata {
namespace {

// The summed negative log-likelihood of `prompts` under the model in `dir`.
absl::StatusOr<double> PromptsNll(const std::string& dir,
                                  const std::vector<CalibrationPrompt>& prompts,
                                  LocalEngineOptions engine_options, int64_t* tokens) {
  engine_options.model_dir = dir;
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(engine_options));
  const int64_t window = engine->max_sequence_tokens();
  double nll = 0.0;
  *tokens = 0;
  for (const CalibrationPrompt& prompt : prompts) {
    const absl::Span<const int32_t> ids(prompt.ids);
    for (size_t start = 0; start < ids.size(); start += window) {
      const absl::Span<const int32_t> part = ids.subspan(start, window);
      if (part.size() < 2) continue;
      ASSIGN_OR_RETURN(Tensor logits, engine->Logits(part));
      nll += WindowNll(logits, part);
      *tokens += static_cast<int64_t>(part.size()) - 1;
    }
  }
  return nll;
}

}  // namespace

absl::StatusOr<CalibrationPerplexity> ComparePerplexity(const std::string& original_dir,
                                                        const std::string& quantized_dir,
                                                        const std::string& calibration_file,
                                                        int samples,
                                                        const LocalEngineOptions& engine) {
  if (samples < 1) return absl::InvalidArgumentError("--samples must be at least 1");
  const std::string tokenizer_path =
      (std::filesystem::path(original_dir) / "tokenizer.json").string();
  std::unique_ptr<Tokenizer> tokenizer;
  if (std::filesystem::exists(tokenizer_path)) {
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromFile(tokenizer_path));
  }
  ASSIGN_OR_RETURN(std::vector<CalibrationPrompt> prompts,
                   ReadCalibration(calibration_file, tokenizer.get()));
  if (static_cast<int>(prompts.size()) > samples) prompts.resize(samples);
  CalibrationPerplexity result;
  result.prompts = static_cast<int>(prompts.size());
  int64_t tokens = 0, quantized_tokens = 0;
  ASSIGN_OR_RETURN(const double original_nll, PromptsNll(original_dir, prompts, engine, &tokens));
  ASSIGN_OR_RETURN(const double quantized_nll,
                   PromptsNll(quantized_dir, prompts, engine, &quantized_tokens));
  if (tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(calibration_file, ": no prompt has two tokens to score"));
  }
  result.tokens = tokens;
  result.original = std::exp(original_nll / static_cast<double>(tokens));
  result.quantized = std::exp(quantized_nll / static_cast<double>(tokens));
  return result;
}

absl::Status RunQuantizeCommand(const QuantizeCommandOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(const QuantizeResult result, Quantize(options.quantize));
  StatusLine(absl::StrFormat(
      "quantized %d tensors to FP8 E4M3 (per-channel scales), kept %d; %.2f MB -> %.2f MB in "
      "%d file(s), %.2f s",
      result.quantized_tensors, result.kept_tensors, result.bytes_before / 1e6,
      result.bytes_after / 1e6, result.shards, result.seconds));
  nlohmann::ordered_json json;
  json["quantized_tensors"] = result.quantized_tensors;
  json["kept_tensors"] = result.kept_tensors;
  json["bytes_before"] = result.bytes_before;
  json["bytes_after"] = result.bytes_after;
  json["shards"] = result.shards;
  json["seconds"] = result.seconds;
  if (!options.calibration_file.empty()) {
    ASSIGN_OR_RETURN(const CalibrationPerplexity ppl,
                     ComparePerplexity(options.quantize.model_dir, options.quantize.out_dir,
                                       options.calibration_file, options.samples, options.engine));
    const double delta = ppl.quantized / ppl.original - 1.0;
    StatusLine(absl::StrFormat(
        "perplexity on %d calibration prompts (%d tokens): original %.4f, quantized %.4f (%+.2f%%)",
        ppl.prompts, ppl.tokens, ppl.original, ppl.quantized, 100.0 * delta));
    json["perplexity_original"] = ppl.original;
    json["perplexity_quantized"] = ppl.quantized;
    json["perplexity_delta"] = delta;
    json["calibration_prompts"] = ppl.prompts;
    json["calibration_tokens"] = ppl.tokens;
  }
  out << json.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace strata
