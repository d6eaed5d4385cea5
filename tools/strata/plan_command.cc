#include "tools/strata/plan_command.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/model_config.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

absl::Status LineError(const std::string& path, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, " line ", line, ": ", what));
}

absl::StatusOr<std::vector<int32_t>> ParseLine(const std::string& text, const std::string& path,
                                               int line, const Tokenizer* tokenizer) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return LineError(path, line, "not a JSON object");
  }
  const auto text_field = json.find("text");
  const auto ids_field = json.find("token_ids");
  if ((text_field == json.end()) == (ids_field == json.end())) {
    return LineError(path, line, "needs exactly one of \"text\" and \"token_ids\"");
  }
  std::vector<int32_t> ids;
  if (text_field != json.end()) {
    if (!text_field->is_string()) return LineError(path, line, "\"text\" must be a string");
    if (tokenizer == nullptr) {
      return LineError(path, line,
                       "\"text\" needs the model's tokenizer (tokenizer.json or tiktoken.model), "
                       "which it lacks");
    }
    absl::StatusOr<std::vector<int32_t>> encoded =
        tokenizer->Encode(text_field->get<std::string>(), /*add_special_tokens=*/false);
    if (!encoded.ok()) return LineError(path, line, encoded.status().message());
    ids = *std::move(encoded);
  } else {
    if (!ids_field->is_array()) return LineError(path, line, "\"token_ids\" must be an array");
    for (size_t i = 0; i < ids_field->size(); ++i) {
      const nlohmann::json& v = (*ids_field)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return LineError(path, line,
                         absl::StrCat("token_ids[", i, "] must be a non-negative integer"));
      }
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  }
  if (ids.empty()) return LineError(path, line, "the prompt has no tokens");
  return ids;
}

void PrintSummary(const PlanOptions& options, const PlanResult& r, std::ostream& out) {
  out << absl::StrFormat("%d prompts, %d tokens, %d MoE layers x %d experts (top-%d), %d workers\n",
                         r.prompts, r.file.tokens, r.gini.layers.size(), r.file.plan.num_experts(),
                         r.top_k, options.workers);
  out << "layer   gini   imbalance contiguous -> plan\n";
  for (size_t i = 0; i < r.gini.layers.size(); ++i) {
    out << absl::StrFormat("%5d  %5.3f   %8.1f%% -> %5.1f%%\n", r.gini.layers[i],
                           r.gini.per_layer[i], 100 * r.contiguous.per_layer[i],
                           100 * r.planned.per_layer[i]);
  }
  out << absl::StrFormat("  all  %5.3f   mean %3.1f%% -> %.1f%%, max %.1f%% -> %.1f%%\n",
                         r.gini.overall, 100 * r.contiguous.mean, 100 * r.planned.mean,
                         100 * r.contiguous.max, 100 * r.planned.max);
}

}  // namespace

absl::StatusOr<std::vector<CalibrationPrompt>> ReadCalibration(const std::string& path,
                                                               const Tokenizer* tokenizer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<CalibrationPrompt> prompts;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); })) {
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseLine(text, path, line, tokenizer));
    prompts.push_back({line, std::move(ids)});
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return prompts;
}

absl::StatusOr<PlanResult> MakePlan(const PlanOptions& options) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers must be at least 1, not ", options.workers));
  }
  if (options.engine.device != "cpu") {
    // A GPU gate leaves its routing in device memory, where the observer cannot count it.
    return absl::InvalidArgumentError("plan counts activations on the CPU: use --device cpu");
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.engine.model_dir));
  if (config.num_experts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.engine.model_dir, ": the model has no experts to place"));
  }
  if (options.workers > config.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("--workers ", options.workers,
                                                   " is more than the model's ", config.num_experts,
                                                   " experts per layer"));
  }
  // Text lines need the tokenizer; a model without one can still plan from token ids.
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   Tokenizer::FromModelDirIfAny(options.engine.model_dir));
  ASSIGN_OR_RETURN(std::vector<CalibrationPrompt> prompts,
                   ReadCalibration(options.calibration_file, tokenizer.get()));

  PlanResult result;
  ExpertCounts& counts = result.file.counts;
  counts.assign(config.num_layers, std::vector<int64_t>(config.num_experts, 0));
  bool routing_on_device = false;
  LocalEngineOptions engine_options = options.engine;
  engine_options.on_routing = [&](int layer, const RoutingTable& routing) {
    if (routing.on_device()) routing_on_device = true;
    for (int32_t e : routing.expert) {
      if (e >= 0) ++counts[layer][e];
    }
  };
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(engine_options));
  const int64_t window = engine->max_sequence_tokens();
  for (const CalibrationPrompt& prompt : prompts) {
    const absl::Span<const int32_t> ids(prompt.ids);
    for (size_t start = 0; start < ids.size(); start += window) {
      const auto part = ids.subspan(start, window);
      if (absl::StatusOr<Tensor> logits = engine->Logits(part); !logits.ok()) {
        return LineError(options.calibration_file, prompt.line, logits.status().message());
      }
    }
    result.file.tokens += static_cast<int64_t>(prompt.ids.size());
  }
  if (routing_on_device) return absl::InternalError("the gate's routing stayed on the device");
  // Every token fills top_k slots of every MoE layer; anything else means uncounted routing.
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const int64_t sum = std::accumulate(counts[layer].begin(), counts[layer].end(), int64_t{0});
    const int64_t expected = config.layer_is_moe[layer] ? result.file.tokens * config.top_k : 0;
    if (sum != expected) {
      return absl::InternalError(
          absl::StrCat("layer ", layer, " counted ", sum, " activations, expected ", expected));
    }
  }
  result.prompts = static_cast<int>(prompts.size());
  result.top_k = config.top_k;
  result.file.model = options.engine.model_dir;
  ASSIGN_OR_RETURN(result.file.plan, PlacementPlan::Greedy(counts, options.workers));
  result.gini = GiniByLayer(counts);
  ASSIGN_OR_RETURN(result.planned, ExpectedImbalance(counts, result.file.plan));
  ASSIGN_OR_RETURN(
      result.contiguous,
      ExpectedImbalance(counts, PlacementPlan::Contiguous(config.num_layers, config.num_experts,
                                                          options.workers)));
  return result;
}

absl::Status RunPlanCommand(const PlanOptions& options, std::ostream& out) {
  if (options.calibration_file.empty()) {
    return absl::InvalidArgumentError("--calibration is required");
  }
  ASSIGN_OR_RETURN(PlanResult result, MakePlan(options));
  if (!options.out.empty()) RETURN_IF_ERROR(SavePlan(options.out, result.file));
  PrintSummary(options, result, out);
  if (!options.out.empty()) out << "wrote " << options.out << "\n";
  return absl::OkStatus();
}

}  // namespace strata
